"""FSDP full optimizer state dict on CPU: each state gets its own memory.

Upstream (torch): ``_allgather_orig_param_states``
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
Adam moments, silently. On CUDA/NCCL ``.cpu()`` is a device-to-host copy and
the result is right. The same code is in torch 2.4.1, 2.11 and 2.14.1: no
torch release as of 2.14.1 fixes it. Delete this module once
``tests/fsdp_full_optim_state_probe.py`` passes on unpatched torch (its
strict xfail in ``tests/test_tools_fsdp.py`` then fails and says so).

What changes, and where: :func:`gathered_states_copied` is a context manager
that replaces torch's private ``_unflatten_orig_param_states`` by
:func:`copy_out_of_gather_buffer` of it *only while it is active*, and puts
torch's function back when it exits (also on an error).
:class:`~mmae_plugin.engine.strategies.MMAEFSDPStrategy` enters it only
around its own ``optim_state_dict()``, so FSDP used by anyone else, and
everything outside that call, runs torch's code untouched. Because the
function is a module attribute, another thread calling
``FSDP.optim_state_dict`` *during* that call would also get the copy (which
is value-identical to torch's result); mmengine saves from the training
thread only. Inside, after torch's function returns on a rank that keeps the
result (``to_save``), a state value that is a plain tensor still sharing
storage with the all-gather buffer it was given is replaced by a copy
(``clone``). Where torch already copied (accelerators,
``offload_to_cpu=False``, sharded state dicts, DTensors) nothing is touched.
If the function's signature differs from the one this was written against,
nothing is swapped (torch changed that code; the probe says whether it still
needs a fix).
"""
import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Dict, Iterator

#: Parameter names of the torch function this fix wraps.
EXPECTED_PARAMETERS = ('fsdp_param_info', 'output_states', 'state_name',
                       'shard_state', 'to_save', 'cpu_offload')

#: Held while the function is swapped, so nested or concurrent uses of the
#: context manager restore torch's own function, never a wrapper.
_SWAP_LOCK = threading.RLock()


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


def copy_out_of_gather_buffer(original: Callable) -> Callable:
    """Wrap ``_unflatten_orig_param_states`` to copy aliased results.

    Args:
        original: torch's ``_unflatten_orig_param_states``.

    Returns:
        The same function, followed by a ``clone`` of every result that
        still shares the all-gather buffer.
    """

    @functools.wraps(original)
    def _unflatten_orig_param_states(fsdp_param_info: Any,
                                     output_states: Dict[str, Dict[str, Any]],
                                     state_name: str, shard_state: bool,
                                     to_save: bool, cpu_offload: bool) -> None:
        if not to_save:  # torch returns at once; nothing is kept
            return original(fsdp_param_info, output_states, state_name,
                            shard_state, to_save, cpu_offload)
        views = {
            fqn: state.get(state_name)
            for fqn, state in output_states.items()
        }
        original(fsdp_param_info, output_states, state_name, shard_state,
                 to_save, cpu_offload)
        for fqn, view in views.items():
            value = output_states[fqn].get(state_name)
            if shares_storage(value, view):
                output_states[fqn][state_name] = value.clone()

    return _unflatten_orig_param_states


def swappable_function() -> Any:
    """torch's ``_unflatten_orig_param_states``, if this fix applies to it.

    Returns:
        The function, or None where torch has no distributed support, no
        such function, or one with another signature.
    """
    import torch
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import _optim_utils
    original = getattr(_optim_utils, '_unflatten_orig_param_states', None)
    if original is None or \
            tuple(inspect.signature(original).parameters) != \
            EXPECTED_PARAMETERS:
        return None
    return original


@contextlib.contextmanager
def gathered_states_copied() -> Iterator[None]:
    """Within the block, gathered FSDP optimizer states get their own memory.

    Swaps torch's ``_unflatten_orig_param_states`` for
    :func:`copy_out_of_gather_buffer` of it and restores torch's function
    on exit, whatever happens in the block.

    Yields:
        None.
    """
    with _SWAP_LOCK:
        original = swappable_function()
        if original is None:
            yield
            return
        from torch.distributed.fsdp import _optim_utils
        _optim_utils._unflatten_orig_param_states = \
            copy_out_of_gather_buffer(original)
        try:
            yield
        finally:
            _optim_utils._unflatten_orig_param_states = original
