"""Bad input, table-driven: one row per kind of bad input and per parameter.

Every row of ``REFUSED`` builds a component from its config (or calls a
toolbox function) with one bad value and expects an error of the given type
whose message names the parameter and the bad value. Every row of
``HANDLED`` is an input that is not an error but an edge case the component
deals with (documented in its docstring), and checks the outcome.
"""
import gzip
import logging
import math
import os
from typing import Callable, NamedTuple, Tuple, Type, Union

import pytest
import torch
from mmengine.logging import MMLogger
from mmpretrain.registry import DATASETS, HOOKS, MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.datasets import DEFAULT_FASHION_MNIST_ROOT
from mmae_plugin.datasets.fashion_mnist import CorruptDataError
# yapf: disable (isort wraps this import; yapf would rewrap it)
from mmae_plugin.matrix_info import (FactoredPSD, effective_rank,
                                     hadamard_product, matrix_entropy,
                                     matrix_joint_entropy,
                                     matrix_js_divergence,
                                     matrix_kl_divergence,
                                     matrix_mutual_information,
                                     normalized_covariance, normalized_gram,
                                     rankme, spectrum_js_divergence,
                                     total_coding_rate)
from mmae_plugin.matrix_info.coding_rate import unit_rows
from mmae_plugin.models import TCRLoss, UniformityLoss

# yapf: enable

MAE_PARTS = dict(
    backbone=dict(
        type='MAEViT',
        arch=dict(
            embed_dims=16, num_layers=1, num_heads=2, feedforward_channels=32),
        img_size=8,
        patch_size=4,
        patch_cfg=dict(in_channels=1)),
    neck=dict(
        type='MAEPretrainDecoder',
        num_patches=4,
        patch_size=4,
        in_chans=1,
        embed_dim=16,
        decoder_embed_dim=8,
        decoder_depth=1,
        decoder_num_heads=2),
    head=dict(
        type='MAEPretrainHead',
        norm_pix=True,
        patch_size=4,
        in_channels=1,
        loss=dict(type='PixelReconstructionLoss', criterion='L2')))
NAN, INF = math.nan, math.inf
EYE = torch.eye(3)
Z = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
Errors = Union[Type[Exception], Tuple[Type[Exception], ...]]


class Row(NamedTuple):
    component: str  # class or function the row belongs to
    param: str  # the parameter the message must name
    value: str  # text of the bad value the message must contain
    error: Errors
    call: Callable


def tcr(**kwargs):
    return lambda: MODELS.build(dict(type='TCRLoss', **kwargs))


def unif(**kwargs):
    return lambda: MODELS.build(dict(type='UniformityLoss', **kwargs))


def mmae(**kwargs):

    def build():
        cfg = dict(type='MMAE', **MAE_PARTS)
        cfg.update(kwargs)
        return MODELS.build(cfg)

    return build


def mmae_backbone(**kwargs):
    backbone = dict(MAE_PARTS['backbone'], **kwargs.pop('backbone'))
    return mmae(backbone=backbone, **kwargs)


def fmnist(**kwargs):
    return lambda: DATASETS.build(
        dict(type='GzipFashionMNIST', split='test', **kwargs))


def hook(type_, **kwargs):
    return lambda: HOOKS.build(dict(type=type_, **kwargs))


def forward(loss, z):
    """Run the regulariser, then ask for the error behind a skipped term.

    The forward pass itself never raises on values (it reads nothing on the
    host): its ``skip_code`` records why a term was dropped.
    """

    def call():
        loss(z)
        loss.raise_if_skipped()

    return call


ALL_ZERO_ROW = torch.cat([Z[:3], torch.zeros(1, 4)])
NAN_Z = Z.clone()
NAN_Z[2, 3] = NAN

REFUSED = [
    # ---------------------------------------------------------------- TCRLoss
    Row('TCRLoss', 'mu', 'True', TypeError, tcr(mu=True)),
    Row('TCRLoss', 'mu', "'1'", TypeError, tcr(mu='1')),
    Row('TCRLoss', 'mu', '0', ValueError, tcr(mu=0)),
    Row('TCRLoss', 'mu', '-1.0', ValueError, tcr(mu=-1.0)),
    Row('TCRLoss', 'mu', 'nan', ValueError, tcr(mu=NAN)),
    Row('TCRLoss', 'mu', 'inf', ValueError, tcr(mu=INF)),
    Row('TCRLoss', 'form', "'papr'", ValueError, tcr(form='papr')),
    Row('TCRLoss', 'form', 'None', ValueError, tcr(form=None)),
    Row('TCRLoss', 'centering', "'no'", TypeError, tcr(centering='no')),
    Row('TCRLoss', 'centering', '1', TypeError, tcr(centering=1)),
    Row('TCRLoss', 'gather', "'all'", ValueError, tcr(gather='all')),
    Row('TCRLoss', 'gather', "['global']", ValueError, tcr(gather=['global'])),
    Row('TCRLoss', 'loss_weight', 'True', TypeError, tcr(loss_weight=True)),
    Row('TCRLoss', 'loss_weight', "'0.1'", TypeError, tcr(loss_weight='0.1')),
    Row('TCRLoss', 'loss_weight', '-0.01', ValueError, tcr(loss_weight=-0.01)),
    Row('TCRLoss', 'loss_weight', 'nan', ValueError, tcr(loss_weight=NAN)),
    Row('TCRLoss', 'loss_weight', '1e+308', ValueError,
        tcr(loss_weight=1e308)),
    Row('TCRLoss', 'init_cfg', "'kaiming'", TypeError,
        tcr(init_cfg='kaiming')),
    Row('TCRLoss', 'init_cfg', '[]', TypeError, tcr(init_cfg=[])),
    Row('TCRLoss', 'gather_capacity', '0', ValueError, tcr(gather_capacity=0)),
    Row('TCRLoss', 'gather_capacity', 'True', TypeError,
        tcr(gather_capacity=True)),
    Row('TCRLoss', 'init_cfg', "{'layer': 'Linear'}", TypeError,
        tcr(init_cfg=dict(layer='Linear'))),
    Row('TCRLoss', 'features', 'non-finite', ValueError,
        forward(TCRLoss(), NAN_Z)),
    Row('TCRLoss', 'features', '(4, 2, 3)', ValueError,
        forward(TCRLoss(), torch.randn(4, 2, 3))),
    Row('TCRLoss', 'features', 'torch.int64', TypeError,
        forward(TCRLoss(), torch.ones(4, 3, dtype=torch.int64))),
    Row('TCRLoss', 'features', 'list', TypeError,
        forward(TCRLoss(), [[1.0, 2.0], [3.0, 4.0]])),
    Row('TCRLoss', 'features', 'all-zero row', ValueError,
        forward(TCRLoss(), ALL_ZERO_ROW)),
    # A weight that is finite but makes the float32 loss overflow.
    Row('TCRLoss', 'loss_weight', '3e+38', ValueError,
        forward(TCRLoss(loss_weight=3e38, gather='local'), Z)),
    Row('TCRLoss', 'compute_dtype', "'float16'", ValueError,
        tcr(compute_dtype='float16')),
    Row('TCRLoss', 'compute_dtype', 'torch.bfloat16', ValueError,
        tcr(compute_dtype=torch.bfloat16)),
    Row('TCRLoss', 'compute_dtype', "'double'", ValueError,
        tcr(compute_dtype='double')),
    Row('MMAE', 'compute_dtype', "'fp32'", ValueError,
        mmae(regularizer=dict(type='TCRLoss', compute_dtype='fp32'))),
    # --------------------------------------------------------- UniformityLoss
    Row('UniformityLoss', 'compute_dtype', 'None', ValueError,
        unif(compute_dtype=None)),
    Row('UniformityLoss', 'gather', "'global '", ValueError,
        unif(gather='global ')),
    Row('UniformityLoss', 'loss_weight', 'True', TypeError,
        unif(loss_weight=True)),
    Row('UniformityLoss', 'loss_weight', '-1', ValueError,
        unif(loss_weight=-1)),
    Row('UniformityLoss', 'loss_weight', 'inf', ValueError,
        unif(loss_weight=INF)),
    Row('UniformityLoss', 'init_cfg', '3', TypeError, unif(init_cfg=3)),
    Row('UniformityLoss', 'gather_capacity', '2.5', TypeError,
        unif(gather_capacity=2.5)),
    Row('UniformityLoss', 'features', 'all-zero row', ValueError,
        forward(UniformityLoss(), ALL_ZERO_ROW)),
    Row('UniformityLoss', 'features', 'non-finite', ValueError,
        forward(UniformityLoss(), NAN_Z)),
    # ------------------------------------------------------------------- MMAE
    Row('MMAE', 'regularizer', 'CrossEntropyLoss', TypeError,
        mmae(regularizer=dict(type='CrossEntropyLoss'))),
    Row('MMAE', 'regularizer', '[]', TypeError, mmae(regularizer=[])),
    Row('MMAE', 'regularizer', "'TCRLoss'", TypeError,
        mmae(regularizer='TCRLoss')),
    Row('MMAE', 'mu', '-2', ValueError,
        mmae(regularizer=dict(type='TCRLoss', mu=-2))),
    Row('MMAE', 'feature', "'avg'", ValueError, mmae(feature='avg')),
    Row('MMAE', 'feature', 'None', ValueError, mmae(feature=None)),
    Row('MMAE', 'final_norm_twice', "'yes'", TypeError,
        mmae(final_norm_twice='yes')),
    Row('MMAE', 'init_cfg', "'Pretrained'", TypeError,
        mmae(init_cfg='Pretrained')),
    Row('MMAE', 'backbone', '[]', TypeError, mmae(backbone=[])),
    Row('MMAE', 'neck', 'None', TypeError, mmae(neck=None)),
    Row('MMAE', 'head', "'MAEPretrainHead'", TypeError,
        mmae(head='MAEPretrainHead')),
    # Impossible combinations, both settings named.
    Row('MMAE', "feature='mean'", 'mask_ratio=1.0', ValueError,
        mmae_backbone(feature='mean', backbone=dict(mask_ratio=1.0))),
    Row('MMAE', 'final_norm_twice=True', 'final_norm is False', ValueError,
        mmae_backbone(final_norm_twice=True, backbone=dict(final_norm=False))),
    # mmpretrain's MAEViT takes any mask_ratio; MMAE refuses at build the
    # ones that mask no patch (0 / 0 loss), all of them, or more than all.
    Row('MMAE', 'backbone.mask_ratio', 'got 1.0', ValueError,
        mmae_backbone(backbone=dict(mask_ratio=1.0))),
    Row('MMAE', 'backbone.mask_ratio', 'got -0.1', ValueError,
        mmae_backbone(backbone=dict(mask_ratio=-0.1))),
    Row('MMAE', 'backbone.mask_ratio', 'got 0.0', ValueError,
        mmae_backbone(backbone=dict(mask_ratio=0.0))),
    Row('MMAE', 'backbone.mask_ratio', "'0.75'", TypeError,
        mmae_backbone(backbone=dict(mask_ratio='0.75'))),
    # ------------------------------------------------------- GzipFashionMNIST
    Row('GzipFashionMNIST', 'download', "'no'", TypeError,
        fmnist(download='no')),
    Row('GzipFashionMNIST', 'download', '1', TypeError, fmnist(download=1)),
    Row('GzipFashionMNIST', 'split', "'val'", ValueError,
        lambda: DATASETS.build(dict(type='GzipFashionMNIST', split='val'))),
    Row('GzipFashionMNIST', 'data_root', '3', TypeError, fmnist(data_root=3)),
    Row('GzipFashionMNIST', 'indices', '-3', ValueError, fmnist(indices=-3)),
    # mmengine: an int is "the first n samples", so 0 selects none.
    Row('GzipFashionMNIST', 'indices', '=0 selects no image', ValueError,
        fmnist(indices=0)),
    Row('GzipFashionMNIST', 'indices', '[] selects no image', ValueError,
        fmnist(indices=[])),
    Row('GzipFashionMNIST', 'indices', 'True', TypeError,
        fmnist(indices=True)),
    Row('GzipFashionMNIST', 'indices', '2.0', TypeError, fmnist(indices=2.0)),
    Row('GzipFashionMNIST', 'indices[1]', '-1', ValueError,
        fmnist(indices=[0, -1])),
    Row('GzipFashionMNIST', 'indices', '1000000', ValueError,
        fmnist(indices=10**6)),
    Row('GzipFashionMNIST', 'indices', '[10000]', ValueError,
        fmnist(indices=[5, 10000])),
    # --------------------------------------------------------------- hooks
    Row('ReseedHook', 'reseed_pipeline', "'no'", TypeError,
        hook('ReseedHook', reseed_pipeline='no')),
    Row('AttentionLocalityHook', 'interval', 'True', TypeError,
        hook('AttentionLocalityHook', interval=True)),
    Row('AttentionLocalityHook', 'interval', '0', ValueError,
        hook('AttentionLocalityHook', interval=0)),
    Row('AttentionLocalityHook', 'interval', '1.5', TypeError,
        hook('AttentionLocalityHook', interval=1.5)),
    Row('AttentionLocalityHook', 'by_epoch', "'no'", TypeError,
        hook('AttentionLocalityHook', by_epoch='no')),
    Row('AttentionLocalityHook', 'num_probe_images', '0', ValueError,
        hook('AttentionLocalityHook', num_probe_images=0)),
    Row('AttentionLocalityHook', 'probe_at_start', '1', TypeError,
        hook('AttentionLocalityHook', probe_at_start=1)),
    Row('AttentionLocalityHook', 'probe_seed', '-1', ValueError,
        hook('AttentionLocalityHook', probe_seed=-1)),
    Row('AttentionLocalityHook', 'probe_seed', '4294967296', ValueError,
        hook('AttentionLocalityHook', probe_seed=2**32)),
    Row('AttentionLocalityHook', 'probe_view', 'False', TypeError,
        hook('AttentionLocalityHook', probe_view=False)),
    Row('AttentionLocalityHook', 'probe_pipeline', "'PackInputs'", TypeError,
        hook('AttentionLocalityHook', probe_pipeline='PackInputs')),
    Row('AttentionLocalityHook', 'probe_pipeline[0]', '{}', TypeError,
        hook('AttentionLocalityHook', probe_pipeline=[{}])),
    Row('MatrixInfoHook', 'interval', 'True', TypeError,
        hook('MatrixInfoHook', interval=True)),
    Row('MatrixInfoHook', 'kernel', "'cov'", ValueError,
        hook('MatrixInfoHook', kernel='cov')),
    Row('MatrixInfoHook', 'alpha', '1e+308', ValueError,
        hook('MatrixInfoHook', alpha=1e308)),
    Row('MatrixInfoHook', 'prefix', 'None', TypeError,
        hook('MatrixInfoHook', prefix=None)),
    Row('MatrixInfoHook', 'mu', 'True', TypeError,
        hook('MatrixInfoHook', tcr='paper', mu=True)),
    Row('MatrixInfoHook', 'centering', "'no'", TypeError,
        hook('MatrixInfoHook', tcr='paper', centering='no')),
    # ------------------------------------------------------ matrix toolbox
    Row('total_coding_rate', 'dtype', 'torch.int64', ValueError,
        lambda: total_coding_rate(Z, dtype=torch.int64)),
    Row('total_coding_rate', 'dtype', 'torch.float16', ValueError,
        lambda: total_coding_rate(Z, dtype=torch.float16)),
    Row('total_coding_rate', 'mu', 'True', TypeError,
        lambda: total_coding_rate(Z, mu=True)),
    Row('total_coding_rate', 'mu', '0', ValueError,
        lambda: total_coding_rate(Z, mu=0)),
    Row('total_coding_rate', 'z', 'torch.bool', TypeError,
        lambda: total_coding_rate(Z > 0)),
    Row('total_coding_rate', 'z', 'shape (0, 4)', ValueError,
        lambda: total_coding_rate(torch.zeros(0, 4))),
    Row('total_coding_rate', 'z', 'e+200', ValueError,
        lambda: total_coding_rate(Z.double() * 1e200)),
    Row('unit_rows', 'z', 'all-zero row(s) [3]', ValueError,
        lambda: unit_rows(ALL_ZERO_ROW)),
    Row('matrix_entropy', 'alpha', 'True', TypeError,
        lambda: matrix_entropy(EYE, alpha=True)),
    Row('matrix_entropy', 'alpha', "'2'", TypeError,
        lambda: matrix_entropy(EYE, alpha='2')),
    Row('matrix_entropy', 'alpha', '-1', ValueError,
        lambda: matrix_entropy(EYE, alpha=-1)),
    Row('matrix_entropy', 'alpha', 'nan', ValueError,
        lambda: matrix_entropy(EYE, alpha=NAN)),
    Row('matrix_entropy', 'K', '(3, 4)', ValueError,
        lambda: matrix_entropy(torch.ones(3, 4))),
    Row('matrix_entropy', 'K', 'torch.complex64', TypeError,
        lambda: matrix_entropy(EYE.to(torch.complex64))),
    Row('matrix_entropy', 'K', 'positive semi-definite', ValueError,
        lambda: matrix_entropy(-EYE)),
    Row('matrix_entropy', 'dtype', 'torch.int64', ValueError,
        lambda: matrix_entropy(EYE, dtype=torch.int64)),
    Row('matrix_joint_entropy', 'alpha', 'True', TypeError,
        lambda: matrix_joint_entropy(EYE, EYE, alpha=True)),
    Row('matrix_joint_entropy', 'K1 and K2', '3 x 3 and 4 x 4', ValueError,
        lambda: matrix_joint_entropy(EYE, torch.eye(4))),
    Row('matrix_mutual_information', 'alpha', "'1'", TypeError,
        lambda: matrix_mutual_information(EYE, EYE, alpha='1')),
    Row('matrix_mutual_information', 'K2', 'symmetric', ValueError,
        lambda: matrix_mutual_information(EYE, torch.triu(torch.ones(3, 3)))),
    Row('hadamard_product', 'K1 and K2', '3 x 3 and 4 x 4', ValueError,
        lambda: hadamard_product(EYE, torch.eye(4))),
    Row('matrix_kl_divergence', 'eps', 'True', TypeError,
        lambda: matrix_kl_divergence(EYE, EYE, eps=True)),
    Row('matrix_kl_divergence', 'eps', '-0.001', ValueError,
        lambda: matrix_kl_divergence(EYE, EYE, eps=-1e-3)),
    Row('matrix_js_divergence', 'dtype', 'torch.float16', ValueError,
        lambda: matrix_js_divergence(EYE, EYE, dtype=torch.float16)),
    Row('spectrum_js_divergence', 'K1 and K2', '3 x 3 and 4 x 4', ValueError,
        lambda: spectrum_js_divergence(EYE, torch.eye(4))),
    Row('effective_rank', 'x', '(2, 2, 2)', ValueError,
        lambda: effective_rank(torch.ones(2, 2, 2))),
    Row('effective_rank', 'dtype', 'torch.int64', ValueError,
        lambda: effective_rank(Z, dtype=torch.int64)),
    Row('rankme', 'eps', 'True', TypeError, lambda: rankme(Z, eps=True)),
    Row('rankme', 'eps', 'nan', ValueError, lambda: rankme(Z, eps=NAN)),
    Row('normalized_covariance', 'factored', "'no'", TypeError,
        lambda: normalized_covariance(Z, factored='no')),
    Row('normalized_covariance', 'z', '1 sample', ValueError,
        lambda: normalized_covariance(Z[:1])),
    Row('normalized_gram', 'factored', '1', TypeError,
        lambda: normalized_gram(Z, factored=1)),
    Row('FactoredPSD', 'factor', '(4,)', ValueError,
        lambda: FactoredPSD(torch.ones(4))),
    Row('FactoredPSD', 'factor', 'torch.int64', TypeError,
        lambda: FactoredPSD(torch.ones(4, 2, dtype=torch.int64))),
]


def row_id(row: Row) -> str:
    return f'{row.component}-{row.param}={row.value}'


@pytest.mark.parametrize('row', REFUSED, ids=row_id)
def test_bad_input_is_refused_naming_parameter_and_value(row):
    with pytest.raises(row.error) as info:
        row.call()
    message = str(info.value)
    assert row.param in message, message
    assert row.value in message, message


# ------------------------------------------------------------- corrupt files
def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _labels() -> bytes:
    with gzip.open(
            f'{DEFAULT_FASHION_MNIST_ROOT}/t10k-labels-idx1-ubyte.gz') as f:
        return f.read()


CORRUPT = {
    # file content -> what the message must say
    'empty file': (lambda raw: b'', 'the file is empty'),
    'truncated gzip': (lambda raw: _gz(raw)[:200], 'truncated gzip stream'),
    'not gzip': (lambda raw: b'hello, not gzip', 'not a gzip file'),
    'bad IDX magic': (lambda raw: _gz(b'\0\0\x08\x03' + raw[4:]),
                      'bad IDX magic number 0x00000803'),
    'short data': (lambda raw: _gz(raw[:-10]), 'announces shape (10000,)'),
    'short header': (lambda raw: _gz(raw[:6]), 'too short for the 8-byte'),
    'label out of range': (lambda raw: _gz(raw[:8] + b'\x0c' + raw[9:]),
                           'label(s) out of range (e.g. 12 at index 0)'),
}


@pytest.mark.parametrize('kind', CORRUPT)
def test_corrupt_data_file_is_named_with_the_problem(kind, tmp_path):
    make, problem = CORRUPT[kind]
    for name in os.listdir(DEFAULT_FASHION_MNIST_ROOT):
        os.symlink(f'{DEFAULT_FASHION_MNIST_ROOT}/{name}', tmp_path / name)
    bad = tmp_path / 't10k-labels-idx1-ubyte.gz'
    bad.unlink()
    bad.write_bytes(make(_labels()))
    with pytest.raises(CorruptDataError) as info:
        DATASETS.build(
            dict(
                type='GzipFashionMNIST', data_root=str(tmp_path),
                split='test'))
    assert str(bad) in str(info.value)
    assert problem in str(info.value)


# ------------------------------------------------------------------ handled
@pytest.mark.parametrize(
    'loss', [TCRLoss(), UniformityLoss()], ids=['TCRLoss', 'UniformityLoss'])
def test_batch_of_one_skips_the_term_with_a_warning(loss):
    z = torch.randn(1, 8, requires_grad=True)
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        value = loss(z)
    finally:
        logger.removeHandler(handler)
    assert value.item() == 0.0 and value.dtype == torch.float32
    value.backward()  # the zero keeps the graph: backward runs
    assert torch.equal(z.grad, torch.zeros_like(z))
    messages = [record.getMessage() for record in records]
    assert any('skipped for this step' in m and 'got 1' in m
               for m in messages), messages


@pytest.mark.parametrize('scale', [1e-20, 1e20])
def test_tiny_or_huge_features_give_the_scale_invariant_tcr(scale):
    loss = TCRLoss(gather='local', loss_weight=1.0)
    torch.testing.assert_close(loss(Z.double() * scale), loss(Z.double()))


def test_table_counts():
    """The numbers quoted in the issue note (one row per bad input)."""
    components = {row.component for row in REFUSED}
    assert len(REFUSED) >= 100 and len(components) >= 20
    assert len(CORRUPT) == 7


def test_last_batch_of_one_does_not_stop_training(repo_root, tmp_path):
    """17 images, batch 16, drop_last=False: the 2nd step has 1 image."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs/fashion_mnist/mmae_fmnist.py'))
    cfg.work_dir = str(tmp_path)
    cfg.train_cfg.max_epochs = 1
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1
    cfg.train_dataloader.update(
        batch_size=16,
        drop_last=False,
        num_workers=0,
        persistent_workers=False)
    cfg.train_dataloader.dataset.indices = 17
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 2
    last = runner.message_hub.get_scalar('train/loss_tcr').current()
    assert last == 0.0
    assert math.isfinite(runner.message_hub.get_scalar('train/loss').current())


# ------------------------------------------------- through tools/train.py
#: ``--cfg-options`` refused when the Runner builds the model or dataset:
#: option -> what the message must say (the parameter, the value and what
#: is allowed).
BAD_CFG_OPTIONS = {
    'model.backbone.mask_ratio=1.0':
    ('backbone.mask_ratio', 'got 1.0', 'a number in (0, 1)',
     'leaves at least one visible'),
    'model.backbone.mask_ratio=-0.1':
    ('backbone.mask_ratio', 'got -0.1', 'a number in (0, 1)',
     'masks at least one of the 49 patches'),
    'train_dataloader.dataset.indices=0':
    ('indices=0 selects no image', 'use a count >= 1'),
}


@pytest.mark.parametrize('option', BAD_CFG_OPTIONS)
def test_bad_cfg_option_is_refused_before_training(repo_root, tmp_path,
                                                   option):
    """The real tools/train.py stops at build time with the named error.

    Before, ``mask_ratio=1.0`` trained silently, ``-0.1`` stopped only as a
    divergence at iteration 1 and ``indices=0`` ended in mmengine's "need
    at least one array to concatenate".
    """
    import subprocess
    import sys
    work_dir = tmp_path / 'work'
    command = [
        sys.executable,
        os.path.join(repo_root, 'tools', 'train.py'),
        os.path.join(repo_root, 'configs', 'fashion_mnist', 'mmae_fmnist.py'),
        '--work-dir',
        str(work_dir),
        '--cfg-options',
        option,
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
    ]
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES='',
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore')
    result = subprocess.run(
        command,
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    for text in BAD_CFG_OPTIONS[option]:
        assert text in output, output[-3000:]
    assert 'Epoch(train)' not in output  # refused before any iteration
    assert 'need at least one array' not in output
    assert not list(work_dir.rglob('*.pth'))
