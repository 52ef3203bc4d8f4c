"""Mixed precision without a loss scaler where the dtype does not need one.

:class:`MixedPrecisionOptimWrapper` is mmengine's ``AmpOptimWrapper`` with
``loss_scale='auto'`` (its default): no ``GradScaler`` for bfloat16 (which
saves its per-step host sync), dynamic scaling for float16 and
``dtype=None``. ``loss_scale=None`` with float16 is refused. It resumes
from checkpoints written with a scaler. Use::

    optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16',
                         optimizer=...)

Why: docs/gpu_clusters.md#precision-bfloat16-recipes-float16-override.
"""
from typing import Optional, Union

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmpretrain.registry import OPTIM_WRAPPERS


def resolve_cast_dtype(
        dtype: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """``dtype`` as a torch dtype (``None`` stays ``None``).

    Raises:
        ValueError: If ``dtype`` is not one of ``AmpOptimWrapper``'s.
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in AmpOptimWrapper.valid_dtypes:
        raise ValueError(f'optim_wrapper.dtype must be one of '
                         f'{AmpOptimWrapper.valid_dtypes} or None, got '
                         f'{dtype!r}')
    return getattr(torch, dtype)


def needs_loss_scaler(loss_scale, dtype: Optional[torch.dtype]) -> bool:
    """Whether ``loss_scale`` with ``dtype`` asks for a ``GradScaler``.

    Raises:
        ValueError: ``loss_scale=None`` with a dtype other than bfloat16.
    """
    if loss_scale == 'auto':
        return dtype is not torch.bfloat16
    if loss_scale is None:
        if dtype is not torch.bfloat16:
            raise ValueError(
                'optim_wrapper.loss_scale=None (no loss scaler) needs '
                f"dtype='bfloat16', got dtype={dtype}: float16 gradients "
                "underflow without scaling; use loss_scale='auto' or "
                "'dynamic'")
        return False
    return True


@OPTIM_WRAPPERS.register_module()
class MixedPrecisionOptimWrapper(AmpOptimWrapper):
    """``AmpOptimWrapper`` that skips the loss scaler for bfloat16.

    Args:
        loss_scale: ``'auto'`` (no scaler for bfloat16, dynamic scaling
            otherwise), ``None`` (no scaler; bfloat16 only), or anything
            ``AmpOptimWrapper`` accepts (``'dynamic'``, a float, a dict of
            ``GradScaler`` arguments).
        dtype: The autocast dtype: ``'bfloat16'``, ``'float16'``,
            ``'float32'``, ``'float64'`` or ``None`` (autocast's default).
        use_fsdp: Use FSDP's ``ShardedGradScaler`` (only where a scaler is
            built).
        **kwargs: ``OptimWrapper``'s arguments (``optimizer``,
            ``accumulative_counts``, ``clip_grad``).
    """

    def __init__(self,
                 loss_scale='auto',
                 dtype: Union[str, torch.dtype, None] = None,
                 use_fsdp: bool = False,
                 **kwargs):
        cast_dtype = resolve_cast_dtype(dtype)
        if needs_loss_scaler(loss_scale, cast_dtype):
            super().__init__(
                loss_scale='dynamic' if loss_scale == 'auto' else loss_scale,
                dtype=cast_dtype,
                use_fsdp=use_fsdp,
                **kwargs)
            return
        # AmpOptimWrapper.__init__ would build the scaler (and insists on
        # a GPU); bfloat16 autocast needs neither.
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        self.loss_scaler = None
        self.cast_dtype = cast_dtype

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward()``, scaled only when there is a scaler."""
        if self.loss_scaler is not None:
            return super().backward(loss, **kwargs)
        return OptimWrapper.backward(self, loss, **kwargs)

    def step(self, **kwargs) -> None:
        """The optimizer step (after clipping), through the scaler if any."""
        if self.loss_scaler is not None:
            return super().step(**kwargs)
        return OptimWrapper.step(self, **kwargs)

    def state_dict(self) -> dict:
        """The optimizer's state, plus the scaler's if there is one."""
        if self.loss_scaler is not None:
            return super().state_dict()
        return OptimWrapper.state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state saved with or without a loss scaler."""
        if self.loss_scaler is not None:
            return super().load_state_dict(state_dict)
        state_dict = dict(state_dict)
        state_dict.pop('loss_scaler', None)
        return OptimWrapper.load_state_dict(self, state_dict)
