"""The Siamese configs of issue 3 load, build and fail clearly without data."""
import os

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmpretrain.registry import DATASETS, MODELS

import mmae_plugin.registration  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ['simclr', 'byol', 'barlowtwins']
CONFIGS = [f'configs/fashion_mnist/{m}_fmnist.py'
           for m in METHODS + ['spectral']] + \
    [f'configs/cifar10/{m}_cifar10.py' for m in METHODS + ['spectral']]


@pytest.mark.parametrize('path', CONFIGS)
def test_config_loads_plugin_and_hook(path):
    cfg = Config.fromfile(os.path.join(REPO, path))
    assert cfg.custom_imports == dict(
        imports=['mmae_plugin.registration'], allow_failed_imports=False)
    assert cfg.default_scope == 'mmpretrain'
    hooks = [h for h in cfg.custom_hooks if h['type'] == 'MatrixInfoHook']
    assert len(hooks) == 1
    logger_interval = cfg.default_hooks.logger.interval
    assert hooks[0]['interval'] % logger_interval == 0


@pytest.mark.parametrize('method', METHODS + ['spectral'])
def test_cifar10_model_trains_one_step_on_32px_views(method):
    cfg = Config.fromfile(
        os.path.join(REPO, f'configs/cifar10/'
                     f'{method}_cifar10.py'))
    init_default_scope('mmpretrain')
    model = MODELS.build(cfg.model)
    model.train()
    # Single process: what the runner does to SyncBN layers.
    from mmengine.model import revert_sync_batchnorm
    model = revert_sync_batchnorm(model)
    views = [
        torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8)
        for _ in range(2)
    ]
    data = model.data_preprocessor(
        dict(inputs=views, data_samples=None), training=True)
    losses = model.loss(**data)
    assert torch.isfinite(sum(losses.values()))


def test_cifar10_without_data_fails_with_the_folder_in_the_message(tmp_path):
    cfg = Config.fromfile(
        os.path.join(REPO, 'configs/cifar10/simclr_cifar10.py'))
    init_default_scope('mmpretrain')
    dataset_cfg = cfg.train_dataloader.dataset
    dataset_cfg.data_root = str(tmp_path / 'no_cifar_here')
    with pytest.raises(
            RuntimeError,
            match='Cannot find CIFAR10 dataset in '
            '.*no_cifar_here'):
        DATASETS.build(dataset_cfg)


@pytest.mark.parametrize('method', METHODS + ['spectral'])
def test_cifar10_heldout_covariance_is_not_rank_limited(method):
    """The held-out batches hold at least d images for every method's
    projector width d (docs/siamese_controls.md)."""
    cfg = Config.fromfile(
        os.path.join(REPO, f'configs/cifar10/'
                     f'{method}_cifar10.py'))
    hook, = [h for h in cfg.custom_hooks if h['type'] == 'MatrixInfoHook']
    assert hook['heldout']['dataset']['split'] == 'test'
    assert hook['heldout']['batch_size'] >= cfg.model.neck.out_channels


def test_cifar10_knn_evaluation_reads_the_trained_backbone():
    """The kNN config's encoder has exactly the trained configs' backbone
    parameters and buffers, so their checkpoints load into it."""
    init_default_scope('mmpretrain')
    knn = MODELS.build(
        Config.fromfile(
            os.path.join(REPO, 'configs/cifar10/knn_cifar10_resnet.py')).model)
    expected = {k: v.shape for k, v in knn.image_encoder.state_dict().items()}
    for method in METHODS + ['spectral']:
        cfg = Config.fromfile(
            os.path.join(REPO, f'configs/cifar10/'
                         f'{method}_cifar10.py'))
        trained = MODELS.build(cfg.model).backbone.state_dict()
        assert {k: v.shape for k, v in trained.items()} == expected, method
