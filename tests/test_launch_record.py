"""Resume refuses a launch it cannot continue unchanged (world size,
per-GPU batch), naming both, unless told to rescale the schedule."""
import os.path as osp

import pytest
import torch
from conftest import run_local_ranks
from launch_record_runs import toy_launch

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.runners import LaunchChangedError

HERE = osp.dirname(osp.abspath(__file__))


def saved_launch(path):
    return torch.load(path, weights_only=True)['meta']['launch']


def test_checkpoints_record_their_launch(tmp_path):
    toy_launch(tmp_path, 1).train()
    assert saved_launch(tmp_path / 'epoch_1.pth') == dict(
        world_size=1, per_gpu_batch=2, iters_per_epoch=8, sharding=None)


def test_another_per_gpu_batch_is_refused_naming_both(tmp_path):
    toy_launch(tmp_path, 1).train()
    with pytest.raises(LaunchChangedError) as info:
        toy_launch(tmp_path, 3, batch_size=4, resume=True).train()
    message = str(info.value)
    assert f'cannot resume {tmp_path}/epoch_1.pth' in message
    assert ('1 processes x 2 images (2 per step, 8 iterations per epoch); '
            'this launch has 1 processes x 4 images (4 per step, 4 '
            'iterations per epoch)') in message
    assert 'resume_launch_change=rescale' in message
    assert not osp.exists(tmp_path / 'epoch_2.pth')


def test_rescale_keeps_the_schedule_in_epochs(tmp_path):
    toy_launch(tmp_path, 1).train()  # 8 iterations, warm-up end at 16
    runner = toy_launch(
        tmp_path,
        3,
        batch_size=4,
        resume=True,
        cfg=dict(resume_launch_change='rescale'))
    runner.train()
    scheduler = runner.param_schedulers[0]
    assert (scheduler.begin, scheduler.end) == (0, 8)  # 2 epochs of 4
    assert runner.iter == 4 + 2 * 4  # epoch 1 rescaled, then 2 epochs
    assert saved_launch(tmp_path / 'epoch_3.pth')['per_gpu_batch'] == 4


def test_another_world_size_is_refused(tmp_path, cpu_dist_env):
    proc = run_local_ranks(
        'tests/launch_change_driver.py', str(tmp_path), env=cpu_dist_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert saved_launch(tmp_path / 'epoch_1.pth')['world_size'] == 2
    with pytest.raises(
            LaunchChangedError,
            match=r'a launch of 2 processes x 2 images \(4 per '
            r'step, 4 iterations per epoch\); this launch has 1 '
            r'processes x 2 images'):
        toy_launch(tmp_path, 2, resume=True).train()
