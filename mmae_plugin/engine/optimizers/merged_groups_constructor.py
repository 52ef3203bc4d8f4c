"""Optimizer-wrapper constructors that merge identical parameter groups.

mmengine's constructor with a ``paramwise_cfg`` (and mmpretrain's
layer-wise lr-decay one) put every parameter tensor in a group of its own;
these build exactly that optimizer, then merge the groups whose settings
are all equal, which is exact (bit-identical training under every param
scheduler). Use::

    optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor',
                         ...)

Why merging is exact and what it saves: docs/performance.md#the-components.
"""
from typing import Any, List

import torch
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmpretrain.engine.optimizers import \
    LearningRateDecayOptimWrapperConstructor
from mmpretrain.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn

#: Per-tensor bookkeeping written by mmpretrain's layer-decay constructor; it
#: is no hyperparameter, so it does not keep groups apart. A merged group
#: lists its members' names under ``param_names``.
PER_PARAM_KEYS = ('param_name', )


def _same_value(a: Any, b: Any) -> bool:
    """Exact equality of two group settings (tensors compared bitwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.device == b.device
                and a.shape == b.shape and bool(torch.equal(a, b)))
    # type matters: an int and a float lr give different scheduler rounding
    return type(a) is type(b) and bool(a == b)


def _same_settings(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        _same_value(a[key], b[key]) for key in a)


def merge_param_groups(optimizer: torch.optim.Optimizer) -> int:
    """Merge the optimizer's groups that have identical settings, in place.

    A merged group takes the position of its first member and keeps its
    members' parameters in their original order, so the first group (whose
    lr mmengine logs) and the parameter order are unchanged.

    Args:
        optimizer: A freshly built optimizer (no state yet).

    Returns:
        The number of groups before merging.

    Raises:
        RuntimeError: If the optimizer has already stepped.
    """
    if optimizer.state:
        raise RuntimeError(
            'merge_param_groups needs an optimizer that has not stepped yet '
            f'(its state holds {len(optimizer.state)} parameter(s))')
    before = len(optimizer.param_groups)
    merged: List[dict] = []
    for group in optimizer.param_groups:
        settings = {
            key: value
            for key, value in group.items()
            if key != 'params' and key not in PER_PARAM_KEYS
        }
        names = [group[key] for key in PER_PARAM_KEYS if key in group]
        for target in merged:
            if _same_settings(target['settings'], settings):
                target['group']['params'].extend(group['params'])
                target['names'].extend(names)
                break
        else:
            merged.append(
                dict(
                    settings=settings,
                    names=names,
                    group=dict(settings, params=list(group['params']))))
    for entry in merged:
        if entry['names']:
            entry['group']['param_names'] = entry['names']
    optimizer.param_groups[:] = [entry['group'] for entry in merged]
    return before


def _is_zero_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:  # torch built without distributed support
        return False
    return isinstance(optimizer, ZeroRedundancyOptimizer)


class _MergeGroupsMixin:
    """Build the wrapper as the parent does, then merge its groups."""

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optim_wrapper = super().__call__(model)
        optimizer = optim_wrapper.optimizer
        if _is_zero_optimizer(optimizer):
            # ZeRO partitions its groups at construction; leave them alone.
            return optim_wrapper
        before = merge_param_groups(optimizer)
        print_log(
            f'{type(self).__name__}: {before} parameter groups merged into '
            f'{len(optimizer.param_groups)} with identical hyperparameters',
            logger='current')
        return optim_wrapper


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(_MergeGroupsMixin,
                                          DefaultOptimWrapperConstructor):
    """mmengine's default constructor with identical groups merged.

    Takes the same ``optim_wrapper_cfg`` and ``paramwise_cfg`` as
    :class:`mmengine.optim.DefaultOptimWrapperConstructor` and produces an
    optimizer that updates every parameter exactly as that constructor's
    does, under any param scheduler, with one group per distinct set of
    hyperparameters instead of one per tensor.

    Note: a checkpoint's optimizer state holds one entry per group, so a
    run resumes only from checkpoints written with the same constructor.
    """


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsLearningRateDecayOptimWrapperConstructor(
        _MergeGroupsMixin, LearningRateDecayOptimWrapperConstructor):
    """mmpretrain's layer-wise lr-decay constructor with groups merged.

    Parameters of one layer that share a weight decay end up in one group
    (about two per layer) instead of one group per tensor. The per-tensor
    ``param_name`` entries become a ``param_names`` list.
    """
