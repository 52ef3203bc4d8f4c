"""A non-finite total loss stops training at once, and no NaN checkpoint.

Real Runner runs: a toy regression and the shipped Fashion-MNIST MAE and
M-MAE configs, all with lr = 1e6.
"""
import glob
import math
import os
import subprocess
import sys

import pytest
import torch
from checkpoint_fault_tools import toy_runner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks import (DivergenceHook, NonFiniteCheckpointError,
                                      TrainingDivergedError)
from mmae_plugin.engine.hooks.divergence_hook import divergence_message


def all_finite(checkpoint_path):
    """Whether every float tensor of a checkpoint's model state is finite."""
    state = torch.load(checkpoint_path, weights_only=True)['state_dict']
    return all(
        torch.isfinite(v).all() for v in state.values()
        if v.is_floating_point())


class RecordLosses(Hook):
    """The total loss of every iteration, as mmengine logged it."""

    priority = 'LOW'

    def __init__(self):
        self.losses = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.losses.append(
            runner.message_hub.get_scalar('train/loss').current())


def test_toy_regression_stops_at_the_first_non_finite_loss(tmp_path):
    record = RecordLosses()
    runner = toy_runner(
        tmp_path,
        max_epochs=60,
        lr=1e6,
        max_keep_ckpts=-1,
        custom_hooks=[dict(type='DivergenceHook'), record])
    with pytest.raises(TrainingDivergedError) as info:
        runner.train()
    # One iteration per epoch: the recorder (after the hook) never saw the
    # non-finite loss; iteration len+1 diverged.
    stopped_at = len(record.losses) + 1
    assert all(math.isfinite(v) for v in record.losses)
    assert stopped_at < 60
    message = str(info.value)
    assert f'iteration {stopped_at} (epoch {stopped_at})' in message
    assert 'Non-finite terms: loss=' in message
    checkpoints = sorted(glob.glob(str(tmp_path / 'epoch_*.pth')))
    assert len(checkpoints) == stopped_at - 1  # none of the bad iteration
    assert all(all_finite(path) for path in checkpoints)
    with open(tmp_path / 'last_checkpoint') as f:
        assert f.read() == str(tmp_path / f'epoch_{stopped_at - 1}.pth')


def test_without_the_hook_mmengine_trains_on_through_nan(tmp_path):
    """The upstream behaviour the hook exists for (so the test above can
    fail): no error, NaN checkpoints."""
    runner = toy_runner(
        tmp_path, max_epochs=60, lr=1e6, max_keep_ckpts=1, upstream=True)
    runner.train()
    assert not all_finite(tmp_path / 'epoch_60.pth')


def test_without_divergence_hook_the_checkpoint_hook_still_saves_no_nan(
        tmp_path):
    """SafeCheckpointHook alone: the run stops at the first save whose
    state is not finite, and every checkpoint on disk is finite."""
    with pytest.raises(NonFiniteCheckpointError, match='NaN or Inf'):
        toy_runner(tmp_path, max_epochs=60, lr=1e6, max_keep_ckpts=-1).train()
    saved = glob.glob(str(tmp_path / 'epoch_*.pth'))
    assert saved and all(all_finite(path) for path in saved)


@pytest.mark.parametrize('name', ['mae', 'mmae'])
def test_shipped_pretraining_config_stops_with_the_loss_terms(
        repo_root, tmp_path, name):
    cfg = Config.fromfile(
        f'{repo_root}/configs/fashion_mnist/{name}_fmnist.py')
    assert dict(type='DivergenceHook') in cfg.custom_hooks
    cfg.merge_from_dict({
        'train_dataloader.dataset.indices': 64,
        'train_dataloader.batch_size': 16,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'optim_wrapper.optimizer.lr': 1e6,
        'train_cfg.max_epochs': 4,
        'default_hooks.checkpoint.interval': 1
    })
    cfg.work_dir, cfg.log_level = str(tmp_path), 'WARNING'
    runner = Runner.from_cfg(cfg)
    with pytest.raises(
            TrainingDivergedError,
            match=r'training diverged at iteration \d+') as info:
        runner.train()
    message = str(info.value)
    expected_terms = ['loss='] + (['loss_rec=', 'loss_tcr=']
                                  if name == 'mmae' else [])
    for term in expected_terms:
        assert term in message, message
    for path in glob.glob(str(tmp_path / '*.pth')):
        assert all_finite(path), path


def test_message_lists_bad_and_good_terms_and_the_trend():
    message = divergence_message(
        dict(loss=float('nan'), loss_rec=float('inf'), loss_tcr=-0.5),
        iteration=7,
        epoch=2,
        recent=[0.5, 3e8, float('nan')])
    assert 'iteration 7 (epoch 2)' in message
    assert 'Non-finite terms: loss=nan, loss_rec=inf' in message
    assert 'finite terms: loss_tcr=-0.5' in message
    assert '0.5 -> 3e+08 -> nan' in message


def test_hook_refuses_to_run_without_runtime_info_hook(tmp_path):
    runner = toy_runner(
        tmp_path, max_epochs=1, custom_hooks=[dict(type='DivergenceHook')])
    runner._hooks = [
        h for h in runner._hooks if type(h).__name__ != 'RuntimeInfoHook'
    ]
    with pytest.raises(ValueError, match='RuntimeInfoHook'):
        runner.train()


def test_with_upstreams_runtime_info_hook_one_read_per_step(tmp_path):
    """With mmengine's RuntimeInfoHook (which waits for every step with
    ``.item()`` on each logged value, MessageHub._get_valid_value) the hook
    adds no ``.item()`` and reads its all-reduced table once per step
    (``.cpu()``). With DeferredRuntimeInfoHook it reads nothing of the
    step just queued (tests/test_step_waits.py)."""
    counts = []
    originals = {name: getattr(torch.Tensor, name) for name in ('item', 'cpu')}
    for hooks in ([], [dict(type='DivergenceHook')]):
        calls = dict.fromkeys(originals, 0)

        def counting(name, calls=calls):

            def call(self, *args, **kwargs):
                calls[name] += 1
                return originals[name](self, *args, **kwargs)

            return call

        for name in originals:
            setattr(torch.Tensor, name, counting(name))
        try:
            toy_runner(
                tmp_path / str(len(hooks)), max_epochs=3,
                custom_hooks=hooks).train()
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
        counts.append(calls)
    assert counts[0]['item'] > 0 and counts[1]['item'] == counts[0]['item']
    assert counts[1]['cpu'] == counts[0]['cpu'] + 3  # 3 iterations
    assert DivergenceHook.priority == 'HIGH'


def run_log(work_dir):
    """The text of the run's log file (``<work_dir>/<timestamp>/*.log``)."""
    return ''.join(
        open(path).read()
        for path in sorted(glob.glob(str(work_dir / '*' / '*.log'))))


def test_divergence_before_any_checkpoint_says_so_in_the_log_file(tmp_path):
    """Item 7 of issue 34: no "resume from the last checkpoint" when there
    is none, and the reason is in the run's log file, not only on
    stderr."""
    from checkpoint_fault_tools import InfiniteUpdate, make_toy_runner

    from mmae_plugin.engine.runners import MMAERunner
    runner = make_toy_runner(
        tmp_path,
        5,
        runner_class=MMAERunner,
        dataset_length=2,
        default_hooks=dict(
            checkpoint=dict(type='SafeCheckpointHook', interval=100)),
        custom_hooks=[dict(type='DivergenceHook'),
                      InfiniteUpdate(1)])
    with pytest.raises(TrainingDivergedError) as info:
        runner.train()
    message = str(info.value)
    assert 'The run has no checkpoint yet: start it again' in message
    assert 'Resume from' not in message
    assert message in run_log(tmp_path)


def test_divergence_names_the_newest_checkpoint_in_the_log_file(tmp_path):
    from checkpoint_fault_tools import InfiniteUpdate
    runner = toy_runner(
        tmp_path,
        max_epochs=5,
        custom_hooks=[dict(type='DivergenceHook'),
                      InfiniteUpdate(2)])
    with pytest.raises((TrainingDivergedError, NonFiniteCheckpointError)) \
            as info:
        runner.train()
    message = str(info.value)
    assert f'{tmp_path}/epoch_1.pth' in message
    assert message in run_log(tmp_path)


def test_nonfinite_first_save_says_there_is_no_checkpoint(tmp_path):
    from checkpoint_fault_tools import InfiniteUpdate
    runner = toy_runner(
        tmp_path, max_epochs=2, custom_hooks=[InfiniteUpdate(1)])
    with pytest.raises(NonFiniteCheckpointError) as info:
        runner.train()
    message = str(info.value)
    assert 'The run has no checkpoint yet: start it again' in message
    assert message in run_log(tmp_path)


# ------------------------------------------- two nodes, one rank diverging
TWO_NODE_CONFIG = """_base_ = '{config}'
custom_imports = dict(
    imports=['mmae_plugin.registration', 'rank_divergence_hook'],
    allow_failed_imports=False)
custom_hooks = [
    dict(type='ReseedHook'),
    dict(type='DivergenceHook'),
    dict(type='NaNInputOnRank', rank=1, iteration={iteration}),
]
# A rank left alone in a collective would wait 10 minutes, not seconds.
env_cfg = dict(dist_cfg=dict(backend='nccl', timeout=600))
"""


def two_node_command(repo_root, config, work_dir, node_rank, port):
    return [
        sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2',
        '--nproc_per_node', '1', '--node_rank',
        str(node_rank), '--master_addr', '127.0.0.1', '--master_port',
        str(port),
        os.path.join(repo_root, 'tools', 'train.py'),
        str(config), '--launcher', 'pytorch', '--work-dir',
        str(work_dir), '--cfg-options', 'train_dataloader.dataset.indices=64',
        'train_dataloader.batch_size=8', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'default_hooks.logger.interval=100', 'train_cfg.max_epochs=4'
    ]


@pytest.mark.skipif(sys.platform != 'linux', reason='reads /proc (Linux)')
def test_one_rank_diverging_stops_both_nodes_together(repo_root, tmp_path,
                                                      cpu_dist_env_factory):
    """Two torchrun "nodes" on localhost (gloo, one process each): rank
    1's loss alone turns NaN at iteration 3; both processes stop there,
    with the same message, long before the collective timeout."""
    from test_multinode import kill_tree
    config = tmp_path / 'diverge_on_rank1.py'
    config.write_text(
        TWO_NODE_CONFIG.format(
            config=os.path.join(repo_root, 'configs', 'fashion_mnist',
                                'mmae_fmnist.py'),
            iteration=3))
    env = cpu_dist_env_factory(OMP_NUM_THREADS='1')
    env['PYTHONPATH'] = os.pathsep.join([
        repo_root,
        os.path.join(repo_root, 'tests'),
        env.get('PYTHONPATH', '')
    ])
    nodes = [
        subprocess.Popen(
            two_node_command(repo_root, config, tmp_path / 'work', rank,
                             env['MASTER_PORT']),
            cwd=repo_root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True) for rank in (0, 1)
    ]
    try:
        logs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_tree(node.pid)
                node.wait()
    messages = [
        sorted({
            line[line.index('training diverged'):]
            for line in log.splitlines() if 'training diverged' in line
        }) for log in logs
    ]
    assert all(node.returncode != 0 for node in nodes)
    assert messages[0] and messages[0] == messages[1], \
        [log[-3000:] for log in logs]
    (message, ) = messages[0]
    assert message.startswith(
        'training diverged at iteration 3 (epoch 1): the total loss is not '
        'finite on rank 1 of 2. Non-finite terms (rank 1): loss=nan'), message
    assert 'loss_rec=nan' in message
    assert 'TrainingDivergedError' in logs[0] and \
        'TrainingDivergedError' in logs[1]
