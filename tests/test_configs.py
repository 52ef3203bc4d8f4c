"""Every shipped config loads and builds its model."""
import glob
import os

import pytest
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401

CONFIG_DIR = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), 'configs')
CONFIGS = sorted(
    os.path.relpath(path, CONFIG_DIR)
    for path in glob.glob(f'{CONFIG_DIR}/**/*.py', recursive=True)
    # Folders and files named `_*` (`_base_/`, fragments) are not runnable.
    if not any(
        part.startswith('_')
        for part in os.path.relpath(path, CONFIG_DIR).split(os.sep)))


def test_configs_are_found():
    assert 'mmae_vit-base_200e.py' in CONFIGS
    assert 'fashion_mnist/mmae_fmnist.py' in CONFIGS


@pytest.mark.parametrize('name', CONFIGS)
def test_config_builds_its_model(name):
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, name))
    # The module that registers in every case (see mmae_plugin/__init__.py).
    assert 'mmae_plugin.registration' in cfg.custom_imports['imports']
    model = MODELS.build(cfg.model)
    assert sum(p.numel() for p in model.parameters()) > 0
    if cfg.get('train_dataloader') is not None:
        assert_supports_auto_scale_lr(cfg)


def assert_supports_auto_scale_lr(cfg):
    """``--auto-scale-lr`` reads ``auto_scale_lr.base_batch_size``."""
    base = cfg.get('auto_scale_lr', {}).get('base_batch_size')
    assert isinstance(base, int) and base > 0, base
    # The recipe's total batch is a whole number of per-process batches
    # (8 GPUs for ImageNet, 1 process on CPU).
    assert base % cfg.train_dataloader.batch_size == 0


def paper_recipe(name):
    return Config.fromfile(os.path.join(CONFIG_DIR, name))


@pytest.mark.parametrize('name,mu,arch',
                         [('mmae_vit-base_200e.py', 1.0, 'b'),
                          ('mmae_vit-large_200e.py', 3.0, 'l')])
def test_mmae_paper_recipe(name, mu, arch):
    cfg = paper_recipe(name)
    reg = cfg.model.regularizer
    assert (cfg.model.type, cfg.model.backbone.arch) == ('MMAE', arch)
    assert (reg.type, reg.mu, reg.form, reg.gather) == ('TCRLoss', mu,
                                                        'reference', 'global')
    assert reg.loss_weight == pytest.approx(0.01 / 8)
    assert cfg.model.backbone.mask_ratio == 0.75
    assert cfg.train_cfg.max_epochs == 200
    assert cfg.train_dataloader.batch_size * 8 == 1024
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(1.5e-4 * 4)
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.05
    warmup, cosine = cfg.param_scheduler
    assert (warmup.begin, warmup.end) == (0, 40)
    assert (cosine.begin, cosine.end, cosine.T_max) == (40, 200, 160)


def test_linear_probe_reads_pretrained_backbone():
    cfg = paper_recipe('linear_vit-base_90e.py')
    init = cfg.model.backbone.init_cfg
    assert (init.type, init.prefix) == ('Pretrained', 'backbone.')
    assert cfg.train_dataloader.batch_size * 8 == 8192
