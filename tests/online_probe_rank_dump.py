"""Test helper imported by a training config (``custom_imports``): every
rank writes what its OnlineProbeHook logged, and its probe's weights, to
``<work_dir>/online_probe_rank<rank>.json`` (the 2-process tests)."""
import json
import os

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class DumpOnlineProbe(Hook):
    """Write this rank's OnlineProbeHook history and probe weights."""

    priority = 'LOWEST'  # after OnlineProbeHook evaluated the epoch

    def after_train_epoch(self, runner) -> None:
        from mmae_plugin.engine.hooks import OnlineProbeHook
        hook = next(h for h in runner.hooks if isinstance(h, OnlineProbeHook))
        linear = hook.probe[1]
        record = dict(
            history=hook.history,
            weight=linear.weight.detach().flatten().tolist(),
            bias=linear.bias.detach().tolist(),
            weight_dtype=str(linear.weight.dtype),
            memory_rows=hook.memory.filled,
            heldout_rows=int(hook.last_heldout_rows),
            model=type(runner.model).__name__)
        path = os.path.join(runner.work_dir,
                            f'online_probe_rank{get_rank()}.json')
        with open(path, 'w') as handle:
            json.dump(record, handle)
