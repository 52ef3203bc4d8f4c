"""Test helper imported by a training config (``custom_imports``): one
rank's backbone input becomes NaN at one iteration, so only that rank's
loss is not finite there (the 2-node divergence test)."""
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class NaNInputOnRank(Hook):
    """NaN images into the backbone of rank ``rank`` at iteration
    ``iteration`` (1-based), for that one forward pass.

    Args:
        rank: The global rank whose loss diverges.
        iteration: The 1-based training iteration.
    """

    def __init__(self, rank: int, iteration: int) -> None:
        self.rank, self.iteration = rank, iteration

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if get_rank() != self.rank or runner.iter + 1 != self.iteration:
            return
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        handle = []

        def to_nan(module, args):
            handle.pop().remove()
            return (torch.full_like(args[0], float('nan')), *args[1:])

        handle.append(model.backbone.register_forward_pre_hook(to_nan))
