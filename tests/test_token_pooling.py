"""Token pooling of ViT features (kNN, cached probe, linear configs)."""
import re

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.models.necks import POOLINGS, TokenPoolingNeck, pool_tokens


def numpy_pool(tokens: np.ndarray, pooling: str) -> np.ndarray:
    cls_token, patch_mean = tokens[:, 0], tokens[:, 1:].mean(axis=1)
    return {
        'cls': cls_token,
        'mean': patch_mean,
        'cls+mean': np.concatenate([cls_token, patch_mean], 1)
    }[pooling]


@pytest.mark.parametrize('pooling', POOLINGS)
def test_pool_tokens_matches_numpy(pooling):
    tokens = torch.randn(5, 1 + 49, 8, dtype=torch.float64)
    np.testing.assert_allclose(
        pool_tokens(tokens, pooling).numpy(),
        numpy_pool(tokens.numpy(), pooling),
        rtol=1e-12)


@pytest.mark.parametrize('pooling', POOLINGS)
def test_raw_pooling_equals_the_backbone_own_outputs(pooling):
    """Pooled raw tokens equal what mmpretrain's ViT gives as 'cls_token'
    and as 'featmap' (mean over H, W) with the same weights."""
    cfg = Config.fromfile('configs/fashion_mnist/knn_fmnist.py').model.backbone
    torch.manual_seed(0)
    raw, cls_vit, map_vit = (
        MODELS.build({
            **cfg, 'out_type': out_type
        }) for out_type in ('raw', 'cls_token', 'featmap'))
    cls_vit.load_state_dict(raw.state_dict())
    map_vit.load_state_dict(raw.state_dict())
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        pooled = pool_tokens(raw(x)[-1], pooling)
        cls_token = cls_vit(x)[-1]
        patch_mean = map_vit(x)[-1].mean(dim=(2, 3))
    expected = {
        'cls': cls_token,
        'mean': patch_mean,
        'cls+mean': torch.cat([cls_token, patch_mean], 1)
    }[pooling]
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-6)


def test_already_pooled_outputs_pass_through():
    feats = torch.randn(3, 8)
    assert pool_tokens(feats, 'cls') is feats
    fmap = torch.randn(3, 8, 7, 7)
    torch.testing.assert_close(pool_tokens(fmap, 'mean'), fmap.mean((2, 3)))


@pytest.mark.parametrize('feats,pooling,message', [
    (torch.randn(3, 8), 'mean', "out_type='cls_token'"),
    (torch.randn(3, 8, 7, 7), 'cls+mean', "out_type='featmap'"),
    (torch.randn(3, 50, 8), 'max', 'pooling must be one of'),
    (torch.randn(3, 8, 1, 7, 7), 'cls', 'got shape (3, 8, 1, 7, 7)'),
])
def test_pool_tokens_names_what_is_wrong(feats, pooling, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        pool_tokens(feats, pooling)


def test_knn_classifier_refuses_a_pooling_its_backbone_cannot_give():
    cfg = Config.fromfile('configs/fashion_mnist/knn_fmnist.py')
    cfg.model.pooling = 'cls+mean'  # backbone out_type stays 'cls_token'
    with pytest.raises(ValueError, match="out_type='raw'"):
        MODELS.build(cfg.model)
    with pytest.raises(ValueError, match='pooling must be one of'):
        TokenPoolingNeck(pooling='avg')


def test_clsmean_knn_classifier_features():
    cfg = Config.fromfile('configs/fashion_mnist/knn_fmnist_clsmean.py')
    model = MODELS.build(cfg.model)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        tokens = model.image_encoder(x)[-1]
        feats = model.extract_feat(x)
    assert feats.shape == (2, 256)
    np.testing.assert_allclose(
        feats.numpy(),
        numpy_pool(tokens.numpy(), 'cls+mean'),
        rtol=1e-5,
        atol=1e-6)
