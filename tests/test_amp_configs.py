"""Mixed precision of the ViT recipes: bfloat16 chosen explicitly.

``AmpOptimWrapper`` with ``dtype=None`` autocasts to float16 on GPUs; the
ViT-B/L configs ask for bfloat16 (no overflow) through
``MixedPrecisionOptimWrapper`` with ``loss_scale='auto'``, which then builds
no loss scaler, and document float16 (with dynamic scaling) for GPUs
without bfloat16. The bfloat16 wrappers are built here on the CPU; the
float16 one is mmengine's ``AmpOptimWrapper``, which needs a GPU
(tests/test_cuda.py).
"""
import argparse
import glob
import os

import pytest
import torch
from conftest import ToyModel
from mmengine.config import Config, DictAction
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.optimizers.mixed_precision_wrapper import (
    MixedPrecisionOptimWrapper, needs_loss_scaler)

MIXED_PRECISION_TYPES = ('AmpOptimWrapper', 'MixedPrecisionOptimWrapper')

AMP_CONFIGS = ('mae_vit-base_200e.py', 'mmae_vit-base_200e.py',
               'mmae_vit-large_200e.py', 'mmae_vit-large_200e_fsdp.py',
               'umae_vit-base_200e.py', 'linear_vit-base_90e.py',
               'linear_vit-large_90e.py')


def amp_configs(repo_root):
    """Every top-level config whose optimizer wrapper autocasts."""
    found = []
    for path in sorted(glob.glob(os.path.join(repo_root, 'configs', '*.py'))):
        wrapper = Config.fromfile(path).get('optim_wrapper') or {}
        if wrapper.get('type') in MIXED_PRECISION_TYPES:
            found.append(os.path.basename(path))
    return found


def test_every_amp_config_is_listed(repo_root):
    assert tuple(amp_configs(repo_root)) == tuple(sorted(AMP_CONFIGS))


@pytest.mark.parametrize('name', AMP_CONFIGS)
def test_vit_config_autocasts_in_bfloat16(repo_root, name):
    cfg = Config.fromfile(os.path.join(repo_root, 'configs', name))
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    assert cfg.optim_wrapper.loss_scale == 'auto'
    assert getattr(torch, cfg.optim_wrapper.dtype) is torch.bfloat16
    assert cfg.optim_wrapper.dtype in AmpOptimWrapper.valid_dtypes


@pytest.mark.parametrize('name', AMP_CONFIGS)
def test_vit_config_builds_a_wrapper_without_loss_scaler(repo_root, name):
    """The recipe's own wrapper (constructor, paramwise settings, LARS or
    AdamW) on a small model: bfloat16 autocast, no GradScaler (so no
    found_inf sync per step)."""
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(os.path.join(repo_root, 'configs', name))
    wrapper = build_optim_wrapper(ToyModel(), cfg.optim_wrapper)
    assert isinstance(wrapper, MixedPrecisionOptimWrapper)
    assert wrapper.loss_scaler is None
    assert wrapper.cast_dtype is torch.bfloat16


@pytest.mark.parametrize('name', AMP_CONFIGS)
def test_documented_float16_fallback_overrides_the_dtype(repo_root, name):
    """``--cfg-options optim_wrapper.dtype=float16`` (GPUs without bf16)."""
    cfg = Config.fromfile(os.path.join(repo_root, 'configs', name))
    action = DictAction(option_strings=['--cfg-options'], dest='cfg_options')
    namespace = argparse.Namespace()
    action(None, namespace, ['optim_wrapper.dtype=float16'])
    cfg.merge_from_dict(namespace.cfg_options)
    assert cfg.optim_wrapper.dtype == 'float16'
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.dtype in AmpOptimWrapper.valid_dtypes
    # float16 gets mmengine's dynamic loss scaling back.
    assert needs_loss_scaler(cfg.optim_wrapper.loss_scale, torch.float16)
    # The rest of the wrapper is untouched by the override.
    original = Config.fromfile(os.path.join(repo_root, 'configs', name))
    for key, value in original.optim_wrapper.items():
        if key != 'dtype':
            assert cfg.optim_wrapper[key] == value, key


def test_fallback_is_documented_in_the_base_recipe(repo_root):
    text = open(os.path.join(repo_root, 'configs',
                             'mae_vit-base_200e.py')).read()
    assert '--cfg-options optim_wrapper.dtype=float16' in text


def test_fsdp_recipe_float16_fallback_sets_both_dtypes(repo_root):
    """The FSDP recipe's documented fallback (docs/gpu_clusters.md#fsdp):
    the FSDP policy's compute dtype follows the autocast dtype, as
    MMAEFSDPStrategy requires (the float32 gradient reduction stays)."""
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs', 'mmae_vit-large_200e_fsdp.py'))
    policy = cfg.strategy.model_wrapper.mixed_precision
    assert policy.param_dtype == cfg.optim_wrapper.dtype == 'bfloat16'
    action = DictAction(option_strings=['--cfg-options'], dest='cfg_options')
    namespace = argparse.Namespace()
    action(None, namespace, [
        'optim_wrapper.dtype=float16',
        'strategy.model_wrapper.mixed_precision.param_dtype=float16'
    ])
    cfg.merge_from_dict(namespace.cfg_options)
    policy = cfg.strategy.model_wrapper.mixed_precision
    assert policy.param_dtype == cfg.optim_wrapper.dtype == 'float16'
    assert (policy.reduce_dtype, policy.buffer_dtype) == ('float32', 'float32')
