"""``mmpretrain::`` config bases need ``pkg_resources``.

Upstream: mmengine 0.10.7 resolves ``package::`` bases (``Config`` calls
``is_installed`` and ``get_installed_path``) through ``pkg_resources``,
removed in setuptools 82. Fixed on mmengine's main branch
(importlib.metadata), not in a release as of 0.10.7. Our setup.py pins
``setuptools<82``; for anyone who upgraded setuptools by hand, the obscure
``ModuleNotFoundError`` becomes a message saying what to install.

What changes: ``mmengine.config.config``'s two bindings of those functions
first check that ``pkg_resources`` imports, and only then call mmengine's.
Nothing is checked or imported when the plugin is imported, so a process
that never resolves a ``package::`` base neither needs ``pkg_resources``
nor sees setuptools' deprecation warning because of the plugin.
"""
import functools
from typing import Callable

_MESSAGE = ('mmengine 0.10.7 needs pkg_resources to resolve "{package}::" '
            "config bases; install it with: pip install 'setuptools<82'")


def ensure_pkg_resources(package: str) -> None:
    """Raise a clear ImportError if ``pkg_resources`` cannot be imported.

    Args:
        package: The ``package::`` prefix being resolved (for the message).

    Raises:
        ImportError: ``pkg_resources`` is missing (setuptools >= 82).
    """
    try:
        import pkg_resources  # noqa: F401
    except ImportError as err:
        raise ImportError(_MESSAGE.format(package=package)) from err


def check_first(original: Callable) -> Callable:
    """Wrap an mmengine package-lookup function with the check.

    Args:
        original: ``is_installed`` or ``get_installed_path``.

    Returns:
        The function, preceded by :func:`ensure_pkg_resources`.
    """

    @functools.wraps(original)
    def lookup(package: str, *args, **kwargs):
        ensure_pkg_resources(package)
        return original(package, *args, **kwargs)

    lookup._mmae_pkg_resources = True
    return lookup


def require_pkg_resources() -> None:
    """Check for ``pkg_resources`` when a ``package::`` base is resolved."""
    import mmengine.config.config as config_module

    for name in ('is_installed', 'get_installed_path'):
        original = getattr(config_module, name)
        if not getattr(original, '_mmae_pkg_resources', False):
            setattr(config_module, name, check_first(original))
