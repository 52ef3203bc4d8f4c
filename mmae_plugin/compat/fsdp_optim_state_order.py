"""FSDP resume: ``optim_state_dict_to_load`` with torch >= 2.1's arguments.

Upstream: mmengine 0.10.7's ``FSDPStrategy.load_optim_state_dict``
(``mmengine/_strategy/fsdp.py``) calls
``FSDP.optim_state_dict_to_load(state_dict, model, optimizer)``, the
argument order before pytorch#96534 (torch 2.1) made it
``(model, optim, optim_state_dict)``. Every FSDP resume therefore failed
with "TypeError: unhashable type: 'dict'" while FSDP walked the state dict
as if it were the model. Not fixed in any mmengine release as of 0.10.7;
delete this module once mmengine passes the arguments by keyword.

The replacement passes them by keyword, so it is right under both orders,
and otherwise does what upstream does.
"""


def load_fsdp_optimizer_state_by_keyword() -> None:
    """Make ``FSDPStrategy.load_optim_state_dict`` pass keyword arguments."""
    import torch
    if not torch.distributed.is_available():
        return
    from mmengine._strategy import FSDPStrategy
    if getattr(FSDPStrategy.load_optim_state_dict, '_mmae_fixed', False):
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load an optimizer state dict saved by ``FSDPStrategy``.

        Args:
            state_dict: The optimizer state dict (sharded or full, as the
                strategy's ``state_dict_type`` saved it).
        """
        optim_state_dict = FSDP.optim_state_dict_to_load(
            model=self.model, optim=self.optim_wrapper.optimizer,
            optim_state_dict=state_dict)
        self.optim_wrapper.load_state_dict(optim_state_dict)

    load_optim_state_dict._mmae_fixed = True
    FSDPStrategy.load_optim_state_dict = load_optim_state_dict
