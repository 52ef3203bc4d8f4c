"""The plugin's process-wide changes: checkpoint security, two mmcv fixes.

mmengine 0.10.7 loads checkpoints in ways that either fail under torch >=
2.6's ``weights_only`` or let a checkpoint run code. Four modules listed in
:data:`FIXES` close that for every mmengine user in the process, since a
checkpoint opened by any code path is the risk: the ``weights_only``
allow-list (``checkpoint_allowlist``), ``weights_only`` on every mmengine
checkpoint load (``weights_only_load``), resume reading ``meta.config``
without executing it (``safe_resume_config``) and inferencers refusing to
build a model from a checkpoint's config text
(``inferencer_checkpoint_config``). The fifth, ``adjust_hue_overflow``,
makes ``mmcv.adjust_hue`` shift hue in float: mmcv 2.2's uint8 arithmetic
raises ``OverflowError`` under numpy 2 for negative hue factors, and
mmpretrain's ``ColorJitter`` (its SimCLR, BYOL and Barlow Twins recipes)
calls it through the name ``mmcv.adjust_hue``, which no registry reaches.
The sixth, ``drop_path_float``, makes mmcv's ``DropPath`` keep the numpy
drop rates of mmpretrain's ViTs as Python floats, so ``torch.compile``
takes a ViT's loss as one graph (mmpretrain builds ``DropPath`` inside its
layers, and by class in several backbones, out of a config's reach).
Each names the upstream problem and the release that removes the need for
it, and has an opt-out environment variable, read once when the module is
imported (``docs/upstream_workarounds.md`` lists them with their risk).
:func:`apply_all` applies them once, when :mod:`mmae_plugin.registration`
is imported (configs do that with ``custom_imports``). Everything else the
plugin fixes acts only in runs whose config selects it (runners, strategies
and hooks in :mod:`mmae_plugin.engine`); ``pkg_resources_check`` patches
nothing, and ``cli_warnings``' warning filters act only inside the plugin's
tools (``tools/train.py``, ``tools/test.py``).
"""
from typing import Callable, List

from .adjust_hue_overflow import fix_adjust_hue_overflow
from .checkpoint_allowlist import (allow_mmengine_checkpoints,
                                   remember_registered_statistics)
from .drop_path_float import fix_drop_path_float
from .inferencer_checkpoint_config import \
    never_execute_checkpoint_config_in_inferencers
from .safe_resume_config import read_resume_config_without_executing
from .weights_only_load import load_checkpoints_weights_only

FIXES: List[Callable[[], None]] = [
    allow_mmengine_checkpoints,
    remember_registered_statistics,
    load_checkpoints_weights_only,
    read_resume_config_without_executing,
    never_execute_checkpoint_config_in_inferencers,
    fix_adjust_hue_overflow,
    fix_drop_path_float,
]

_APPLIED = False


def apply_all() -> None:
    """Apply every workaround once (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    for fix in FIXES:
        fix()
    _APPLIED = True
