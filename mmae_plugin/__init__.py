"""mmae-plugin: matrix information theory for MMPretrain self-supervision.

Importing the package applies the upstream workarounds and registers every
component in mmpretrain's registries, so configs only need::

    custom_imports = dict(imports=['mmae_plugin'], allow_failed_imports=False)
"""
from .compat import apply_all as _apply_upstream_fixes

_apply_upstream_fixes()

from . import datasets, engine, evaluation, models  # noqa: E402,F401
from .model_zoo import register_model_zoo  # noqa: E402

register_model_zoo()

__version__ = '0.2.0'
