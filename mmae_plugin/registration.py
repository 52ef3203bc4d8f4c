"""Register every component of the plugin with mmengine and mmpretrain.

Importing this module applies the process-wide workarounds of
:mod:`mmae_plugin.compat` (docs/upstream_workarounds.md), imports every
module that registers a component and adds the plugin's model index to
mmpretrain's zoo. It is the one import that registers (``import
mmae_plugin`` registers nothing). Configs name it in ``custom_imports``::

    custom_imports = dict(imports=['mmae_plugin.registration'],
                          allow_failed_imports=False)
"""
from .compat import apply_all

apply_all()

from . import datasets, engine, evaluation, models  # noqa: E402,F401
from .model_zoo import register_model_zoo  # noqa: E402

register_model_zoo()
