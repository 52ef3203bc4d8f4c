"""FSDP resume of per-rank checkpoints: each rank keeps its own seed.

Upstream: mmengine 0.10.7's ``FlexibleRunner.save_checkpoint`` stores
``meta.seed = strategy.seed``, which under ``randomness.diff_rank_seed``
already includes the rank offset (``seed + rank``). A full checkpoint is
written by rank 0 (offset 0), but FSDP's ``local`` / ``sharded`` state dict
writes ``rank{i}.pth`` per rank, each with ``seed + i``. On resume every rank
reads its own file and ``SingleDeviceStrategy.resume`` re-seeds with
``meta.seed`` plus the rank again, so rank ``i`` continues with
``seed + 2 i``: the masks and augmentations of every rank but 0 change at the
resume, and a preempted run does not continue the run it was. Not fixed in
any mmengine release as of 0.10.7; delete this module once mmengine stores
the seed without the rank offset.

The replacement subtracts the rank from ``meta.seed`` when a rank reads its
own per-rank file under ``diff_rank_seed``; full checkpoints, runs without
``diff_rank_seed`` and ``load_from`` (which ignores the seed) are unchanged.
"""
import functools


def resume_per_rank_seed_once() -> None:
    """Undo the rank offset in per-rank FSDP checkpoints' ``meta.seed``."""
    import torch
    if not torch.distributed.is_available():
        return
    from mmengine._strategy import FSDPStrategy
    from mmengine.dist import get_rank

    original = FSDPStrategy.load_checkpoint
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def load_checkpoint(self, filename: str, **kwargs) -> dict:
        checkpoint = original(self, filename, **kwargs)
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
        if (not self._is_full_state_dict()
                and self._randomness.get('diff_rank_seed', False)
                and isinstance(meta, dict)
                and isinstance(meta.get('seed'), int)):
            meta['seed'] -= get_rank()
        return checkpoint

    load_checkpoint._mmae_fixed = True
    FSDPStrategy.load_checkpoint = load_checkpoint
