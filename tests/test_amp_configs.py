"""Mixed precision of the ViT recipes: bfloat16 chosen explicitly.

``AmpOptimWrapper`` with ``dtype=None`` autocasts to float16 on GPUs; the
ViT-B/L configs ask for bfloat16 (no overflow, the scaler never skips a
step) and document float16 for GPUs without it. mmengine builds an
``AmpOptimWrapper`` only where there is a GPU, so here the configs are read
and merged as the tools merge them; tests/test_cuda.py builds the wrapper
and checks the autocast dtype on a GPU.
"""
import argparse
import glob
import os

import pytest
import torch
from mmengine.config import Config, DictAction
from mmengine.optim import AmpOptimWrapper

import mmae_plugin  # noqa: F401

AMP_CONFIGS = ('mae_vit-base_200e.py', 'mmae_vit-base_200e.py',
               'mmae_vit-large_200e.py', 'mmae_vit-large_200e_fsdp.py',
               'umae_vit-base_200e.py', 'linear_vit-base_90e.py',
               'linear_vit-large_90e.py')


def amp_configs(repo_root):
    """Every top-level config whose optimizer wrapper is AmpOptimWrapper."""
    found = []
    for path in sorted(glob.glob(os.path.join(repo_root, 'configs', '*.py'))):
        wrapper = Config.fromfile(path).get('optim_wrapper') or {}
        if wrapper.get('type') == 'AmpOptimWrapper':
            found.append(os.path.basename(path))
    return found


def test_every_amp_config_is_listed(repo_root):
    assert tuple(amp_configs(repo_root)) == tuple(sorted(AMP_CONFIGS))


@pytest.mark.parametrize('name', AMP_CONFIGS)
def test_vit_config_autocasts_in_bfloat16(repo_root, name):
    cfg = Config.fromfile(os.path.join(repo_root, 'configs', name))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    assert getattr(torch, cfg.optim_wrapper.dtype) is torch.bfloat16
    assert cfg.optim_wrapper.dtype in AmpOptimWrapper.valid_dtypes


@pytest.mark.parametrize('name', AMP_CONFIGS)
def test_documented_float16_fallback_overrides_the_dtype(repo_root, name):
    """``--cfg-options optim_wrapper.dtype=float16`` (GPUs without bf16)."""
    cfg = Config.fromfile(os.path.join(repo_root, 'configs', name))
    action = DictAction(option_strings=['--cfg-options'], dest='cfg_options')
    namespace = argparse.Namespace()
    action(None, namespace, ['optim_wrapper.dtype=float16'])
    cfg.merge_from_dict(namespace.cfg_options)
    assert cfg.optim_wrapper.dtype == 'float16'
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.dtype in AmpOptimWrapper.valid_dtypes
    # The rest of the wrapper is untouched by the override.
    original = Config.fromfile(os.path.join(repo_root, 'configs', name))
    for key, value in original.optim_wrapper.items():
        if key != 'dtype':
            assert cfg.optim_wrapper[key] == value, key


def test_fallback_is_documented_in_the_base_recipe(repo_root):
    text = open(os.path.join(repo_root, 'configs',
                             'mae_vit-base_200e.py')).read()
    assert '--cfg-options optim_wrapper.dtype=float16' in text
