"""MatrixInfoHook in real mmengine Runner runs on a Fashion-MNIST subset.

Every run uses the repository's configs with a tiny subset (a few iterations
of batch 8), so the whole file takes well under a minute on 2 CPU cores.
"""
import glob
import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmae_plugin  # noqa: F401  (registers datasets, models, fixes)
import mmae_plugin.engine  # noqa: F401  (registers MatrixInfoHook)
from mmae_plugin.engine.hooks.matrix_info_hook import (MatrixInfoHook,
                                                       two_branch_quantities)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = os.path.join(REPO, 'configs', 'fashion_mnist')
TWO_BRANCH_KEYS = ('entropy_1', 'entropy_2', 'mutual_info', 'joint_entropy',
                   'matrix_js', 'spectrum_js')
ONE_BRANCH_KEYS = ('entropy', 'erank', 'rankme', 'tcr')


def shrink_for_test(cfg: Config, work_dir: str, batch: int,
                    iters: int) -> Config:
    """Few iterations of a small batch, logging every iteration."""
    cfg.work_dir = work_dir
    cfg.train_dataloader.batch_size = batch
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = batch * iters
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = None
    cfg.custom_hooks = [dict(type='MatrixInfoHook', interval=1)]
    return cfg


def read_scalars(work_dir: str) -> list:
    """Rows of the run's ``vis_data/scalars.json``."""
    paths = glob.glob(os.path.join(work_dir, '*', 'vis_data',
                                   'scalars.json'))
    assert len(paths) == 1, paths
    with open(paths[0]) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def train(config: str, work_dir: str, batch: int = 8, iters: int = 2,
          **overrides) -> list:
    cfg = shrink_for_test(Config.fromfile(config), work_dir, batch, iters)
    cfg.merge_from_dict(overrides)
    Runner.from_cfg(cfg).train()
    return read_scalars(work_dir)


METHODS = ['simclr', 'byol', 'barlowtwins']


@pytest.fixture(scope='module')
def siamese_runs(tmp_path_factory) -> dict:
    """Work dirs of 2-iteration SimCLR, BYOL and Barlow Twins runs."""
    root = tmp_path_factory.mktemp('siamese')
    work_dirs = {}
    # One run also writes TensorBoard events, to check that backend too.
    tensorboard = dict(visualizer=dict(
        type='UniversalVisualizer',
        vis_backends=[dict(type='LocalVisBackend'),
                      dict(type='TensorboardVisBackend')]))
    for method in METHODS:
        work_dirs[method] = str(root / method)
        train(os.path.join(FMNIST, f'{method}_fmnist.py'), work_dirs[method],
              **(tensorboard if method == 'barlowtwins' else {}))
    return work_dirs


@pytest.mark.parametrize('method', METHODS)
def test_siamese_runs_log_every_quantity(method, siamese_runs):
    work_dir = siamese_runs[method]
    rows = read_scalars(work_dir)
    assert [row['step'] for row in rows] == [1, 2]
    for row in rows:
        for key in TWO_BRANCH_KEYS:
            value = row[f'minfo/{key}']
            assert math.isfinite(value), (key, value)
        d = 128  # embedding size of the configs
        assert 0 < row['minfo/entropy_1'] <= math.log(d)
        assert max(row['minfo/entropy_1'], row['minfo/entropy_2']) <= \
            row['minfo/joint_entropy'] + 1e-9
        assert row['minfo/mutual_info'] <= math.log(d)
        assert 0 <= row['minfo/spectrum_js'] <= math.log(2)
        assert 0 < row['minfo/matrix_js'] <= math.log(2)
    # The values reach the text log as well.
    log_files = glob.glob(os.path.join(work_dir, '*', '*.log'))
    with open(log_files[0]) as handle:
        text = handle.read()
    assert 'minfo/mutual_info:' in text and 'minfo/spectrum_js:' in text


def test_plot_script_draws_one_curve_per_method(siamese_runs, tmp_path):
    out_dir = tmp_path / 'figures'
    script = os.path.join(REPO, 'tools', 'analysis', 'plot_matrix_info.py')
    result = subprocess.run(
        [sys.executable, script] + [siamese_runs[m] for m in METHODS] +
        ['--out-dir', str(out_dir)], capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ('matrix_info', 'figure1_mutual_info',
                 'figure2_joint_entropy', 'figure3a_matrix_js',
                 'figure3b_spectrum_js'):
        for ext in ('png', 'pdf'):
            assert (out_dir / f'{name}.{ext}').stat().st_size > 1000
    sys.path.insert(0, os.path.dirname(script))
    try:
        import plot_matrix_info
    finally:
        sys.path.pop(0)
    labels = [plot_matrix_info.method_label(siamese_runs[m]) for m in METHODS]
    assert labels == ['SimCLR', 'BYOL', 'BarlowTwins']


def test_tensorboard_receives_the_scalars(siamese_runs):
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    work_dir = siamese_runs['barlowtwins']
    event_dirs = glob.glob(os.path.join(work_dir, '*', 'vis_data'))
    accumulator = EventAccumulator(event_dirs[0])
    accumulator.Reload()
    tags = accumulator.Tags()['scalars']
    for key in TWO_BRANCH_KEYS:
        assert f'minfo/{key}' in tags


@pytest.mark.parametrize('config', ['mae_fmnist.py', 'mmae_fmnist.py'])
def test_mae_runs_log_one_branch_quantities(config, tmp_path):
    rows = train(os.path.join(FMNIST, config), str(tmp_path))
    for row in rows:
        for key in ONE_BRANCH_KEYS:
            assert math.isfinite(row[f'minfo/{key}'])
        assert 1 <= row['minfo/erank'] <= 8  # batch of 8 CLS vectors
        assert 1 <= row['minfo/rankme'] <= 8.01


def test_hook_records_the_same_features_as_the_loss(tmp_path):
    """The tapped branches are exactly the embeddings the SimCLR loss pairs."""
    cfg = shrink_for_test(
        Config.fromfile(os.path.join(FMNIST, 'simclr_fmnist.py')),
        str(tmp_path), batch=8, iters=1)
    runner = Runner.from_cfg(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, MatrixInfoHook))
    hook.before_run(runner)
    model = runner.model
    batch = next(iter(runner.train_dataloader))
    data = model.data_preprocessor(batch, training=True)
    hook._armed = True
    with torch.no_grad():
        model.train()
        model.loss(**data)
        stacked = torch.stack(data['inputs'], 1).flatten(0, 1)
        z = model.neck(model.backbone(stacked))[0]
    z1, z2 = hook._branch_embeddings()
    torch.testing.assert_close(z1, z[0::2])
    torch.testing.assert_close(z2, z[1::2])
    threads = torch.get_num_threads()
    values = hook.compute([z1, z2])
    assert torch.get_num_threads() == threads  # restored after 1 thread
    assert values['mutual_info'].dtype == torch.float64
    hook.after_run(runner)


def test_hook_rejects_bad_arguments():
    with pytest.raises(ValueError, match='interval must be a positive'):
        MatrixInfoHook(interval=0)
    with pytest.raises(ValueError, match="kernel must be one of"):
        MatrixInfoHook(kernel='cosine')
    with pytest.raises(ValueError, match='cpu_threads must be a positive'):
        MatrixInfoHook(cpu_threads=0)
    with pytest.raises(ValueError, match='unknown branch key'):
        MatrixInfoHook(branches=[dict(module='neck', view=1)])
    with pytest.raises(ValueError, match='the two branches must have the '
                       'same shape'):
        two_branch_quantities(torch.randn(8, 4), torch.randn(8, 5),
                              'covariance', 1.0)


# --------------------------------------------------------------------------
# 2 processes (gloo, CPU) vs 1 process on the same global batch
# --------------------------------------------------------------------------
DETERMINISTIC_SIMCLR = """
_base_ = [{base!r}]
# No BatchNorm: its statistics would be per-rank in a 2-process run.
backbone = dict(type='ResNet', depth=18, in_channels=1, stem_channels=16,
                base_channels=16, norm_cfg=dict(type='GN', num_groups=4))
model = dict(backbone=backbone,
             neck=dict(norm_cfg=dict(type='GN', num_groups=8)))
# Deterministic, different views: identity and horizontal flip.
train_dataloader = dict(
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(pipeline=[
        dict(type='MultiView', num_views=[1, 1],
             transforms=[[], [dict(type='RandomFlip', prob=1.0)]]),
        dict(type='PackInputs')]))
# lr 0: later iterations see the same weights in both runs.
optim_wrapper = dict(optimizer=dict(lr=0.0))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_two_processes_log_the_same_values_as_one(tmp_path):
    config = tmp_path / 'simclr_deterministic.py'
    config.write_text(
        DETERMINISTIC_SIMCLR.format(
            base=os.path.join(FMNIST, 'simclr_fmnist.py')))
    iters, global_batch = 2, 8
    single = train(str(config), str(tmp_path / 'one'), batch=global_batch,
                   iters=iters)

    dist_dir = str(tmp_path / 'two')
    options = [
        f'train_dataloader.batch_size={global_batch // 2}',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        f'train_dataloader.dataset.indices={global_batch * iters}',
        'train_cfg.max_epochs=1', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1000',
        'custom_hooks.0.interval=1'
    ]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node',
        '2', '--master_addr', '127.0.0.1', '--master_port',
        str(free_port()),
        os.path.join(REPO, 'tools', 'train.py'), str(config), '--launcher',
        'pytorch', '--work-dir', dist_dir, '--cfg-options'
    ] + options
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    double = read_scalars(dist_dir)
    assert [r['step'] for r in double] == [r['step'] for r in single]
    for one, two in zip(single, double):
        for key in TWO_BRANCH_KEYS:
            assert two[f'minfo/{key}'] == pytest.approx(
                one[f'minfo/{key}'], rel=1e-4, abs=1e-6), key
