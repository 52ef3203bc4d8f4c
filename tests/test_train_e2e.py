"""The real tools on the real data: 2-process CPU training, resume, test."""
import json
import os
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

import mmae_plugin.registration  # noqa: F401  (checkpoint allow-list)

CONFIG = 'configs/fashion_mnist/mmae_fmnist.py'
# The shipped dataloader settings (num_workers=1, persistent_workers=True)
# are kept: the augmentations run in a persistent worker process.
SMOKE = [
    'train_dataloader.dataset.indices=512',
    'train_dataloader.batch_size=64',
    'default_hooks.logger.interval=1',
]


def run(repo_root, args, env):
    """Run a tool with ``env`` (conftest's CPU/gloo environment)."""
    proc = subprocess.run(
        args,
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope='module')
def config(repo_root, tmp_path_factory):
    """The shipped M-MAE config with a random flip in the worker pipeline.

    The flip may also run batched in the main process (data preprocessor);
    adding one to the pipeline makes the worker's draws part of the test
    whatever the shipped pipeline holds.
    """
    path = tmp_path_factory.mktemp('config') / 'mmae_fmnist_worker_flip.py'
    path.write_text(
        f'_base_ = [{os.path.join(repo_root, CONFIG)!r}]\n'
        'train_dataloader = dict(dataset=dict(pipeline=[\n'
        "    dict(type='RandomFlip', prob=0.5), dict(type='PackInputs')]))\n")
    return str(path)


def dist_train(repo_root, env, config, work_dir, *options, resume=False):
    args = [
        'bash', 'tools/dist_train.sh', config, '2', '--work-dir',
        str(work_dir)
    ]
    if resume:
        args.append('--resume')
    return run(repo_root, args + ['--cfg-options', *SMOKE, *options], env)


def train_losses(work_dir):
    """(epoch, iter, loss, loss_tcr) of every logged training iteration."""
    rows = []
    for run_dir in sorted(os.listdir(work_dir)):
        path = os.path.join(work_dir, run_dir, 'vis_data', 'scalars.json')
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            for line in f:
                entry = json.loads(line)
                if 'loss' in entry:
                    rows.append((entry['epoch'], entry['iter'], entry['loss'],
                                 entry['loss_tcr']))
    return rows


@pytest.fixture(scope='module')
def uninterrupted(repo_root, config, tmp_path_factory, cpu_dist_env_factory):
    work_dir = tmp_path_factory.mktemp('uninterrupted')
    dist_train(repo_root, cpu_dist_env_factory(), config, work_dir,
               'train_cfg.max_epochs=2')
    return work_dir


def test_two_process_cpu_training_writes_checkpoints(uninterrupted):
    files = set(os.listdir(uninterrupted))
    assert {'epoch_1.pth', 'epoch_2.pth', 'last_checkpoint'} <= files
    ckpt = torch.load(uninterrupted / 'epoch_2.pth')
    assert ckpt['meta']['epoch'] == 2
    losses = train_losses(uninterrupted)
    # 512 images / (2 ranks x 64) = 4 iterations per epoch.
    assert [(e, i) for e, i, *_ in losses
            ] == [(e, i) for e in (1, 2) for i in range(4 * e - 3, 4 * e + 1)]
    assert all(tcr < 0 for *_, tcr in losses)


def test_the_resume_test_runs_at_the_shipped_dataloader_settings(config):
    cfg = Config.fromfile(config)
    assert cfg.train_dataloader.num_workers == 1
    assert cfg.train_dataloader.persistent_workers is True
    assert not any(
        option.startswith(('train_dataloader.num_workers',
                           'train_dataloader.persistent')) for option in SMOKE)


def test_resumed_run_matches_uninterrupted_run_bit_for_bit(
        repo_root, config, uninterrupted, tmp_path, cpu_dist_env_factory):
    """Stopped after epoch 1 and resumed, 2 processes, persistent worker.

    On the CPU (conftest's environment hides any GPU): bit-exact equality
    needs deterministic kernels.
    """
    dist_train(repo_root, cpu_dist_env_factory(), config, tmp_path,
               'train_cfg.max_epochs=1')
    assert not (tmp_path / 'epoch_2.pth').exists()
    dist_train(
        repo_root,
        cpu_dist_env_factory(),
        config,
        tmp_path,
        'train_cfg.max_epochs=2',
        resume=True)
    assert train_losses(tmp_path) == train_losses(uninterrupted)
    final = torch.load(tmp_path / 'epoch_2.pth')['state_dict']
    final_ref = torch.load(uninterrupted / 'epoch_2.pth')['state_dict']
    assert final.keys() == final_ref.keys()
    differing = [
        key for key, value in final_ref.items()
        if not torch.equal(final[key], value)
    ]
    assert differing == [], f'{len(differing)} of {len(final_ref)} differ'


def test_linear_probe_loads_pretrained_and_dist_test_evaluates(
        repo_root, uninterrupted, tmp_path, cpu_dist_env_factory):
    pretrained = uninterrupted / 'epoch_2.pth'
    run(repo_root, [
        sys.executable, 'tools/train.py',
        'configs/fashion_mnist/linear_fmnist.py', '--work-dir',
        str(tmp_path), '--cfg-options',
        f'model.backbone.init_cfg.checkpoint={pretrained}',
        'train_dataloader.dataset.indices=64',
        'train_dataloader.batch_size=32', 'val_dataloader.dataset.indices=64',
        'train_cfg.max_epochs=1', 'train_cfg.val_interval=1'
    ], cpu_dist_env_factory())
    probe = torch.load(tmp_path / 'epoch_1.pth')['state_dict']
    backbone = torch.load(pretrained)['state_dict']
    # The frozen encoder is exactly the pretrained one.
    torch.testing.assert_close(probe['backbone.layers.0.attn.qkv.weight'],
                               backbone['backbone.layers.0.attn.qkv.weight'])
    out = tmp_path / 'metrics.json'
    run(repo_root, [
        'bash', 'tools/dist_test.sh', 'configs/fashion_mnist/linear_fmnist.py',
        str(tmp_path / 'epoch_1.pth'), '2', '--work-dir',
        str(tmp_path), '--out',
        str(out), '--out-item', 'metrics', '--cfg-options',
        'test_dataloader.dataset.indices=64'
    ], cpu_dist_env_factory())
    metrics = json.loads(out.read_text())
    assert 0 <= metrics['accuracy/top1'] <= 100
