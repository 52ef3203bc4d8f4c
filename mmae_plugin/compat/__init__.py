"""The plugin's process-wide changes: checkpoint security, two mmcv fixes.

Four modules of :data:`FIXES` make checkpoint loading both work under
torch >= 2.6's ``weights_only`` and safe for every mmengine user in the
process (``checkpoint_allowlist``, ``weights_only_load``,
``safe_resume_config``, ``inferencer_checkpoint_config``); two fix mmcv
functions no registry reaches (``adjust_hue_overflow``: hue jitter under
numpy 2; ``drop_path_float``: ``DropPath`` under ``torch.compile``). Each
has an opt-out environment variable, read once at import.
:func:`apply_all` applies them once, when :mod:`mmae_plugin.registration`
is imported (configs do that with ``custom_imports``).
``pkg_resources_check`` patches nothing and ``cli_warnings`` acts only
inside the plugin's tools. Each fix, its risk and when to delete it:
docs/upstream_workarounds.md.
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
