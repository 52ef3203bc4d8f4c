"""The CIFAR-10 Siamese configs through their real training pipeline.

CIFAR-10 is not on the test machines, so each config's
``train_dataloader.dataset.pipeline`` runs, unchanged, on synthetic images
handed over as mmpretrain's ``CIFAR10`` dataset hands over its own; the
config's collate function packs them and the config's model takes one
``train_step`` with the config's optimizer wrapper (a batch of 8 instead of
256). ``tests/test_matrix_info_configs.py`` covers loading, the missing-data
error and a loss on random views; this file adds the pipeline, its
``ColorJitter(hue=0.1)`` included (issue 46), and the optimizer step.
"""
import os
import pickle
from typing import Dict, List

import mmcv
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import Compose
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import FUNCTIONS, init_default_scope
from mmengine.runner import set_random_seed
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.compat import adjust_hue_overflow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ['simclr', 'byol', 'barlowtwins', 'spectral']
NUMPY2 = int(np.__version__.split('.')[0]) >= 2
BATCH = 8
SEED = 0


def load_config(method: str) -> Config:
    """The CIFAR-10 config of ``method``, with mmpretrain's default scope.

    Args:
        method: ``simclr``, ``byol``, ``barlowtwins`` or ``spectral``.

    Returns:
        The loaded config (its ``custom_imports`` ran).
    """
    cfg = Config.fromfile(
        os.path.join(REPO, 'configs', 'cifar10', f'{method}_cifar10.py'))
    init_default_scope(cfg.default_scope)
    return cfg


def cifar10_data_infos(count: int, seed: int) -> List[Dict]:
    """Synthetic data infos, as ``CIFAR10`` gives them to its pipeline.

    ``CIFAR10.load_data_list`` turns rows of 3,072 bytes into CHW arrays,
    then HWC RGB ``img`` with an int ``gt_label``; mmengine's dataset
    pickles each info and ``get_data_info`` unpickles it and adds
    ``sample_idx``.

    Args:
        count: Number of images.
        seed: Seed of their generator.

    Returns:
        One dict per image: ``img`` (32, 32, 3) uint8, ``gt_label``,
        ``sample_idx``.
    """
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (count, 3 * 32 * 32), dtype=np.uint8)
    images = rows.reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
    labels = rng.integers(0, 10, count)
    infos = []
    for index, (image, label) in enumerate(zip(images, labels)):
        info = dict(img=image, gt_label=int(label))
        info = pickle.loads(pickle.dumps(info, protocol=4))
        info['sample_idx'] = index
        infos.append(info)
    return infos


def packed_batch(cfg: Config, seed: int) -> Dict:
    """Run the config's training pipeline and collate function.

    Args:
        cfg: A CIFAR-10 config.
        seed: Seed of the images and of the pipeline's random draws.

    Returns:
        The batch the dataloader would yield.
    """
    pipeline = Compose(cfg.train_dataloader.dataset.pipeline)
    collate = FUNCTIONS.get(cfg.train_dataloader.collate_fn.type)
    set_random_seed(seed)
    return collate(
        [pipeline(info) for info in cifar10_data_infos(BATCH, seed)])


@pytest.mark.parametrize('method', METHODS)
def test_cifar10_pipeline_and_one_train_step(method):
    cfg = load_config(method)
    batch = packed_batch(cfg, SEED)
    views = batch['inputs']
    assert len(views) == 2
    for view in views:
        assert view.shape == (BATCH, 3, 32, 32) and view.dtype == torch.uint8
    assert not torch.equal(views[0], views[1])  # two random augmentations
    assert len(batch['data_samples']) == BATCH

    model = MODELS.build(cfg.model)
    # What the runner does to SyncBN layers in a single process.
    model = revert_sync_batchnorm(model)
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    before = {
        name: parameter.detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }
    log_vars = model.train_step(batch, optim_wrapper)

    assert torch.isfinite(log_vars['loss'])
    after = dict(model.named_parameters())
    assert all(torch.isfinite(after[name]).all() for name in before)
    changed = [
        name for name, value in before.items()
        if not torch.equal(value, after[name])
    ]
    assert any(name.startswith('backbone.') for name in changed)
    assert any(name.startswith('neck.') for name in changed)


@pytest.mark.skipif(not NUMPY2, reason='numpy < 2 casts without checking')
def test_cifar10_pipeline_fails_with_mmcvs_adjust_hue(monkeypatch):
    """The batch above meets mmcv's overflow without the plugin's fix, so
    the test exercises it (the four configs share this pipeline)."""
    cfg = load_config('simclr')
    monkeypatch.setattr(mmcv, 'adjust_hue',
                        adjust_hue_overflow.upstream_adjust_hue())
    with pytest.raises(OverflowError, match='out of bounds for uint8'):
        packed_batch(cfg, SEED)
