"""Workarounds for upstream incompatibilities, one module per fix.

mmengine 0.10.7 and mmpretrain 1.2.0 predate several PyTorch and setuptools
changes. Each module names the upstream problem, the release that removes the
need for it (so it can be deleted that day) and exactly what it changes; each
acts only in the case it describes and hands every other case to the upstream
code untouched. :func:`apply_all` applies them once, when ``mmae_plugin`` is
imported (configs do that with ``custom_imports``).
"""
from typing import Callable, List

from .checkpoint_allowlist import (allow_mmengine_checkpoints,
                                   remember_registered_statistics)
from .collate_scope import strip_collate_scope
from .cpu_distributed import enable_cpu_distributed
from .inferencer_checkpoint_config import \
    never_execute_checkpoint_config_in_inferencers
from .fsdp_full_optim_state_copy import copy_full_optimizer_states_on_cpu
from .fsdp_optim_state_order import load_fsdp_optimizer_state_by_keyword
from .fsdp_resume_seed import resume_per_rank_seed_once
from .pkg_resources_check import require_pkg_resources
from .safe_resume_config import read_resume_config_without_executing
from .weights_only_load import load_checkpoints_weights_only

FIXES: List[Callable[[], None]] = [
    require_pkg_resources,
    allow_mmengine_checkpoints,
    remember_registered_statistics,
    load_checkpoints_weights_only,
    read_resume_config_without_executing,
    never_execute_checkpoint_config_in_inferencers,
    strip_collate_scope,
    enable_cpu_distributed,
    load_fsdp_optimizer_state_by_keyword,
    copy_full_optimizer_states_on_cpu,
    resume_per_rank_seed_once,
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
