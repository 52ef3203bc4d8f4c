"""mmae-plugin: matrix information theory for MMPretrain self-supervision.

Importing the package registers every component in mmengine's and
mmpretrain's registries (through :mod:`mmae_plugin.registration`) when
mmengine is already imported, which is always the case when a config names
the plugin in ``custom_imports`` (mmengine reads the config first)::

    custom_imports = dict(imports=['mmae_plugin.registration'],
                          allow_failed_imports=False)

``imports=['mmae_plugin']`` works too. Without mmengine loaded, importing the
package imports nothing beyond it, so the framework-free subpackages
(:mod:`mmae_plugin.matrix_info`, :mod:`mmae_plugin.theory`,
:mod:`mmae_plugin.utils`) import neither mmengine nor mmpretrain; the
components are then registered by ``import mmae_plugin.registration``, or on
first use of a framework attribute such as ``mmae_plugin.models``. A script
that imports the plugin before mmengine and needs the components should
import ``mmae_plugin.registration``: Python runs this file once per process,
so a later ``import mmae_plugin`` (or a config's
``imports=['mmae_plugin']``) does not run it again.
"""
import importlib
import importlib.util
import sys
from typing import Any

__version__ = '0.2.0'

#: Subpackages that need neither mmengine nor mmpretrain; every other
#: submodule, first reached as an attribute of the package, registers the
#: plugin before it is imported.
FRAMEWORK_FREE = ('matrix_info', 'theory', 'utils')

if 'mmengine' in sys.modules:
    # mmengine is loaded (a config is being read, or the user imported it):
    # register now, as ``custom_imports`` expects.
    from . import registration  # noqa: F401


def __getattr__(name: str) -> Any:
    """Import a submodule on first access, registering the plugin first.

    Args:
        name: The attribute asked of the package.

    Returns:
        The submodule (a framework-free one without registering).

    Raises:
        AttributeError: If no submodule has that name.
    """
    if name.startswith('_') or \
            importlib.util.find_spec(f'{__name__}.{name}') is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    if name not in FRAMEWORK_FREE:
        importlib.import_module(f'{__name__}.registration')
    return importlib.import_module(f'{__name__}.{name}')
