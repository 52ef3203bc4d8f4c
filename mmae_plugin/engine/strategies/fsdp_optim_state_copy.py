"""FSDP full optimizer state dict on CPU: each state gets its own memory.

Upstream (torch, every release to 2.14.1): with ``use_orig_params=True``
and ``offload_to_cpu=True`` (mmengine's ``state_dict_cfg='full'``),
``_unflatten_orig_param_states`` returns views of one all-gather buffer
when FSDP computes on the CPU, so ``exp_avg`` is saved as a copy of
``exp_avg_sq``.

:func:`gathered_states_copied` is a context manager that replaces torch's
private ``_unflatten_orig_param_states`` by
:func:`copy_out_of_gather_buffer` of it only while active (restored on exit
and on error); :class:`~mmae_plugin.engine.strategies.MMAEFSDPStrategy`
enters it only around its own ``optim_state_dict()``. A state still sharing
storage with the buffer is cloned; where torch already copied nothing is
touched, and under another signature nothing is swapped. Delete this module
once ``tests/fsdp_full_optim_state_probe.py`` passes on unpatched torch.
Details:
docs/upstream_workarounds.md#fsdp-mmaefsdpstrategy-full-optimizer-state-dicts-on-cpu
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
