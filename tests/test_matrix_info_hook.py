"""MatrixInfoHook in real mmengine Runner runs on a Fashion-MNIST subset.

Every run uses the repository's configs with a tiny subset (a few iterations
of batch 8), so the whole file takes well under a minute on 2 CPU cores.
"""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmae_plugin.engine  # noqa: F401  (registers MatrixInfoHook)
import mmae_plugin.registration  # noqa: F401  (datasets, models, fixes)
from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
from mmae_plugin.engine.monitoring.measure import (FALLBACK_TCR,
                                                   one_branch_quantities,
                                                   two_branch_quantities)
from mmae_plugin.matrix_info import (effective_rank, matrix_entropy,
                                     normalized_covariance, rankme)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = os.path.join(REPO, 'configs', 'fashion_mnist')
# The default kernel is the covariance one: every key ends in _cov.
TWO_BRANCH_KEYS = ('entropy_1_cov', 'entropy_2_cov', 'mutual_info_cov',
                   'joint_entropy_cov', 'matrix_js_cov', 'spectrum_js_cov')
ONE_BRANCH_KEYS = ('entropy_cov', 'erank_cov', 'rankme_raw',
                   'tcr_reference_mu1')


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
    paths = glob.glob(os.path.join(work_dir, '*', 'vis_data', 'scalars.json'))
    assert len(paths) == 1, paths
    with open(paths[0]) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def train(config: str,
          work_dir: str,
          batch: int = 8,
          iters: int = 2,
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
    tensorboard = dict(
        visualizer=dict(
            type='UniversalVisualizer',
            vis_backends=[
                dict(type='LocalVisBackend'),
                dict(type='TensorboardVisBackend')
            ]))
    for method in METHODS:
        work_dirs[method] = str(root / method)
        train(
            os.path.join(FMNIST, f'{method}_fmnist.py'), work_dirs[method],
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
        assert 0 < row['minfo/entropy_1_cov'] <= math.log(d)
        assert max(row['minfo/entropy_1_cov'], row['minfo/entropy_2_cov']) \
            <= row['minfo/joint_entropy_cov'] + 1e-9
        assert row['minfo/mutual_info_cov'] <= math.log(d)
        assert 0 <= row['minfo/spectrum_js_cov'] <= math.log(2)
        assert 0 < row['minfo/matrix_js_cov'] <= math.log(2)
    # The values reach the text log as well.
    log_files = glob.glob(os.path.join(work_dir, '*', '*.log'))
    with open(log_files[0]) as handle:
        text = handle.read()
    assert 'minfo/mutual_info_cov:' in text and \
        'minfo/spectrum_js_cov:' in text


def test_plot_script_draws_one_curve_per_method(siamese_runs, tmp_path):
    out_dir = tmp_path / 'figures'
    script = os.path.join(REPO, 'tools', 'analysis', 'plot_matrix_info.py')
    result = subprocess.run(
        [sys.executable, script] + [siamese_runs[m] for m in METHODS] +
        ['--out-dir', str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ('matrix_info', 'figure1_mutual_info', 'figure2_joint_entropy',
                 'figure3a_matrix_js', 'figure3b_spectrum_js'):
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
        assert 1 <= row['minfo/erank_cov'] <= 8  # batch of 8 CLS vectors
        assert 1 <= row['minfo/rankme_raw'] <= 8.01


def test_hook_records_the_same_features_as_the_loss(tmp_path):
    """The tapped branches are exactly the embeddings the SimCLR loss pairs."""
    cfg = shrink_for_test(
        Config.fromfile(os.path.join(FMNIST, 'simclr_fmnist.py')),
        str(tmp_path),
        batch=8,
        iters=1)
    runner = Runner.from_cfg(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, MatrixInfoHook))
    hook.before_run(runner)
    model = runner.model
    batch = next(iter(runner.train_dataloader))
    data = model.data_preprocessor(batch, training=True)
    hook.taps.armed = True
    with torch.no_grad():
        model.train()
        model.loss(**data)
        stacked = torch.stack(data['inputs'], 1).flatten(0, 1)
        z = model.neck(model.backbone(stacked))[0]
    z1, z2 = hook.taps.embeddings()
    torch.testing.assert_close(z1, z[0::2])
    torch.testing.assert_close(z2, z[1::2])
    threads = torch.get_num_threads()
    values = hook.compute([z1, z2])
    assert torch.get_num_threads() == threads  # restored after 1 thread
    assert values['mutual_info_cov'].dtype == torch.float64
    hook.after_run(runner)


BAD_ARGUMENTS = [
    # (keyword arguments, error type, words the message must contain)
    (dict(interval=0), ValueError, ['interval', '>= 1', '0']),
    (dict(interval=True), TypeError, ['interval', 'integer', 'True']),
    (dict(interval=2.0), TypeError, ['interval', 'integer', '2.0']),
    (dict(kernel='cosine'), ValueError, ['kernel', 'covariance', 'cosine']),
    (dict(alpha=1e308), ValueError, ['alpha', '<= 50', '1e+308']),
    (dict(alpha=0), ValueError, ['alpha', '> 0', '0']),
    (dict(alpha=float('nan')), ValueError, ['alpha', 'finite', 'nan']),
    (dict(alpha=True), TypeError, ['alpha', 'real number', 'True']),
    (dict(alpha='2'), TypeError, ['alpha', 'real number', "'2'"]),
    (dict(pool='max'), ValueError, ['pool', 'cls', 'max']),
    (dict(tcr='logdet'), ValueError, ['tcr', 'objective', 'logdet']),
    (dict(mu=2.0), ValueError, ['objective', 'mu=2.0', "tcr='paper'"]),
    (dict(centering=True), ValueError, ['objective', 'centering=True']),
    (dict(tcr='paper', mu=True), TypeError, ['mu', 'real number', 'True']),
    (dict(tcr='paper', mu=-1.0), ValueError, ['mu', '> 0', '-1.0']),
    (dict(tcr='paper', mu=float('inf')), ValueError, ['mu', 'finite']),
    (dict(tcr='reference',
          centering='no'), TypeError, ['centering', 'True or False', "'no'"]),
    (dict(prefix=None), TypeError, ['prefix', 'non-empty string', 'None']),
    (dict(prefix=''), TypeError, ['prefix', 'non-empty string']),
    (dict(cpu_threads=0), ValueError, ['cpu_threads', '>= 1', '0']),
    (dict(cpu_threads=True), TypeError, ['cpu_threads', 'integer']),
    (dict(branches=[]), ValueError, ['branches', '1 or 2']),
    (dict(branches=dict(module='neck')), ValueError, ['branches', 'list']),
    (dict(branches=[dict(module='neck', view=1)]), ValueError,
     ['unknown branch key', 'view']),
    (dict(branches=[dict(module='neck', call=True)]), TypeError,
     ['branch call', 'integer', 'True']),
    (dict(branches=[dict(module='neck', call=-1)]), ValueError,
     ['branch call', '>= 0']),
    (dict(branches=[dict(module='neck', tap='grad')]), ValueError,
     ['branch tap', 'input', 'grad']),
    (dict(branches=[dict(module=3)]), TypeError, ['branch module', '3']),
]


@pytest.mark.parametrize(
    'kwargs,error,words',
    BAD_ARGUMENTS,
    ids=[repr(row[0]) for row in BAD_ARGUMENTS])
def test_hook_rejects_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        MatrixInfoHook(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_branches_of_different_shapes_are_refused():
    with pytest.raises(
            ValueError, match='the two branches must have the '
            'same shape'):
        two_branch_quantities(
            torch.randn(8, 4), torch.randn(8, 5), 'covariance', 1.0)


# --------------------------------------------------------------------------
# one-branch quantities against float64 numpy
# --------------------------------------------------------------------------
def numpy_one_branch(z, kernel, alpha, form, mu, centering):
    """Independent float64 numpy version of the one-branch quantities."""
    z = np.asarray(z, dtype=np.float64)
    if kernel == 'covariance':
        zb = (z - z.mean(0)) / z.std(0)  # biased variance, as BatchNorm
        matrix = zb.T @ zb / z.shape[0]
    else:
        zn = z / np.linalg.norm(z, axis=1, keepdims=True)
        matrix = zn @ zn.T
    lam = np.clip(np.linalg.eigvalsh(matrix), 0, None)
    p = lam / lam.sum()
    p = p[p > 1e-15]
    shannon = -(p * np.log(p)).sum()
    renyi = shannon if alpha == 1 else np.log((p**alpha).sum()) / (1 - alpha)
    s = np.linalg.svd(z, compute_uv=False)
    q = s / s.sum() + 1e-7
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    if centering:
        zn = zn - zn.mean(0)
    d = z.shape[1]
    if form == 'paper':
        tcr = np.linalg.slogdet(mu * np.eye(d) + zn.T @ zn)[1]
    else:
        tcr = np.linalg.slogdet(np.eye(d) + (mu / d) * zn.T @ zn)[1]
    suffix = {'covariance': 'cov', 'gram': 'gram'}[kernel]
    order = '' if alpha == 1 else f'_alpha{alpha:g}'
    tcr_key = f'tcr_{form}{"_centered" if centering else ""}_mu{mu:g}'
    return {
        f'entropy_{suffix}{order}': renyi,
        f'erank_{suffix}': np.exp(shannon),
        'rankme_raw': np.exp(-(q * np.log(q)).sum()),
        tcr_key: tcr
    }


@pytest.mark.parametrize('kernel,alpha,form,mu,centering', [
    ('covariance', 1.0, 'reference', 1.0, False),
    ('covariance', 2.0, 'paper', 1.0, False),
    ('gram', 1.0, 'reference', 3.0, True),
    ('gram', 0.5, 'paper', 0.1, True),
])
def test_one_branch_quantities_match_numpy(kernel, alpha, form, mu, centering):
    torch.manual_seed(0)
    z = torch.randn(48, 16) @ torch.randn(16, 32) + 0.3  # rank 16 of 32
    values = one_branch_quantities(z, kernel, alpha,
                                   dict(form=form, mu=mu, centering=centering))
    expected = numpy_one_branch(z.numpy(), kernel, alpha, form, mu, centering)
    assert set(values) == set(expected)
    for name, value in expected.items():
        assert float(values[name]) == pytest.approx(value, rel=1e-10), name


def test_erank_is_the_papers_effective_rank_not_rankme():
    """erank = exp(matrix entropy) of the unit-diagonal kernel (Def. 6)."""
    torch.manual_seed(1)
    z = torch.randn(64, 24) * torch.linspace(0.1, 3, 24)
    values = one_branch_quantities(z, 'covariance', 1.0, FALLBACK_TCR)
    dense = normalized_covariance(z)
    assert float(values['erank_cov']) == pytest.approx(
        float(effective_rank(dense)), rel=1e-10)
    assert float(values['erank_cov']) == pytest.approx(
        math.exp(float(matrix_entropy(dense))), rel=1e-12)
    # The raw-feature spectrum measure is another number.
    assert abs(float(values['erank_cov']) - float(effective_rank(z))) > 0.1
    assert float(values['rankme_raw']) == pytest.approx(float(rankme(z)))


@pytest.mark.parametrize(
    'regularizer,norm_twice',
    [(dict(mu=1.0, form='reference', centering=False), False),
     (dict(mu=3.0, form='paper', centering=True), True)])
def test_tcr_is_the_objective_of_the_model_regularizer(tmp_path, regularizer,
                                                       norm_twice):
    cfg = shrink_for_test(
        Config.fromfile(os.path.join(FMNIST, 'mmae_fmnist.py')),
        str(tmp_path),
        batch=8,
        iters=1)
    cfg.model.regularizer.update(regularizer)
    cfg.model.final_norm_twice = norm_twice
    runner = Runner.from_cfg(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, MatrixInfoHook))
    hook.before_run(runner)
    assert hook.branches == [
        dict(
            module='regularizer', call=0, tap='input', rows='all', pool='cls')
    ]
    model = runner.model
    data = model.data_preprocessor(
        next(iter(runner.train_dataloader)), training=True)
    hook.taps.armed = True
    with torch.no_grad():
        losses = model.loss(**data)
    (z, ) = hook.taps.embeddings()
    values = hook.compute([z])
    # The tapped features are the ones the loss term was computed on ...
    assert torch.equal(model.regularizer(z), losses['loss_tcr'])
    # ... and the logged tcr is the coding rate that term maximises.
    zn = torch.nn.functional.normalize(z.double(), dim=1)
    key = model.regularizer.key
    assert key == 'tcr_{}{}_mu{:g}'.format(
        regularizer['form'], '_centered' if regularizer['centering'] else '',
        regularizer['mu'])
    assert float(values[key]) == pytest.approx(
        -float(model.regularizer.value(zn)), rel=1e-12)
    expected = numpy_one_branch(z.numpy(), 'covariance', 1.0,
                                regularizer['form'], regularizer['mu'],
                                regularizer['centering'])[key]
    assert float(values[key]) == pytest.approx(expected, rel=1e-10)
    # The paper form with its own mu is an option.
    paper = MatrixInfoHook(tcr='paper', mu=2.0)
    paper.before_run(runner)
    assert paper._tcr == dict(form='paper', mu=2.0, centering=False)
    paper.after_run(runner)
    hook.after_run(runner)


def test_model_without_tcr_loss_logs_the_published_objective(tmp_path):
    cfg = shrink_for_test(
        Config.fromfile(os.path.join(FMNIST, 'mae_fmnist.py')),
        str(tmp_path),
        batch=8,
        iters=1)
    runner = Runner.from_cfg(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, MatrixInfoHook))
    hook.before_run(runner)
    assert hook._tcr == FALLBACK_TCR == dict(
        form='reference', mu=1.0, centering=False)
    assert hook.branches[0]['module'] == 'backbone'
    hook.after_run(runner)


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


def test_two_processes_log_the_same_values_as_one(tmp_path, cpu_dist_env):
    config = tmp_path / 'simclr_deterministic.py'
    config.write_text(
        DETERMINISTIC_SIMCLR.format(
            base=os.path.join(FMNIST, 'simclr_fmnist.py')))
    iters, global_batch = 2, 8
    single = train(
        str(config), str(tmp_path / 'one'), batch=global_batch, iters=iters)

    dist_dir = str(tmp_path / 'two')
    options = [
        f'train_dataloader.batch_size={global_batch // 2}',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        f'train_dataloader.dataset.indices={global_batch * iters}',
        'train_cfg.max_epochs=1', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1000', 'custom_hooks.0.interval=1'
    ]
    env = dict(cpu_dist_env, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_addr', '127.0.0.1', '--master_port', env['MASTER_PORT'],
        os.path.join(REPO, 'tools', 'train.py'),
        str(config), '--launcher', 'pytorch', '--work-dir', dist_dir,
        '--cfg-options'
    ] + options
    result = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    # The config's held-out rows (epoch-level, absent from `single`, whose
    # hooks shrink_for_test replaced) are not compared here.
    double = [r for r in read_scalars(dist_dir) if 'loss' in r]
    assert [r['step'] for r in double] == [r['step'] for r in single]
    for one, two in zip(single, double):
        for key in TWO_BRANCH_KEYS:
            assert two[f'minfo/{key}'] == pytest.approx(
                one[f'minfo/{key}'], rel=1e-4, abs=1e-6), key
