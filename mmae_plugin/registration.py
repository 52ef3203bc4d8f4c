"""Register every component of the plugin with mmengine and mmpretrain.

Importing this module (once per process) applies the plugin's only
process-wide changes, the workarounds of :mod:`mmae_plugin.compat`
(checkpoint security, mmcv's hue shift under numpy 2 and mmcv's
``DropPath`` rates as Python floats, each with an opt-out environment
variable, see ``docs/upstream_workarounds.md``),
imports every module that registers a component (models, datasets, hooks,
runners, strategies, optimizer constructors, metrics) and adds the plugin's
model index to mmpretrain's model zoo. Configs name it in ``custom_imports``::

    custom_imports = dict(imports=['mmae_plugin.registration'],
                          allow_failed_imports=False)

It is the one import that registers: ``import mmae_plugin`` (and a config's
``imports=['mmae_plugin']``) registers nothing, in any import order (see
:mod:`mmae_plugin`).
"""
from .compat import apply_all

apply_all()

from . import datasets, engine, evaluation, models  # noqa: E402,F401
from .model_zoo import register_model_zoo  # noqa: E402

register_model_zoo()
