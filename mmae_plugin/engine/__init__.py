"""Runner-side components (hooks) of mmae-plugin."""
from . import hooks  # noqa: F401
