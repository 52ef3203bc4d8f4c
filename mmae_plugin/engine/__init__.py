"""Runner-side components of mmae-plugin: hooks, runners, optimizers."""
from . import hooks, optimizers, runners  # noqa: F401
