"""mmae-plugin: matrix information theory for MMPretrain self-supervision.

``import mmae_plugin`` registers nothing (the framework-free subpackages
:mod:`mmae_plugin.matrix_info`, :mod:`mmae_plugin.theory` and
:mod:`mmae_plugin.utils` import neither mmengine nor mmpretrain). The
components are registered by ``import mmae_plugin.registration`` (or the
first access of ``mmae_plugin.models`` / ``mmae_plugin.engine``), which
configs name in ``custom_imports``::

    custom_imports = dict(imports=['mmae_plugin.registration'],
                          allow_failed_imports=False)
"""
import importlib
import importlib.util
from typing import Any

__version__ = '0.2.0'

#: Subpackages that need neither mmengine nor mmpretrain; every other
#: submodule, first reached as an attribute of the package, registers the
#: plugin before it is imported.
FRAMEWORK_FREE = ('matrix_info', 'theory', 'utils')


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
