"""``mmpretrain::`` config bases need ``pkg_resources``.

Upstream: mmengine 0.10.7 resolves ``package::`` bases through
``pkg_resources`` (removed in setuptools 82; ``setup.py`` pins
``setuptools<82``). Nothing here patches anything, and importing the plugin
never imports ``pkg_resources``:

* :func:`pkg_resources_problem` says what to install when it is missing
  (the plugin's ``tools/train.py`` and ``tools/test.py`` print it);
* :func:`quiet_pkg_resources_deprecation` ignores exactly setuptools'
  deprecation warning as mmengine raises it, only where the plugin's tools
  load configs (through :mod:`~mmae_plugin.compat.cli_warnings`).

Details:
docs/upstream_workarounds.md#pkg_resources_check-mmpretrain-bases-need-pkg_resources
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
