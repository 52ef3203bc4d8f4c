"""Runner-side components of mmae-plugin: hooks, optimizer constructors."""
from . import hooks, optimizers  # noqa: F401
