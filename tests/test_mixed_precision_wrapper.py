"""MixedPrecisionOptimWrapper: bfloat16 autocast without a loss scaler.

On the CPU (mmengine's autocast runs bfloat16 there) the wrapper's steps are
compared bit for bit with a hand-written ``torch.autocast`` loop, and a real
Runner trains, saves and resumes with it, also from a checkpoint written
with a scaler. The float16 path is mmengine's ``AmpOptimWrapper`` itself
(it needs a GPU; ``tests/test_cuda.py`` runs the recipes there).
"""
import copy

import pytest
import torch
from conftest import ToyDataset, ToyModel
from mmengine.runner import Runner
from mmpretrain.registry import OPTIM_WRAPPERS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.optimizers.mixed_precision_wrapper import (
    MixedPrecisionOptimWrapper, needs_loss_scaler)


def regression_batch(step: int):
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(8, 2, generator=generator)
    return inputs, inputs @ torch.tensor([1.5, -2.0]) + 0.25


def squared_error(model: torch.nn.Module, inputs, target) -> torch.Tensor:
    return (model.linear(inputs).squeeze(1).float() - target).square().mean()


def test_bfloat16_steps_equal_a_plain_autocast_loop():
    torch.manual_seed(0)
    model = ToyModel()
    reference = copy.deepcopy(model)
    wrapper = OPTIM_WRAPPERS.build(
        dict(
            type='MixedPrecisionOptimWrapper',
            dtype='bfloat16',
            optimizer=torch.optim.AdamW(model.parameters(), lr=0.1)))
    assert isinstance(wrapper, MixedPrecisionOptimWrapper)
    assert wrapper.loss_scaler is None
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.1)
    for step in range(4):
        inputs, target = regression_batch(step)
        with wrapper.optim_context(model):
            assert torch.get_autocast_dtype('cpu') is torch.bfloat16
            loss = squared_error(model, inputs, target)
        wrapper.update_params(loss)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            ref_loss = squared_error(reference, inputs, target)
        ref_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert torch.equal(loss, ref_loss)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)
    # The state of a plain OptimWrapper: nothing for a scaler to restore.
    assert 'loss_scaler' not in wrapper.state_dict()


def test_gradients_are_not_scaled():
    model = ToyModel()
    wrapper = MixedPrecisionOptimWrapper(
        dtype=torch.bfloat16,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    inputs, target = regression_batch(0)
    with wrapper.optim_context(model):
        loss = squared_error(model, inputs, target)
    wrapper.backward(loss)
    grads = [p.grad.clone() for p in model.linear.parameters()]
    model.zero_grad()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        squared_error(model, inputs, target).backward()
    for ours, theirs in zip(grads, model.linear.parameters()):
        assert torch.equal(ours, theirs.grad)


@pytest.mark.parametrize(
    'loss_scale, dtype, scaler',
    [
        ('auto', torch.bfloat16, False),
        ('auto', torch.float16, True),
        ('auto', None, True),  # autocast's default: float16 on GPUs
        (None, torch.bfloat16, False),
        ('dynamic', torch.bfloat16, True),  # asked for explicitly
        (512.0, torch.float16, True),
    ])
def test_which_settings_build_a_scaler(loss_scale, dtype, scaler):
    assert needs_loss_scaler(loss_scale, dtype) is scaler


@pytest.mark.parametrize('dtype', ['float16', None])
def test_no_scaler_without_bfloat16_is_refused(dtype):
    with pytest.raises(ValueError, match=r'loss_scale=None .*bfloat16'):
        MixedPrecisionOptimWrapper(
            loss_scale=None,
            dtype=dtype,
            optimizer=torch.optim.SGD(ToyModel().parameters(), lr=0.1))


def test_unknown_dtype_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"optim_wrapper.dtype .*'bf16'"):
        MixedPrecisionOptimWrapper(
            dtype='bf16',
            optimizer=torch.optim.SGD(ToyModel().parameters(), lr=0.1))


def bf16_runner(work_dir, max_epochs: int, **kwargs) -> Runner:
    return Runner(
        model=ToyModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=ToyDataset(4),
            batch_size=2,
            sampler=dict(type='DefaultSampler', shuffle=False),
            num_workers=0),
        optim_wrapper=dict(
            type='MixedPrecisionOptimWrapper',
            dtype='bfloat16',
            optimizer=dict(type='AdamW', lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
        default_scope='mmpretrain',
        log_level='WARNING',
        **kwargs)


def test_runner_trains_saves_and_resumes_a_checkpoint_with_a_scaler(tmp_path):
    straight = bf16_runner(
        tmp_path / 'straight', 2, experiment_name='bf16_straight')
    straight.train()
    final = torch.load(
        tmp_path / 'straight' / 'epoch_2.pth', weights_only=True)
    assert 'loss_scaler' not in final['optimizer']

    # An epoch-1 checkpoint as AmpOptimWrapper('dynamic') would have saved
    # it: the same optimizer state plus a GradScaler's.
    first = torch.load(
        tmp_path / 'straight' / 'epoch_1.pth', weights_only=True)
    first['optimizer']['loss_scaler'] = torch.amp.GradScaler(
        'cpu').state_dict()
    scaled = tmp_path / 'scaled_epoch_1.pth'
    torch.save(first, scaled)
    resumed = bf16_runner(
        tmp_path / 'resumed',
        2,
        resume=True,
        load_from=str(scaled),
        experiment_name='bf16_resumed')
    resumed.train()
    again = torch.load(tmp_path / 'resumed' / 'epoch_2.pth', weights_only=True)
    for key, value in final['state_dict'].items():
        assert torch.equal(value, again['state_dict'][key]), key
