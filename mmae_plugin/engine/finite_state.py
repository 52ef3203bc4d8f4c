"""Whether a run's state is finite, decided on the device.

What :class:`~.checkpoint_hook.SafeCheckpointHook` checks before a save:
every floating-point tensor a checkpoint holds, reduced to one flag on the
device without a host read (the hook all-reduces it across ranks).
"""
from typing import Any, Iterator, List, Tuple

import torch


def named_state_tensors(model: torch.nn.Module,
                        optim_wrapper: Any) -> List[Tuple[str, torch.Tensor]]:
    """Every floating-point tensor a checkpoint of this run holds, named.

    Args:
        model: ``runner.model`` (wrapped or not).
        optim_wrapper: ``runner.optim_wrapper`` (an ``OptimWrapper`` or
            ``OptimWrapperDict``), or None.

    Returns:
        ``(name, tensor)`` for parameters, floating-point buffers and
        optimizer state tensors (``optimizer[<param>].exp_avg``...).
    """
    tensors = [(name, p) for name, p in model.named_parameters()]
    tensors += [(name, b) for name, b in model.named_buffers()
                if b.is_floating_point()]
    names = {id(p): name for name, p in model.named_parameters()}
    for optimizer in _optimizers(optim_wrapper):
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and (value.is_floating_point()
                                               or value.is_complex()):
                    owner = names.get(id(param), f'param@{id(param):x}')
                    tensors.append((f'optimizer[{owner}].{key}', value))
    return tensors


def _optimizers(optim_wrapper: Any) -> Iterator[torch.optim.Optimizer]:
    if optim_wrapper is None:
        return
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    for wrapper in (wrappers.values() if wrappers else [optim_wrapper]):
        optimizer = getattr(wrapper, 'optimizer', None)
        if optimizer is not None:
            yield optimizer


def all_finite_flag(tensors: List[torch.Tensor],
                    device: torch.device) -> torch.Tensor:
    """One int flag on ``device``: 1 if every tensor is finite, else 0.

    Computed on the tensors' devices without a host read.

    Args:
        tensors: The state tensors.
        device: Where the flag goes (the collective's device).

    Returns:
        A 0-d int64 tensor.
    """
    flag = torch.ones((), dtype=torch.int64, device=device)
    for tensor in tensors:
        finite = torch.isfinite(tensor).all()
        flag = flag * finite.to(
            device=device, dtype=torch.int64, non_blocking=True)
    return flag


def flag_device(tensors: List[torch.Tensor]) -> torch.device:
    for tensor in tensors:
        if tensor.device.type != 'cpu':
            return tensor.device
    return torch.device('cpu')
