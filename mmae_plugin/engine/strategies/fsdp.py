"""``MMAEFSDPStrategy``: mmengine's FSDP strategy with three fixes.

Selected under a ``FlexibleRunner`` (e.g. ``MMAEFlexibleRunner``) with
``strategy = dict(type='MMAEFSDPStrategy', model_wrapper=dict(...))``
(mmengine's ``STRATEGIES``). Each fix acts only inside its own methods:
``load_optim_state_dict`` passes arguments by keyword (mmengine 0.10.7
used the pre-torch-2.1 order); ``load_checkpoint`` takes the rank offset
out of a per-rank ``meta.seed`` under ``diff_rank_seed``; and
``optim_state_dict()`` runs inside
:func:`~.fsdp_optim_state_copy.gathered_states_copied` (CPU full
optimizer state). Building the optimizer wrapper refuses a
``mixed_precision.param_dtype`` other than the autocast dtype, and
``cast_root_forward_inputs=False`` without autocast; wrapping refuses
CAE, BEiT v2, SwAV, the momentum-network algorithms and CLIP teachers
(:func:`why_fsdp_cannot_train`).

Upstream bugs: the four "FSDP" sections of docs/upstream_workarounds.md;
the precision checks and initial weights: docs/gpu_clusters.md#fsdp.
"""
from typing import Any, Optional

import torch
from mmengine._strategy import FSDPStrategy
from mmengine.device import get_device
from mmengine.dist import get_rank
from mmengine.optim import AmpOptimWrapper, BaseOptimWrapper
from mmengine.registry import STRATEGIES
from torch import nn

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


def autocast_dtype(optim_wrapper: BaseOptimWrapper) -> Optional[torch.dtype]:
    """The dtype ``optim_wrapper`` autocasts the forward to (None: off).

    Args:
        optim_wrapper: A built optimizer wrapper.

    Returns:
        ``cast_dtype`` of an ``AmpOptimWrapper`` (its ``None`` resolved to
        autocast's default on this device: float16 on GPUs), else None.
    """
    if not isinstance(optim_wrapper, AmpOptimWrapper):
        return None
    if optim_wrapper.cast_dtype is not None:
        return optim_wrapper.cast_dtype
    return torch.get_autocast_dtype(torch.device(get_device()).type)


def check_precision_agrees(model: nn.Module,
                           optim_wrapper: BaseOptimWrapper) -> None:
    """Refuse an FSDP compute dtype the forward cannot run in.

    Args:
        model: The FSDP-wrapped model.
        optim_wrapper: Its optimizer wrapper.

    Raises:
        ValueError: The policy's ``param_dtype`` and the autocast dtype both
            set and different (e.g. ``optim_wrapper.dtype=float16`` for a
            GPU without bfloat16, with the policy's bfloat16 left as it
            was); or ``param_dtype`` set, the images left uncast
            (``cast_root_forward_inputs=False``) and no autocast.
    """
    policy = getattr(model, 'mixed_precision', None)
    param_dtype = getattr(policy, 'param_dtype', None)
    if param_dtype is None:
        return
    name = str(param_dtype).replace('torch.', '')
    cast_dtype = autocast_dtype(optim_wrapper)
    if cast_dtype is None:
        check_inputs_cast(policy, name)
    elif param_dtype != cast_dtype:
        cast = str(cast_dtype).replace('torch.', '')
        raise ValueError(
            f'strategy.model_wrapper.mixed_precision.param_dtype={name} '
            f'but optim_wrapper.dtype (autocast) is {cast}: FSDP would '
            f'compute in {name} what autocast casts to {cast}; set both to '
            'one dtype (on GPUs without bfloat16: --cfg-options '
            'optim_wrapper.dtype=float16 '
            'strategy.model_wrapper.mixed_precision.param_dtype=float16)')


def check_inputs_cast(policy: Any, name: str) -> None:
    """Refuse uncast inputs to ``name`` weights without autocast.

    Args:
        policy: FSDP's ``MixedPrecision`` of the root.
        name: Its ``param_dtype``, as a config writes it.

    Raises:
        ValueError: ``cast_root_forward_inputs`` is False.
    """
    if getattr(policy, 'cast_root_forward_inputs', True):
        return
    raise ValueError(
        f'strategy.model_wrapper.mixed_precision.param_dtype={name} with '
        'cast_root_forward_inputs=False needs the optimizer wrapper to '
        f'autocast (optim_wrapper.dtype={name}), but it does not: the '
        f'float32 images would meet {name} weights. Autocast, or set '
        f'cast_root_forward_inputs=True (the images are then cast to {name} '
        f"before the model, MAE's target included)")


def why_fsdp_cannot_train(model: nn.Module) -> Optional[str]:
    """Why ``model`` cannot train under FSDP, or None.

    Measured on 2 CPU ranks (torch 2.14.1, ``dev/fsdp_algorithm_sweep.py``),
    mmpretrain's algorithms that write their own parameters inside the
    forward do not train under FSDP as they train without it: CAE's
    momentum step rebinds its teacher's ``.data``, and BEiT v2's VQ-KD
    quantizer moves its codebook in place (an EMA of the features it
    quantizes); FSDP points both back at the shard after the forward, so
    neither ever moves, without an error (and with
    ``use_orig_params=False`` FSDP refuses CAE's mix of trained and frozen
    parameters). SwAV's loss normalises its prototypes in place, which
    autograd refuses on FSDP's views; the momentum (EMA) networks of MoCo
    v2/v3, BYOL and DenseCL (``BaseAveragedModel``) fail to update from the
    sharded online network. Both fail at the first step. FSDP refuses to
    wrap a 0-dimensional parameter, such as the ``logit_scale`` of the CLIP
    teacher of MILAN, EVA and iTPN-CLIP.

    Args:
        model: The algorithm, before wrapping.

    Returns:
        The reason, naming the module or parameter; None when none is
        known.
    """
    from mmengine.model import BaseAveragedModel
    from mmpretrain.models.losses import SwAVLoss
    from mmpretrain.models.selfsup import CAE
    from mmpretrain.models.utils.vector_quantizer import NormEMAVectorQuantizer
    for name, module in model.named_modules():
        where = f'{type(module).__name__} ({name or "the model"})'
        if isinstance(module, CAE):
            return (f"{where} rebinds its teacher's weights in a momentum "
                    'step inside the forward, and FSDP points every '
                    'parameter back at its shard afterwards: the teacher '
                    'would never move')
        if isinstance(module, NormEMAVectorQuantizer) and \
                module.embedding.update:
            return (f'{where} moves its codebook in place inside the '
                    'forward (an EMA of the features it quantizes), and '
                    'FSDP points every parameter back at its shard '
                    'afterwards: the codebook would never move')
        if isinstance(module, SwAVLoss):
            return (f'{where} normalises its prototypes in place inside the '
                    "forward, which autograd refuses on FSDP's parameter "
                    'views (an error at the first step)')
        if isinstance(module, BaseAveragedModel):
            return (f'{where} updates its averaged weights from the online '
                    "network inside the forward, which fails on FSDP's "
                    'sharded parameters at the first step (a size mismatch)')
    for name, param in model.named_parameters():
        if param.dim() == 0:
            return (f'the parameter {name} is 0-dimensional, and FSDP '
                    'refuses to wrap 0-dimensional parameters')
    return None


@STRATEGIES.register_module()
class MMAEFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` with the fixes of this module.

    Takes exactly ``FSDPStrategy``'s arguments.
    """

    def _wrap_model(self, model: nn.Module) -> Any:
        """Refuse an algorithm FSDP cannot train, then wrap as upstream.

        Args:
            model: The built algorithm.

        Returns:
            What ``FSDPStrategy._wrap_model`` returns.

        Raises:
            ValueError: :func:`why_fsdp_cannot_train` names a reason.
        """
        reason = why_fsdp_cannot_train(model)
        if reason is not None:
            raise ValueError(
                f'strategy={type(self).__name__} cannot train this model: '
                f'{reason}. '
                'Train it without a strategy (DDP: tools/dist_train.sh, '
                "or runner_type='MMAERunner'); FSDP suits MAE-family models")
        return super()._wrap_model(model)

    def build_optim_wrapper(
            self,
            optim_wrapper: Any,
            model: Optional[nn.Module] = None) -> BaseOptimWrapper:
        """``FSDPStrategy.build_optim_wrapper``, then the precision check.

        Args:
            optim_wrapper: As for ``FSDPStrategy.build_optim_wrapper``.
            model: The wrapped model (``self.model`` when None).

        Returns:
            The built optimizer wrapper.
        """
        built = super().build_optim_wrapper(optim_wrapper, model)
        check_precision_agrees(model if model is not None else self.model,
                               built)
        return built

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
