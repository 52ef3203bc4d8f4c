"""SafeCheckpointHook never writes a checkpoint that is not finite.

The parameters become Inf in an *update* whose loss was finite (SGD with a
learning rate of Inf from epoch 2 on), so a loss check such as
``DivergenceHook`` cannot see it before the save; the hook's finiteness
flag over parameters and optimizer state must, on one process and on two
(each rank stopping with the same message).
"""
import os
import os.path as osp

import pytest
import torch
from checkpoint_fault_tools import InfiniteUpdate, toy_runner
from conftest import run_local_ranks

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks import (NonFiniteCheckpointError,
                                      SafeCheckpointHook)

HERE = osp.dirname(osp.abspath(__file__))


def checkpoints_are_finite(folder) -> bool:
    """Whether every tensor of every ``*.pth`` in ``folder`` is finite."""

    def finite(value):
        if torch.is_tensor(value):
            return bool(torch.isfinite(value).all()) \
                if value.is_floating_point() else True
        if isinstance(value, dict):
            return all(finite(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return all(finite(v) for v in value)
        return True

    return all(
        finite(torch.load(osp.join(folder, name), weights_only=True))
        for name in os.listdir(folder) if name.endswith('.pth'))


def test_update_to_inf_is_not_saved_and_names_the_last_finite(tmp_path):
    with pytest.raises(NonFiniteCheckpointError) as info:
        toy_runner(
            tmp_path,
            max_epochs=3,
            max_keep_ckpts=-1,
            custom_hooks=[InfiniteUpdate(epoch=2)]).train()
    message = str(info.value)
    assert 'not saving epoch_2.pth after iteration 2: 2 tensors' in message
    assert 'linear.weight' in message and 'linear.bias' in message
    assert f'newest checkpoint saved finite is {tmp_path}/epoch_1.pth' \
        in message
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) \
        == ['epoch_1.pth']
    assert (tmp_path / 'last_checkpoint').read_text() == \
        str(tmp_path / 'epoch_1.pth')
    assert checkpoints_are_finite(tmp_path)


def test_nonfinite_optimizer_state_alone_is_refused(tmp_path):
    runner = toy_runner(tmp_path, max_epochs=1)
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, SafeCheckpointHook))
    param = runner.model.linear.weight
    runner.optim_wrapper.optimizer.state[param]['momentum_buffer'] = \
        torch.tensor([[float('nan'), 0.0]])
    with pytest.raises(
            NonFiniteCheckpointError,
            match=r'optimizer\[linear\.weight\]\.momentum_buffer'):
        hook.after_train_epoch(runner)
    assert not osp.exists(tmp_path / 'epoch_2.pth')


@pytest.mark.parametrize('setting', ['interval', 'max_keep_ckpts'])
@pytest.mark.parametrize('value', [0, -2, 1.5])
def test_meaningless_interval_and_retention_are_refused(setting, value):
    kwargs = {setting: value}
    with pytest.raises(
            ValueError,
            match=rf'{setting}={value!r} is not '
            r'allowed: use an integer >= 1 or -1'):
        SafeCheckpointHook(**kwargs)


def run_two_ranks(work_dir, env, mode):
    """``nonfinite_save_driver.py`` on 2 gloo processes.

    Returns:
        The finished ``torch.distributed.run`` process.
    """
    return run_local_ranks(
        'tests/nonfinite_save_driver.py', str(work_dir), mode, env=env)


def test_two_ranks_stop_with_the_same_message_and_save_nothing(
        tmp_path, cpu_dist_env):
    proc = run_two_ranks(tmp_path, cpu_dist_env, 'update')
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = [(tmp_path / f'rank{r}.txt').read_text() for r in (0, 1)]
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0].startswith('NonFiniteCheckpointError: not saving '
                                  'epoch_2.pth'), outcomes[0]
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) \
        == ['epoch_1.pth']
    assert checkpoints_are_finite(tmp_path)


def test_nan_batch_on_one_rank_leaves_no_nan_checkpoint(
        tmp_path, cpu_dist_env):
    """Rank 1 stops at its NaN loss; rank 0 (finite loss, NaN parameters
    after DDP's average) reaches the save, whose finiteness all-reduce its
    peer never joins: it stops too, and writes nothing."""
    run_two_ranks(tmp_path, cpu_dist_env, 'batch')
    assert (tmp_path / 'rank1.txt').read_text().startswith(
        'TrainingDivergedError: training diverged at iteration 4 (epoch 2)')
    assert 'no error' not in (tmp_path / 'rank0.txt').read_text()
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) \
        == ['epoch_1.pth']
    assert (tmp_path / 'last_checkpoint').read_text() == \
        str(tmp_path / 'epoch_1.pth')
    assert checkpoints_are_finite(tmp_path)
