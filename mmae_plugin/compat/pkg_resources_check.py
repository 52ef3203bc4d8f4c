"""``mmpretrain::`` config bases need ``pkg_resources``.

Upstream: mmengine 0.10.7 resolves ``package::`` bases (``Config`` calls
``is_installed`` and ``get_installed_path`` of ``mmengine.utils``) through
``pkg_resources``, which it imports lazily, inside those functions.
setuptools 82 removed ``pkg_resources``; setuptools 81 warns on its import
("pkg_resources is deprecated as an API"). Fixed on mmengine's main branch
(importlib.metadata), not in a release as of 0.10.7. Our ``setup.py`` pins
``setuptools<82``.

Nothing here patches anything, and importing the plugin never imports
``pkg_resources`` (so it never causes that warning):

* :func:`pkg_resources_problem` looks for ``pkg_resources`` with
  ``importlib.util.find_spec`` (which does not import it) and returns a
  message saying what to install; the plugin's ``tools/train.py`` and
  ``tools/test.py`` (``tools/_cli.py``) print it instead of mmengine's
  ``ModuleNotFoundError`` traceback.
* :func:`quiet_pkg_resources_deprecation` ignores exactly setuptools'
  deprecation warning as mmengine raises it (its text, ``UserWarning``, and
  the module it is attributed to: ``mmengine.utils.package_utils`` for the
  first import, ``importlib`` for mmengine's ``importlib.reload``), only
  where the plugin itself has mmengine resolve its configs' ``mmpretrain::``
  bases (the plugin's tools, through
  :mod:`~mmae_plugin.compat.cli_warnings`). The warning is harmless there
  (the pin keeps ``pkg_resources`` installed) and would otherwise be the
  first lines of every run. Everywhere else, including a user's own
  ``Config.fromfile`` of the plugin's configs, the warning is shown as
  upstream shows it; a script of the user's can enter the same block.
"""
import contextlib
import importlib.util
import re
import warnings
from typing import Iterator, Optional

#: The start of setuptools' warning text, as setuptools 80.9 / 81 word it.
DEPRECATION_TEXT = 'pkg_resources is deprecated as an API'

#: The modules mmengine's import of ``pkg_resources`` is attributed to
#: (setuptools warns with ``stacklevel=2``): ``mmengine.utils.package_utils``
#: (``import pkg_resources``) and ``importlib`` (its ``importlib.reload``).
DEPRECATION_MODULES = r'(mmengine\.utils\.package_utils|importlib)\Z'

MESSAGE = ('mmengine 0.10.7 needs pkg_resources to resolve "mmpretrain::" '
           'config bases, and it is not installed (setuptools >= 82 removed '
           "it); install it with: pip install 'setuptools<82'")


def pkg_resources_problem() -> Optional[str]:
    """Say what to install if ``pkg_resources`` is missing, without
    importing it.

    Returns:
        :data:`MESSAGE` when ``pkg_resources`` cannot be found, else None.
    """
    try:
        found = importlib.util.find_spec('pkg_resources') is not None
    except ValueError:  # in sys.modules as None: imports of it fail
        found = False
    return None if found else MESSAGE


@contextlib.contextmanager
def quiet_pkg_resources_deprecation() -> Iterator[None]:
    """Within the block, ignore only setuptools' ``pkg_resources`` warning
    raised by mmengine's package lookup.

    Yields:
        None.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            'ignore',
            message=re.escape(DEPRECATION_TEXT),
            category=UserWarning,
            module=DEPRECATION_MODULES)
        yield
