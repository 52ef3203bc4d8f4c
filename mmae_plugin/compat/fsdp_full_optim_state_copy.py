"""FSDP full optimizer state dict on CPU: each state gets its own memory.

Upstream: torch's ``_allgather_orig_param_states``
(``torch/distributed/fsdp/_optim_utils.py``, the ``use_orig_params=True``
path of ``FSDP.optim_state_dict``) all-gathers every tensor state of a
FlatParameter (Adam's ``exp_avg``, then ``exp_avg_sq``) into *one* buffer
allocated once per FlatParameter, and hands views of it to
``_unflatten_orig_param_states``. That function copies the views out of the
buffer by ``.clone()`` when ``offload_to_cpu`` is off and by ``.cpu()`` when
it is on. ``.cpu()`` copies only from an accelerator: when FSDP computes on
the CPU (gloo), it returns the view itself, the next state's all-gather
overwrites the buffer, and every state but the last ends up holding the
last one's values (``exp_avg`` is saved as a copy of ``exp_avg_sq``).
mmengine's ``FSDPStrategy(state_dict_cfg='full')`` uses
``offload_to_cpu=True``, so on CPU hosts its checkpoints resumed with wrong
Adam moments, silently. On CUDA/NCCL ``.cpu()`` is a device-to-host copy
and the result is right. The same code is in torch 2.4.1, 2.11 and 2.14.1
(read in their installed sources): no torch release as of 2.14.1 fixes
it, and no report was found in pytorch's issues. Delete this
module once ``tests/fsdp_full_optim_state_probe.py`` passes on unpatched
torch (its strict xfail in ``tests/test_tools_fsdp.py`` then fails and says
so).

What changes: after torch's ``_unflatten_orig_param_states`` returns on a
rank that keeps the result (``to_save``), a state value that is a plain
tensor still sharing storage with the all-gather buffer it was given is
replaced by a copy (``clone``). Where torch already copied (accelerators,
``offload_to_cpu=False``, sharded state dicts, DTensors) nothing is
touched; the values, dtypes, devices and keys are torch's. If the function's
signature differs from the one this was written against, the fix is not
applied (torch changed that code; the probe says whether it still needs
one).
"""
import functools
import inspect
from typing import Any, Dict

#: Parameter names of the torch function this fix wraps.
_EXPECTED_PARAMETERS = ('fsdp_param_info', 'output_states', 'state_name',
                        'shard_state', 'to_save', 'cpu_offload')


def shares_storage(value: Any, buffer_view: Any) -> bool:
    """Whether ``value`` still aliases the all-gather buffer.

    Args:
        value: What torch stored for a state after unflattening.
        buffer_view: The view of the all-gather buffer it was given.

    Returns:
        True only for two plain (non-subclass) tensors on the same device
        whose storages start at the same address.
    """
    import torch
    if type(value) is not torch.Tensor or \
            type(buffer_view) is not torch.Tensor:
        return False
    if value.device != buffer_view.device or value.numel() == 0:
        return False
    return value.untyped_storage().data_ptr() == \
        buffer_view.untyped_storage().data_ptr()


def copy_out_of_gather_buffer(original):
    """Wrap ``_unflatten_orig_param_states`` to copy aliased results.

    Args:
        original: torch's ``_unflatten_orig_param_states``.

    Returns:
        The same function, followed by a ``clone`` of every result that
        still shares the all-gather buffer.
    """

    @functools.wraps(original)
    def _unflatten_orig_param_states(
            fsdp_param_info: Any, output_states: Dict[str, Dict[str, Any]],
            state_name: str, shard_state: bool, to_save: bool,
            cpu_offload: bool) -> None:
        if not to_save:  # torch returns at once; nothing is kept
            return original(fsdp_param_info, output_states, state_name,
                            shard_state, to_save, cpu_offload)
        views = {fqn: state.get(state_name)
                 for fqn, state in output_states.items()}
        original(fsdp_param_info, output_states, state_name, shard_state,
                 to_save, cpu_offload)
        for fqn, view in views.items():
            value = output_states[fqn].get(state_name)
            if shares_storage(value, view):
                output_states[fqn][state_name] = value.clone()

    _unflatten_orig_param_states._mmae_fixed = True
    return _unflatten_orig_param_states


def copy_full_optimizer_states_on_cpu() -> None:
    """Give every gathered FSDP optimizer state its own memory."""
    import torch
    if not torch.distributed.is_available():
        return
    from torch.distributed.fsdp import _optim_utils
    original = getattr(_optim_utils, '_unflatten_orig_param_states', None)
    if original is None or getattr(original, '_mmae_fixed', False):
        return
    if tuple(inspect.signature(original).parameters) != _EXPECTED_PARAMETERS:
        return
    _optim_utils._unflatten_orig_param_states = \
        copy_out_of_gather_buffer(original)
