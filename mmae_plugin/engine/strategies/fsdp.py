"""``MMAEFSDPStrategy``: mmengine's FSDP strategy with three fixes.

Selected in a config with ``strategy = dict(type='MMAEFSDPStrategy', ...)``
under a ``FlexibleRunner`` (the plugin's ``MMAEFlexibleRunner`` or
mmengine's own); registered in mmengine's ``STRATEGIES``, which
``FlexibleRunner.build_strategy`` builds from. Every fix acts only inside
this strategy's own methods: mmengine's ``FSDPStrategy``, torch's FSDP and
every other run in the process are left as they are.

1. **Optimizer state load** (mmengine 0.10.7): ``FSDPStrategy.
   load_optim_state_dict`` calls ``FSDP.optim_state_dict_to_load(
   state_dict, model, optimizer)``, the argument order before pytorch#96534
   (torch 2.1) made it ``(model, optim, optim_state_dict)``: every FSDP
   resume failed with "TypeError: unhashable type: 'dict'". Here the
   arguments go by keyword (right under both orders). Delete once mmengine
   passes them by keyword.
2. **Per-rank seed on resume** (mmengine 0.10.7): ``FlexibleRunner.
   save_checkpoint`` stores ``meta.seed = strategy.seed``, which under
   ``randomness.diff_rank_seed`` already includes the rank offset. FSDP's
   ``local`` / ``sharded`` state dicts write one file per rank, each with
   ``seed + i``; on resume each rank re-seeds with that plus its rank again,
   so rank ``i`` continued with ``seed + 2i`` and drew other masks and
   augmentations after a preemption. Here the rank is subtracted from the
   ``meta.seed`` a rank reads from its own file under ``diff_rank_seed``;
   full checkpoints, runs without ``diff_rank_seed`` and ``load_from`` are
   unchanged. Delete once mmengine stores the seed without the offset.
3. **Full optimizer state on CPU** (torch, every release to 2.14.1):
   ``optim_state_dict()`` runs inside
   :func:`~.fsdp_optim_state_copy.gathered_states_copied`, so a
   ``state_dict_cfg='full'`` checkpoint written on CPU hosts keeps Adam's
   ``exp_avg`` instead of a copy of ``exp_avg_sq`` (see that module).
"""
from typing import Any

from mmengine._strategy import FSDPStrategy
from mmengine.dist import get_rank
from mmengine.registry import STRATEGIES

from .fsdp_optim_state_copy import gathered_states_copied


def per_rank_seed(checkpoint: Any, rank: int) -> None:
    """Undo the rank offset a per-rank checkpoint stores in ``meta.seed``.

    Args:
        checkpoint: What rank ``rank`` read from its own ``rank{i}.pth``;
            changed in place when ``meta.seed`` is an int.
        rank: This process's rank.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get('seed'), int):
        meta['seed'] -= rank


@STRATEGIES.register_module()
class MMAEFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` with the fixes of this module.

    Takes exactly ``FSDPStrategy``'s arguments.
    """

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load an optimizer state dict this strategy saved.

        Args:
            state_dict: The optimizer state dict (sharded or full, as
                ``state_dict_cfg`` saved it).
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        optim_state_dict = FSDP.optim_state_dict_to_load(
            model=self.model,
            optim=self.optim_wrapper.optimizer,
            optim_state_dict=state_dict)
        self.optim_wrapper.load_state_dict(optim_state_dict)

    def load_checkpoint(self, filename: str, **kwargs: Any) -> dict:
        """Load a checkpoint as ``FSDPStrategy`` does, seed of this rank.

        Args:
            filename: The checkpoint (a folder of ``rank{i}.pth`` for the
                ``local`` / ``sharded`` state dicts).
            **kwargs: As for ``FSDPStrategy.load_checkpoint``.

        Returns:
            The checkpoint; under ``diff_rank_seed`` a per-rank file's
            ``meta.seed`` without the rank offset it was saved with.
        """
        checkpoint = super().load_checkpoint(filename, **kwargs)
        if not self._is_full_state_dict() and \
                self._randomness.get('diff_rank_seed', False):
            per_rank_seed(checkpoint, get_rank())
        return checkpoint

    def optim_state_dict(self) -> dict:
        """The optimizer state dict, each gathered state in its own memory.

        Returns:
            What ``FSDPStrategy.optim_state_dict`` returns, computed with
            :func:`~.fsdp_optim_state_copy.gathered_states_copied` active.
        """
        with gathered_states_copied():
            return super().optim_state_dict()
