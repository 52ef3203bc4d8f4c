"""OnlineProbeHook in real mmengine Runner runs of the Fashion-MNIST M-MAE.

Every run is configs/fashion_mnist/mmae_fmnist_online_probe.py shrunk to a
few iterations of batch 8 and a held-out split of 40 test images.
"""
import copy
import glob
import json
import math
import os
import random
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks import OnlineProbeHook
from mmae_plugin.engine.monitoring.online_probe import (FeatureMemory,
                                                        default_probe_branch)
from mmae_plugin.evaluation import knn_class_scores
from mmae_plugin.matrix_info.pooling import pool_token_sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = os.path.join(REPO, 'configs', 'fashion_mnist')
CONFIG = os.path.join(FMNIST, 'mmae_fmnist_online_probe.py')
HELDOUT_IMAGES = 40
KEYS = ('online_probe/linear_top1', 'online_probe/knn_top1')


def heldout(cfg: Config) -> dict:
    """The config's held-out split shrunk to the first 40 test images,
    with the hook's default collate."""
    loader = copy.deepcopy(cfg.heldout_dataloader)
    loader.pop('collate_fn')
    loader.batch_size = 20
    loader.dataset.indices = HELDOUT_IMAGES
    return loader


def probe_cfg(work_dir,
              hook: bool = True,
              epochs: int = 2,
              batch: int = 8,
              iters: int = 2,
              **hook_args) -> Config:
    """The shrunk config: ``iters`` iterations of ``batch`` per epoch, drop
    path on (train and eval modes differ, train mode draws at random), no
    ReseedHook (a stray draw from the global generator would show), and the
    hook alone (or no hook)."""
    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'online_probe_{uuid.uuid4().hex[:12]}'
    cfg.train_dataloader.batch_size = batch
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = batch * iters
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=epochs)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = None
    cfg.model.backbone.drop_path_rate = 0.1
    probe = dict(type='OnlineProbeHook', val_dataloader=heldout(cfg))
    cfg.custom_hooks = [dict(probe, **hook_args)] if hook else []
    return cfg


def read_scalars(work_dir) -> list:
    """Rows of the run's ``vis_data/scalars.json``."""
    (path, ) = glob.glob(
        os.path.join(str(work_dir), '*', 'vis_data', 'scalars.json'))
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def the_hook(runner) -> OnlineProbeHook:
    return next(h for h in runner.hooks if isinstance(h, OnlineProbeHook))


@pytest.fixture(scope='module')
def runs(tmp_path_factory) -> dict:
    """The same 2-epoch pretraining without the hook, with it, and with it
    training on eval-mode features (``train_features='eval'``)."""
    root = tmp_path_factory.mktemp('online_probe')
    result = {}
    for name, hook, args in (('without', False, {}), ('with', True, {}),
                             ('eval', True, dict(train_features='eval'))):
        runner = Runner.from_cfg(probe_cfg(root / name, hook=hook, **args))
        runner.train()
        result[name] = runner
    return result


@pytest.mark.parametrize('name', ['with', 'eval'])
def test_pretraining_is_bit_identical_with_and_without_the_hook(runs, name):
    """4 iterations, a held-out evaluation after epoch 1 and 2 (and with
    ``train_features='eval'`` an eval-mode forward every step): the model's
    final state dict is equal, tensor for tensor."""
    assert [row['epoch'] for row in the_hook(runs[name]).history] == [1, 2]
    without = runs['without'].model.state_dict()
    with_hook = runs[name].model.state_dict()
    assert without.keys() == with_hook.keys()
    for key in without:
        assert torch.equal(without[key], with_hook[key]), key


def test_scalars_reach_the_log_and_scalars_json(runs):
    work_dir = runs['with'].work_dir
    rows = read_scalars(work_dir)
    losses = [r['online_probe/train_loss'] for r in rows if 'loss' in r]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    evaluations = [r for r in rows if KEYS[0] in r]
    assert [r['epoch'] for r in evaluations] == [1, 2]
    for row in evaluations:
        for key in KEYS:
            assert 0 <= row[key] <= 100 and (row[key] * HELDOUT_IMAGES /
                                             100) % 1 == pytest.approx(0)
    (log, ) = glob.glob(os.path.join(work_dir, '*', '*.log'))
    text = open(log).read()
    assert 'online_probe/train_loss:' in text
    assert 'OnlineProbeHook, epoch 2: online_probe/linear_top1:' in text


def test_accuracies_are_those_of_the_probe_and_the_knn(runs):
    """Recomputed independently: the CLS features of the unmasked encoder
    in eval mode, the probe in eval mode, and the kNN of
    :func:`knn_class_scores` over the memory (k=20, T=0.07)."""
    runner = runs['with']
    hook, model = the_hook(runner), runner.model
    assert hook.branch['module'] == 'backbone' and hook.branch['pool'] == 'cls'
    feats, labels = eval_cls(model, list(hook._loader))
    hook.probe.eval()
    with torch.no_grad():
        linear = (hook.probe(feats).argmax(1) == labels).float().mean()
    hook.probe.train()
    bank, bank_labels = hook.memory.bank()
    assert bank.shape == (32, 128)  # 2 epochs x 2 iterations x 8
    knn = knn_class_scores(feats, bank, bank_labels, 10, 20, 0.07)
    knn = (knn.argmax(1) == labels).double().mean()
    last = hook.history[-1]
    assert last[KEYS[0]] == pytest.approx(100 * float(linear))
    assert last[KEYS[1]] == pytest.approx(100 * float(knn))


def eval_cls(model, batches) -> tuple:
    """CLS features of the unmasked encoder in eval mode, and labels."""
    model.eval()
    with torch.no_grad():
        data = [model.data_preprocessor(b, False) for b in batches]
        feats = torch.cat([
            pool_token_sequence(model.extract_feat(d['inputs'])[0], 'cls', 1)
            for d in data
        ])
    model.train()
    labels = torch.cat([s.gt_label for d in data for s in d['data_samples']])
    return feats, labels


def test_eval_train_features_are_the_unmasked_encoders(runs):
    """``train_features='eval'``: the last step's memory rows are the eval
    mode CLS features of its (unflipped, unmasked) images, by the model
    that step left."""
    runner = runs['eval']
    last = list(runner.train_dataloader)[-1]  # the sampler's last epoch
    feats, labels = eval_cls(runner.model, [last])
    rows, kept = the_hook(runner).memory.bank()
    torch.testing.assert_close(rows[-8:], feats, rtol=1e-5, atol=1e-6)
    assert torch.equal(kept[-8:], labels)


def random_states() -> tuple:
    return (torch.get_rng_state(), np.random.get_state()[1].copy(),
            random.getstate())


def test_evaluation_restores_modes_buffers_and_random_states(runs):
    """The held-out pass: eval mode inside, train mode after; every random
    stream as before; the same numbers twice."""
    runner = runs['with']
    hook, model = the_hook(runner), runner.model
    model.train()
    modes_inside = []
    handle = model.backbone.register_forward_hook(
        lambda module, args, output: modes_inside.append(module.training))
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    torch.manual_seed(123)
    before = random_states()
    try:
        first = hook.evaluate(model)
        second = hook.evaluate(model)
    finally:
        handle.remove()
    after = random_states()
    assert torch.equal(before[0], after[0])
    assert np.array_equal(before[1], after[1]) and before[2] == after[2]
    assert modes_inside and not any(modes_inside)
    assert all(module.training for module in model.modules())
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())
    assert first == second and set(first) == {'linear_top1', 'knn_top1'}


def test_training_step_leaves_the_model_and_random_state_alone(runs):
    """One probe step (a fresh hook on the trained model): no global random
    draw, no gradient or grad flag changed on the model."""
    runner, model = runs['with'], runs['with'].model
    hook = OnlineProbeHook(num_classes=10)
    hook.before_run(runner)
    data_batch = next(iter(runner.train_dataloader))
    hook.before_train_iter(runner, 0, data_batch)
    with torch.no_grad():
        model(**model.data_preprocessor(data_batch, True), mode='loss')
    requires = [p.requires_grad for p in model.parameters()]
    before = random_states()
    try:
        hook.after_train_iter(runner, 0, data_batch)
    finally:
        hook.after_run(runner)
    after = random_states()
    assert torch.equal(before[0], after[0])
    assert np.array_equal(before[1], after[1]) and before[2] == after[2]
    assert [p.requires_grad for p in model.parameters()] == requires
    assert all(p.grad is None for p in model.parameters())
    assert hook.probe[1].weight.dtype == torch.float32
    assert hook.probe[1].weight.grad is not None  # it stepped
    assert hook.memory.filled == 8


def test_probe_weights_come_from_its_own_generator():
    from mmae_plugin.engine.monitoring.online_probe import build_probe
    state = torch.get_rng_state()
    a = build_probe(16, 10, 3, torch.device('cpu'))
    b = build_probe(16, 10, 3, torch.device('cpu'))
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(a[1].weight, b[1].weight)
    assert not a[0].affine and float(a[1].weight.detach().std()) < 0.02


def test_memory_keeps_the_latest_rows():
    memory = FeatureMemory(5)
    memory.add(torch.arange(3.).view(3, 1), torch.tensor([0, 1, 2]))
    memory.add(torch.arange(3., 7.).view(4, 1), torch.tensor([3, 4, 5, 6]))
    rows, labels = memory.bank()
    assert sorted(rows.flatten().tolist()) == [2., 3., 4., 5., 6.]
    assert sorted(labels.tolist()) == [2, 3, 4, 5, 6]


# --------------------------------------------------------------------------
# mixed precision
# --------------------------------------------------------------------------
def test_bfloat16_autocast_run_trains_the_probe_in_float32(tmp_path):
    """The runner's AmpOptimWrapper (the plugin's MixedPrecisionOptimWrapper,
    bfloat16 on the CPU). The encoder's final LayerNorm gives float32 under
    autocast, so the patch embedding (a bfloat16 convolution) is tapped:
    the probe trains and is scored in float32 and logs finite values."""
    branch = dict(module='backbone.patch_embed.projection')
    cfg = probe_cfg(tmp_path, epochs=1, branch=branch)
    cfg.optim_wrapper = dict(
        cfg.optim_wrapper,
        type='MixedPrecisionOptimWrapper',
        dtype='bfloat16',
        loss_scale='auto')
    runner = Runner.from_cfg(cfg)
    dtypes = []
    runner.model.backbone.patch_embed.projection.register_forward_hook(
        lambda module, args, output: dtypes.append(output.dtype))
    runner.train()
    hook = the_hook(runner)
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) == 2 + 2
    assert hook.probe[1].weight.dtype == torch.float32
    assert hook.memory.rows.dtype == torch.float32
    assert hook.memory.bank()[0].shape == (16, 128)
    rows = read_scalars(tmp_path)
    losses = [r['online_probe/train_loss'] for r in rows if 'loss' in r]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    (last, ) = [r for r in rows if KEYS[0] in r]
    assert all(0 <= last[key] <= 100 for key in KEYS)


# --------------------------------------------------------------------------
# bad input: at build time or in before_run / before_train
# --------------------------------------------------------------------------
BAD_ARGUMENTS = [
    (dict(interval=0), ValueError, ['interval', '>= 1', '0']),
    (dict(interval=True), TypeError, ['interval', 'integer', 'True']),
    (dict(interval=1.5), TypeError, ['interval', 'integer', '1.5']),
    (dict(branch='backbone'), ValueError, ['branch', "'backbone'"]),
    (dict(branch=dict(module='backbone', view=1)), ValueError,
     ['unknown branch key', 'view']),
    (dict(branch=dict(module='backbone', rows='shuffled')), ValueError,
     ['rows', 'shuffled', "'all'"]),
    (dict(pool='max'), ValueError, ['pool', 'cls', 'max']),
    (dict(num_classes=1), ValueError, ['num_classes', '>= 2', '1']),
    (dict(optimizer=dict(type='Adamm')), ValueError,
     ['optimizer type', 'AdamW', "'Adamm'"]),
    (dict(optimizer=dict(type='SGD', lr=-1)), ValueError,
     ['optimizer lr', '> 0', '-1']),
    (dict(optimizer='AdamW'), TypeError, ['optimizer', '"type"', 'AdamW']),
    (dict(k=0), ValueError, ['k', '>= 1', '0']),
    (dict(temperature=0.0), ValueError, ['temperature', '> 0', '0.0']),
    (dict(memory_size=-1), ValueError, ['memory_size', '>= 0', '-1']),
    (dict(val_dataloader=dict(batch_size=8)), ValueError,
     ['val_dataloader', '"dataset"', 'batch_size']),
    (dict(prefix=''), TypeError, ['prefix', 'non-empty string']),
]


@pytest.mark.parametrize(
    'kwargs,error,words',
    BAD_ARGUMENTS,
    ids=[repr(row[0]) for row in BAD_ARGUMENTS])
def test_hook_rejects_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        OnlineProbeHook(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_unlabelled_training_data_is_refused_before_training(tmp_path):
    """mmae_fmnist.py's own pipeline drops the labels."""
    cfg = probe_cfg(tmp_path)
    base = Config.fromfile(os.path.join(FMNIST, 'mmae_fmnist.py'))
    cfg.train_dataloader.dataset.pipeline = base.train_pipeline
    runner = Runner.from_cfg(cfg)
    with pytest.raises(ValueError) as info:
        runner.train()
    message = str(info.value)
    for words in ('OnlineProbeHook', 'training dataset', 'no gt_label',
                  "dict(type='PackInputs')"):
        assert words in message, message
    assert runner.iter == 0


def test_unknown_branch_module_is_refused_before_training(tmp_path):
    runner = Runner.from_cfg(
        probe_cfg(tmp_path, branch=dict(module='encoder', pool='cls')))
    with pytest.raises(ValueError) as info:
        runner.train()
    message = str(info.value)
    for words in ('OnlineProbeHook', "branch module 'encoder'", 'MMAE',
                  'backbone'):
        assert words in message, message
    assert runner.iter == 0


def test_missing_heldout_split_is_refused_before_training(tmp_path):
    cfg = probe_cfg(tmp_path)
    cfg.custom_hooks[0].val_dataloader = None
    runner = Runner.from_cfg(cfg)
    with pytest.raises(
            ValueError,
            match='val_dataloader=None and the runner '
            'has no val_dataloader'):
        runner.train()
    assert runner.iter == 0


@pytest.mark.parametrize('config,expected', [
    ('mae_fmnist.py', dict(module='backbone', pool='cls')),
    ('mmae_fmnist.py', dict(module='backbone', pool='cls')),
    ('simclr_fmnist.py', dict(module='backbone', call=0, rows='even')),
    ('byol_fmnist.py', dict(module='backbone', call=0, rows='all')),
])
def test_default_branch_is_the_encoder_feature(config, expected):
    """M-MAE: the encoder, not the regulariser's input; Siamese methods:
    the backbone call and rows of their first projection."""
    model = MODELS.build(Config.fromfile(os.path.join(FMNIST, config)).model)
    branch = default_probe_branch(model, None)
    assert {k: branch[k] for k in expected} == expected


# --------------------------------------------------------------------------
# 2 processes (gloo, CPU): DDP and FSDP
# --------------------------------------------------------------------------
TWO_RANK_CONFIG = """_base_ = [{base!r}]
custom_imports = dict(
    imports=['mmae_plugin.registration', 'online_probe_rank_dump'],
    allow_failed_imports=False)
custom_hooks = [
    dict(type='OnlineProbeHook', val_dataloader={heldout!r},
         train_features={features!r}),
    dict(type='DumpOnlineProbe'),
]
default_hooks = dict(checkpoint=None)
{extra}
"""


def fsdp_strategy() -> str:
    """The FSDP recipe's strategy on the CPU (as tests/test_tools_fsdp.py):
    the images cast to the bfloat16 policy at the root (no autocast)."""
    strategy = Config.fromfile(
        os.path.join(REPO, 'configs', 'mmae_vit-large_200e_fsdp.py')).strategy
    strategy.model_wrapper.device_id = 'cpu'
    strategy.model_wrapper.mixed_precision.cast_root_forward_inputs = True
    return (f"runner_type = 'MMAEFlexibleRunner'\n"
            f'strategy = {strategy.to_dict()!r}')


def two_rank_run(tmp_path, env, features: str, extra: str = '') -> list:
    """2 epochs of 2 iterations (2 ranks x 8 images): each rank's dump and
    the scalars rank 0 wrote."""
    config = tmp_path / 'two_ranks.py'
    config.write_text(
        TWO_RANK_CONFIG.format(
            base=CONFIG,
            heldout=heldout(Config.fromfile(CONFIG)).to_dict(),
            features=features,
            extra=extra))
    work_dir = tmp_path / 'work'
    env = dict(env, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    env['PYTHONPATH'] = os.pathsep.join(
        [REPO, os.path.join(REPO, 'tests'),
         env.get('PYTHONPATH', '')])
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_addr', '127.0.0.1', '--master_port', env['MASTER_PORT'],
        os.path.join(REPO, 'tools', 'train.py'),
        str(config), '--launcher', 'pytorch', '--work-dir',
        str(work_dir), '--cfg-options', 'train_dataloader.batch_size=8',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'train_dataloader.dataset.indices=32', 'train_cfg.max_epochs=2',
        'default_hooks.logger.interval=1'
    ]
    result = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=420)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    dumps = []
    for rank in (0, 1):
        with open(work_dir / f'online_probe_rank{rank}.json') as handle:
            dumps.append(json.load(handle))
    return dumps, read_scalars(work_dir)


def assert_ranks_agree(dumps: list, scalars: list, wrapper: str,
                       heldout_rows: int) -> None:
    """Both ranks: the same accuracies each epoch and the same probe, each
    having encoded ``heldout_rows`` of the 40 held-out images."""
    zero, one = dumps
    assert zero['heldout_rows'] == one['heldout_rows'] == heldout_rows
    assert zero['model'] == one['model'] == wrapper
    assert [row['epoch'] for row in zero['history']] == [1, 2]
    assert zero['history'] == one['history']
    assert zero['weight'] == one['weight'] and zero['bias'] == one['bias']
    assert zero['weight_dtype'] == 'torch.float32'
    assert zero['memory_rows'] == 64  # 2 epochs x 2 x (2 ranks x 8)
    logged = [r for r in scalars if KEYS[0] in r]
    assert [{k: r[k]
             for k in KEYS} for r in logged] == [{k: row[k]
                                                  for k in KEYS}
                                                 for row in zero['history']]


def test_two_processes_log_the_same_accuracy(tmp_path, cpu_dist_env):
    """DDP on 2 gloo ranks: each rank trains the probe on the gathered
    global batch and scores half the held-out split, so the probes and the
    logged accuracies (counts summed over the ranks) are equal."""
    assert_ranks_agree(*two_rank_run(tmp_path, cpu_dist_env, 'tapped'),
                       'MMDistributedDataParallel', HELDOUT_IMAGES // 2)


@pytest.mark.skipif(
    os.environ.get('MMAE_TEST_LONG') != '1',
    reason='about 30 s of 2-process training: MMAE_TEST_LONG=1')
def test_fsdp_two_processes_train_and_log(tmp_path, cpu_dist_env):
    """MMAEFlexibleRunner with the FSDP recipe's strategy on 2 gloo ranks,
    ``train_features='eval'``: the eval-mode forward of every training
    batch and the held-out pass run through the FSDP root (full
    parameters), between FSDP training steps; every rank scores the whole
    held-out split (FSDP's forward is collective)."""
    assert_ranks_agree(
        *two_rank_run(tmp_path, cpu_dist_env, 'eval', extra=fsdp_strategy()),
        'MMFullyShardedDataParallel', HELDOUT_IMAGES)


@HOOKS.register_module(force=True)
class StopAfterFirstEpoch(Hook):
    """Ends the run after epoch 1 and its checkpoint, as a kill would."""
    priority = 'LOWEST'

    def after_train_epoch(self, runner) -> None:
        if runner.epoch == 0:
            raise KeyboardInterrupt('stopped after epoch 1')


def checkpointed_cfg(work_dir, resume: bool = False) -> Config:
    """2 epochs of 2 iterations, a checkpoint after each epoch, random draws
    from the training position (``ReseedHook``: a resumed run draws what
    the run never stopped drew)."""
    cfg = probe_cfg(work_dir)
    cfg.custom_hooks.insert(0, dict(type='ReseedHook'))
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1)
    cfg.resume = resume
    return cfg


def last_accuracies(work_dir) -> list:
    """The accuracies the newest log of ``work_dir`` logged last."""
    path = sorted(
        glob.glob(
            os.path.join(str(work_dir), '*', 'vis_data', 'scalars.json')))[-1]
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [row[key] for row in rows[-1:] for key in KEYS if key in row]


def test_a_resumed_run_continues_the_probe(tmp_path):
    """Stopped after epoch 1 and resumed: the probe, its optimizer, the kNN
    memory and the epoch-2 accuracies are those of the run never stopped;
    loading the same checkpoint's weights (``load_from``) starts a new
    probe."""
    whole = Runner.from_cfg(checkpointed_cfg(tmp_path / 'whole'))
    whole.train()
    cfg = checkpointed_cfg(tmp_path / 'resumed')
    cfg.custom_hooks.append(dict(type='StopAfterFirstEpoch'))
    with pytest.raises(KeyboardInterrupt):
        Runner.from_cfg(cfg).train()
    saved = torch.load(tmp_path / 'resumed' / 'epoch_1.pth', weights_only=True)
    assert set(saved['online_probes']) == {'online_probe'}
    resumed = Runner.from_cfg(
        checkpointed_cfg(tmp_path / 'resumed', resume=True))
    resumed.train()
    ours, theirs = the_hook(resumed), the_hook(whole)
    for a, b in zip(ours.probe.state_dict().values(),
                    theirs.probe.state_dict().values()):
        assert torch.equal(a, b)
    assert ours.probe_optimizer.state_dict()['state'][0]['step'] == \
        theirs.probe_optimizer.state_dict()['state'][0]['step'] == 4
    assert torch.equal(ours.memory.bank()[0], theirs.memory.bank()[0])
    last = [last_accuracies(tmp_path / name) for name in ('whole', 'resumed')]
    assert last[0] == last[1] and len(last[0]) == 2
    cfg = probe_cfg(tmp_path / 'loaded')
    cfg.load_from = str(tmp_path / 'resumed' / 'epoch_1.pth')
    loaded = Runner.from_cfg(cfg)
    loaded.train()
    assert the_hook(loaded).probe_optimizer.state_dict(
    )['state'][0]['step'] == 4  # 2 epochs of 2 steps from a new probe
