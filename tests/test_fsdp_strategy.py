"""MMAEFSDPStrategy's fixes act only inside the strategy's own calls.

The 2-process FSDP runs (resume bit for bit, Adam moments of the full state
dict) are in tests/test_tools_fsdp.py.
"""
import pytest
import torch
from mmengine._strategy import FSDPStrategy
from mmengine.registry import STRATEGIES

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.strategies import (MMAEFSDPStrategy,
                                           gathered_states_copied)
from mmae_plugin.engine.strategies.fsdp import per_rank_seed
from mmae_plugin.engine.strategies.fsdp_optim_state_copy import \
    copy_out_of_gather_buffer

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason='torch without distributed')


def test_strategy_is_registered_and_is_mmengine_fsdp():
    assert STRATEGIES.get('MMAEFSDPStrategy') is MMAEFSDPStrategy
    assert issubclass(MMAEFSDPStrategy, FSDPStrategy)
    assert STRATEGIES.get('FSDPStrategy') is FSDPStrategy


def test_torch_function_is_swapped_only_inside_the_block():
    from torch.distributed.fsdp import _optim_utils
    original = _optim_utils._unflatten_orig_param_states
    with gathered_states_copied():
        inside = _optim_utils._unflatten_orig_param_states
        assert inside is not original and inside.__wrapped__ is original
    assert _optim_utils._unflatten_orig_param_states is original
    with pytest.raises(KeyError):
        with gathered_states_copied():
            raise KeyError('an error inside optim_state_dict')
    assert _optim_utils._unflatten_orig_param_states is original


def unflatten_like_torch_on_cpu(fsdp_param_info, output_states, state_name,
                                shard_state, to_save, cpu_offload):
    """What torch's function does to CPU views: reshape, then ``.cpu()``
    (a no-op on the CPU) under offload, ``clone`` otherwise."""
    if not to_save:
        return
    for state in output_states.values():
        value = state[state_name].reshape(2, 2)
        state[state_name] = value.cpu() if cpu_offload else value.clone()


@pytest.mark.parametrize('cpu_offload', [True, False])
def test_gathered_states_no_longer_alias_the_buffer(cpu_offload):
    unflatten = copy_out_of_gather_buffer(unflatten_like_torch_on_cpu)
    buffer = torch.arange(8.)
    states = {'a': {}, 'b': {}}
    results = {}
    for state_name, values in (('exp_avg', (1., 2.)), ('exp_avg_sq', (3.,
                                                                      4.))):
        buffer[:4], buffer[4:] = values  # torch's all-gather into one buffer
        states['a'][state_name], states['b'][state_name] = buffer[:4], \
            buffer[4:]
        unflatten(None, states, state_name, False, True, cpu_offload)
        results[state_name] = {fqn: s[state_name] for fqn, s in states.items()}
    buffer.fill_(-1.)  # the buffer's next use
    for state_name, (a, b) in (('exp_avg', (1., 2.)), ('exp_avg_sq', (3.,
                                                                      4.))):
        assert torch.equal(results[state_name]['a'], torch.full((2, 2), a))
        assert torch.equal(results[state_name]['b'], torch.full((2, 2), b))


def test_ranks_that_keep_nothing_are_left_alone():
    unflatten = copy_out_of_gather_buffer(unflatten_like_torch_on_cpu)
    view = torch.zeros(4)
    states = {'a': {'exp_avg': view}}
    unflatten(None, states, 'exp_avg', False, False, True)
    assert states['a']['exp_avg'] is view


@pytest.mark.parametrize(
    'checkpoint,expected',
    [(dict(meta=dict(seed=10)), dict(meta=dict(seed=7))),
     (dict(meta=dict(seed=None)), dict(meta=dict(seed=None))),
     (dict(meta=[]), dict(meta=[])), (dict(), dict())])
def test_per_rank_seed_undoes_the_offset(checkpoint, expected):
    per_rank_seed(checkpoint, 3)
    assert checkpoint == expected
