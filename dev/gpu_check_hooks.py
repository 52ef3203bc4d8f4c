"""Device waits per training step, counted by dev/gpu_check.sh's training.

Two hooks bracket every training iteration: :class:`SyncCountStart` runs
first in ``before_train_iter`` and :class:`SyncCountStop` last in
``after_train_iter``, so the window holds the data preprocessor, the step
and every hook's work on it (mmengine's ``RuntimeInfoHook`` reading the
logged values, the divergence check, the logger). Inside it
``torch.cuda.set_sync_debug_mode('warn')`` makes every operation that
waits for the device (``.item()``, a blocking copy to the host, a
data-dependent shape) warn; the hooks count the warnings per iteration and
where they came from, and rank 0 writes ``sync_counts.json`` to the work
dir. Without CUDA (the dry run) nothing is counted and the file says so.

Not part of the plugin: a development harness, imported by the check's
derived config (``custom_imports``) with ``dev/`` on ``PYTHONPATH``.
"""
import collections
import json
import os.path as osp
import traceback
import warnings
from typing import Dict, List, Optional

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: Iterations (of this process) not counted: CUDA and allocator warm-up,
#: the dataloader's first batches.
WARMUP_ITERS = 3
SYNC_WARNING = 'synchronizing'


class _Window:
    """The state the two hooks share: one catch_warnings per iteration."""

    def __init__(self) -> None:
        self.catcher: Optional[warnings.catch_warnings] = None
        self.caught: List[warnings.WarningMessage] = []
        self.per_iter: Dict[int, int] = {}
        self.sites: collections.Counter = collections.Counter()
        self.seen = 0


_WINDOW = _Window()


def _site(message: warnings.WarningMessage) -> str:
    """``file:line`` of the Python frame that made the device wait."""
    return f'{osp.basename(message.filename)}:{message.lineno}'


@HOOKS.register_module()
class SyncCountStart(Hook):
    """Opens the counting window before anything else in an iteration."""

    priority = 'HIGHEST'

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        _WINDOW.seen += 1
        if not torch.cuda.is_available() or _WINDOW.seen <= WARMUP_ITERS:
            return
        _WINDOW.catcher = warnings.catch_warnings(record=True)
        _WINDOW.caught = _WINDOW.catcher.__enter__()
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')


@HOOKS.register_module()
class SyncCountStop(Hook):
    """Closes the window after every other hook, writes the counts."""

    priority = 'LOWEST'

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if _WINDOW.catcher is None:
            return
        torch.cuda.set_sync_debug_mode(0)
        waits = [m for m in _WINDOW.caught if SYNC_WARNING in str(m.message)]
        _WINDOW.catcher.__exit__(None, None, None)
        _WINDOW.catcher = None
        _WINDOW.per_iter[runner.iter] = len(waits)
        _WINDOW.sites.update(_site(m) for m in waits)

    def after_run(self, runner) -> None:
        if not is_main_process():
            return
        counts = list(_WINDOW.per_iter.values())
        report = dict(
            counted=torch.cuda.is_available(),
            warmup_iters=WARMUP_ITERS,
            per_iter={str(k): v
                      for k, v in sorted(_WINDOW.per_iter.items())},
            steps=len(counts),
            median=sorted(counts)[len(counts) // 2] if counts else None,
            max=max(counts, default=None),
            sites=dict(_WINDOW.sites.most_common(20)))
        try:
            with open(osp.join(runner.work_dir, 'sync_counts.json'), 'w') as f:
                json.dump(report, f, indent=2)
        except OSError:
            traceback.print_exc()
