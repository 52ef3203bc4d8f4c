"""Runner-side components of mmae-plugin: hooks, runners, strategies,
optimizers."""
from . import hooks, optimizers, runners, strategies  # noqa: F401
