"""``mmpretrain::`` config bases need ``pkg_resources``.

Upstream: mmengine 0.10.7 resolves ``package::`` bases through
``pkg_resources``, removed in setuptools 82. Fixed on mmengine's main
branch (importlib.metadata), not in a release as of 0.10.7. Our setup.py
pins ``setuptools<82``; this check turns the obscure failure into a clear
message for anyone who upgraded setuptools by hand.
"""


def require_pkg_resources() -> None:
    """Raise a clear error if ``pkg_resources`` (setuptools < 82) is missing."""
    try:
        import pkg_resources  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'mmengine 0.10.7 needs pkg_resources to resolve "mmpretrain::" '
            "config bases; install it with: pip install 'setuptools<82'"
        ) from err
