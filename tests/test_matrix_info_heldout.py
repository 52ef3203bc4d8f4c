"""MatrixInfoHook's held-out option in real mmengine Runner runs.

Tiny runs of the repository's Siamese configs (batch 8, 2 iterations per
epoch) with a held-out set of 2 batches of 8 Fashion-MNIST test images.
"""
import glob
import json
import math
import os
import random
from typing import List, Optional

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmae_plugin.registration  # noqa: F401  (datasets, models, hooks)
from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
from mmae_plugin.engine.monitoring.measure import two_branch_quantities

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = os.path.join(REPO, 'configs', 'fashion_mnist')
KEYS = ('entropy_1_cov', 'entropy_2_cov', 'mutual_info_cov',
        'joint_entropy_cov', 'matrix_js_cov', 'spectrum_js_cov')


def heldout_dataset(cfg: Config) -> dict:
    """64 test images through the config's own two-view pipeline."""
    return dict(
        type='GzipFashionMNIST',
        data_root=cfg.train_dataloader.dataset.data_root,
        split='test',
        indices=64,
        pipeline=cfg.train_pipeline)


def run(method: str,
        work_dir: str,
        heldout: Optional[dict] = None,
        epochs: int = 2,
        amp: bool = False) -> Runner:
    """Train ``method``'s config for a few iterations; return the runner.

    ``amp``: train under bfloat16 autocast (the plugin's
    ``MixedPrecisionOptimWrapper``, which runs on a CPU without a scaler).
    """
    cfg = Config.fromfile(os.path.join(FMNIST, f'{method}_fmnist.py'))
    if amp:
        cfg.optim_wrapper.type = 'MixedPrecisionOptimWrapper'
        cfg.optim_wrapper.dtype = 'bfloat16'
    cfg.work_dir = work_dir
    cfg.log_level = 'WARNING'
    cfg.train_dataloader.batch_size = 8
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = 16
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=epochs)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = None
    hook = dict(type='MatrixInfoHook', interval=1)
    if heldout is not None:
        hook['heldout'] = dict(dataset=heldout_dataset(cfg), **heldout)
    cfg.custom_hooks = [hook]
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def scalar_rows(work_dir: str) -> List[dict]:
    paths = glob.glob(os.path.join(work_dir, '*', 'vis_data', 'scalars.json'))
    assert len(paths) == 1, paths
    with open(paths[0]) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def the_hook(runner: Runner) -> MatrixInfoHook:
    hooks = [h for h in runner.hooks if isinstance(h, MatrixInfoHook)]
    assert len(hooks) == 1
    return hooks[0]


@pytest.fixture(scope='module')
def byol_runs(tmp_path_factory):
    """The same BYOL run with and without the held-out set."""
    root = tmp_path_factory.mktemp('heldout')
    return dict(
        plain=run('byol', str(root / 'plain')),
        heldout=run(
            'byol', str(root / 'heldout'), heldout=dict(num_batches=2)))


def test_heldout_is_measured_at_start_and_after_every_epoch(byol_runs):
    runner = byol_runs['heldout']
    rows = [
        row for row in scalar_rows(runner.work_dir)
        if 'minfo_heldout/mutual_info_cov' in row
    ]
    assert [(row['epoch'], row['step']) for row in rows] == \
        [(0, 0), (1, 2), (2, 4)]
    for row in rows:
        for key in KEYS:
            assert math.isfinite(row[f'minfo_heldout/{key}']), key
    # The training-batch values are still logged every iteration.
    train_rows = [
        row for row in scalar_rows(runner.work_dir)
        if 'minfo/mutual_info_cov' in row
    ]
    assert [row['step'] for row in train_rows] == [1, 2, 3, 4]
    hook = the_hook(runner)
    # Default batch size: the (global) training batch.
    assert [len(batch['inputs'][0]) for batch in hook._heldout_batches] == \
        [8, 8]
    assert runner.message_hub.get_scalar(
        'minfo_heldout/mutual_info_cov').current() == \
        rows[-1]['minfo_heldout/mutual_info_cov']


def test_heldout_is_off_by_default(byol_runs):
    runner = byol_runs['plain']
    assert the_hook(runner).heldout is None
    assert not any(
        key.startswith('minfo_heldout/')
        for row in scalar_rows(runner.work_dir) for key in row)


def test_heldout_leaves_training_unchanged(byol_runs):
    """Same weights, momentum target and training-batch values: the held-out
    pass draws nothing from the training random streams and its side
    effects (BYOL's momentum update, BatchNorm statistics) stay in a copy."""
    plain, heldout = byol_runs['plain'], byol_runs['heldout']
    state_a, state_b = plain.model.state_dict(), heldout.model.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key
    rows_a = [r for r in scalar_rows(plain.work_dir) if 'loss' in r]
    rows_b = [r for r in scalar_rows(heldout.work_dir) if 'loss' in r]
    for row_a, row_b in zip(rows_a, rows_b):
        for key in ('loss', *(f'minfo/{k}' for k in KEYS)):
            assert row_a[key] == row_b[key], key


def test_every_measurement_sees_the_same_views(byol_runs):
    """Measuring twice gives the same values and leaves the model alone; a
    rebuilt held-out set has the same pixels."""
    runner = byol_runs['heldout']
    hook = the_hook(runner)
    model = runner.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = hook.measure_heldout(model)
    second = hook.measure_heldout(model)
    assert first == second
    assert first == {
        k.split('/', 1)[1]: v
        for k, v in hook.heldout_history[-1].items()
        if k.startswith('minfo_heldout/')
    }
    for key, value in model.state_dict().items():
        assert torch.equal(before[key], value), key
    rebuilt = hook._build_heldout(runner)
    for old, new in zip(hook._heldout_batches, rebuilt):
        for view_old, view_new in zip(old['inputs'], new['inputs']):
            assert torch.equal(view_old, view_new)
    # The two views differ: they are two augmentations, not one image twice.
    assert not torch.equal(rebuilt[0]['inputs'][0], rebuilt[0]['inputs'][1])


def expected_heldout(runner: Runner, method: str, mode: str = 'eval') -> dict:
    """The branches computed by hand, averaged over batches (in train mode
    BatchNorm normalises by the batch: the running statistics the forward
    updates do not enter the output)."""
    model = runner.model
    hook = the_hook(runner)
    model.train(mode == 'train')
    per_batch = []
    with torch.no_grad():
        for batch in hook._heldout_batches:
            v1, v2 = model.data_preprocessor(batch, False)['inputs']
            z1 = model.neck(model.backbone(v1))[0]
            if method == 'byol':  # branch 2: the momentum target of view 2
                z2 = model.target_net(v2)[0]
            else:
                z2 = model.neck(model.backbone(v2))[0]
            per_batch.append(two_branch_quantities(z1, z2, 'covariance', 1.0))
    model.train()
    return {
        key: sum(float(v[key]) for v in per_batch) / len(per_batch)
        for key in per_batch[0]
    }


@pytest.mark.parametrize('method,mode', [('spectral', 'eval'),
                                         ('simclr', 'eval'),
                                         ('barlowtwins', 'train')])
def test_heldout_values_are_the_branches_in_their_mode(method, mode, tmp_path):
    runner = run(
        method,
        str(tmp_path),
        heldout=dict(num_batches=2, mode=mode),
        epochs=1)
    logged = {
        k.split('/', 1)[1]: v
        for k, v in the_hook(runner).heldout_history[-1].items()
        if k.startswith('minfo_heldout/')
    }
    expected = expected_heldout(runner, method, mode)
    assert logged.keys() == expected.keys()
    for key in expected:
        assert logged[key] == pytest.approx(
            expected[key], rel=1e-5, abs=1e-7), key


def test_byol_branches_in_eval_mode(byol_runs):
    runner = byol_runs['heldout']
    logged = {
        k.split('/', 1)[1]: v
        for k, v in the_hook(runner).heldout_history[-1].items()
        if k.startswith('minfo_heldout/')
    }
    expected = expected_heldout(runner, 'byol')
    for key in expected:
        assert logged[key] == pytest.approx(
            expected[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize('method',
                         ['simclr', 'byol', 'barlowtwins', 'spectral'])
def test_siamese_configs_measure_test_images_in_train_mode(method):
    cfg = Config.fromfile(os.path.join(FMNIST, f'{method}_fmnist.py'))
    hook = next(h for h in cfg.custom_hooks if h.type == 'MatrixInfoHook')
    heldout = MatrixInfoHook(**{k: v
                                for k, v in hook.items()
                                if k != 'type'}).heldout
    assert heldout.dataset['split'] == 'test'
    assert heldout.dataset['pipeline'] == cfg.train_pipeline  # two views
    assert (heldout.num_batches, heldout.mode) == (4, 'train')


@pytest.mark.parametrize('heldout,words', [
    (dict(num_batches=2), 'dataset'),
    (dict(dataset=dict(type='GzipFashionMNIST'), bogus=1), 'bogus'),
    (dict(dataset=dict(type='GzipFashionMNIST'), mode='test'), 'mode'),
    (dict(dataset=dict(type='GzipFashionMNIST'),
          num_batches=0), 'num_batches'),
    (dict(dataset=dict(type='GzipFashionMNIST'), batch_size=1), 'batch_size'),
    (dict(dataset=dict(type='GzipFashionMNIST'), seed=2**32), 'seed'),
    ('test', 'dataset'),
])
def test_bad_heldout_settings_are_refused(heldout, words):
    with pytest.raises((TypeError, ValueError), match=words):
        MatrixInfoHook(heldout=heldout)


def test_too_small_a_heldout_dataset_is_refused(tmp_path):
    with pytest.raises(ValueError, match='need 1024 images'):
        run('spectral',
            str(tmp_path),
            epochs=1,
            heldout=dict(num_batches=2, batch_size=512))


def everything_the_pass_could_touch(model: torch.nn.Module) -> dict:
    """Parameters and buffers (values), each module's mode, the
    regulariser's own attributes and the random states."""
    regularizer = getattr(model, 'regularizer', None)
    return dict(
        state={k: v.clone()
               for k, v in model.state_dict().items()},
        modes=[m.training for m in model.modules()],
        # Tensor attributes (the skip code) by identity: a forward rebinds
        # them. The gatherer is restored as a copy: its fields are compared.
        regularizer=None if regularizer is None else dict(
            {
                k: id(v) if isinstance(v, torch.Tensor) else v
                for k, v in vars(regularizer).items()
            },
            _gatherer=dict(vars(regularizer._gatherer))),
        torch=torch.get_rng_state(),
        numpy=np.random.get_state()[1].copy(),
        python=random.getstate())


@pytest.mark.parametrize('method,mode', [('barlowtwins', 'train'),
                                         ('mmae', 'eval')])
def test_the_pass_leaves_the_training_model_as_it_was(method, mode, tmp_path):
    """No copy any more: in train mode the forward updates BatchNorm's
    running statistics and counts, M-MAE's sets its regulariser's skip
    code; all of it, the modes (mixed here: one module in eval) and the
    random states are as before the pass."""
    runner = run(
        method,
        str(tmp_path),
        heldout=dict(num_batches=2, mode=mode),
        epochs=1)
    model = runner.model
    model.train()
    next(iter(model.children())).eval()
    before = everything_the_pass_could_touch(model)
    the_hook(runner).measure_heldout(model)
    after = everything_the_pass_could_touch(model)
    assert before['state'].keys() == after['state'].keys()
    for key in before['state']:
        assert torch.equal(before['state'][key], after['state'][key]), key
    assert before['modes'] == after['modes']
    assert before['regularizer'] == after['regularizer']
    assert torch.equal(before['torch'], after['torch'])
    assert np.array_equal(before['numpy'], after['numpy'])
    assert before['python'] == after['python']


def patch_embeddings_of_the_pass(runner: Runner) -> list:
    """The autocast state and the dtype of the patch embedding (a
    convolution, so bfloat16 under bfloat16 autocast; the backbone's output
    comes from a LayerNorm, which autocast keeps in float32) in each forward
    of the held-out pass."""
    seen = []

    def note(module, args, output):
        seen.append((torch.is_autocast_enabled('cpu'), output[0].dtype))

    handle = runner.model.backbone.patch_embed.register_forward_hook(note)
    try:
        the_hook(runner).measure_heldout(runner.model)
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize('amp,expected', [(True, (True, torch.bfloat16)),
                                          (False, (False, torch.float32))])
def test_the_pass_runs_under_the_runs_autocast(amp, expected, tmp_path):
    """A bfloat16 run measures its held-out set in bfloat16, as its training
    steps run; a float32 run in float32."""
    runner = run(
        'mmae', str(tmp_path), heldout=dict(num_batches=2), epochs=1, amp=amp)
    assert patch_embeddings_of_the_pass(runner) == [expected] * 2
    values = the_hook(runner).heldout_history[-1]
    assert all(math.isfinite(v) for v in values.values())


def test_training_autocast_follows_the_optimizer_wrapper():
    """The held-out forward's autocast is the training step's: bfloat16
    for the plugin's bfloat16 wrapper, none for a plain one; wrappers that
    disagree (an OptimWrapperDict) are refused naming the optim_wrapper."""
    from mmengine.optim import OptimWrapper, OptimWrapperDict

    from mmae_plugin.engine.monitoring.heldout import training_autocast
    from mmae_plugin.engine.optimizers.mixed_precision_wrapper import \
        MixedPrecisionOptimWrapper
    layer = torch.nn.Linear(2, 2)

    def sgd():
        return torch.optim.SGD(layer.parameters(), lr=0.1)

    bf16 = MixedPrecisionOptimWrapper(dtype='bfloat16', optimizer=sgd())
    plain = OptimWrapper(optimizer=sgd())
    with training_autocast(bf16)():
        assert torch.is_autocast_enabled('cpu')
        assert layer(torch.ones(1, 2)).dtype == torch.bfloat16
    with training_autocast(plain)():
        assert not torch.is_autocast_enabled('cpu')
    both = OptimWrapperDict(a=bf16, b=plain)
    with pytest.raises(ValueError, match='optim_wrapper'):
        training_autocast(both)
