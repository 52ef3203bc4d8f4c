"""Bad input is refused with a message naming the parameter and the value."""
import math

import pytest
import torch
from mmpretrain.registry import MODELS

import mmae_plugin  # noqa: F401
from mmae_plugin.models import TCRLoss, UniformityLoss

MAE_PARTS = dict(
    backbone=dict(type='MAEViT', arch=dict(
        embed_dims=16, num_layers=1, num_heads=2, feedforward_channels=32),
        img_size=8, patch_size=4, patch_cfg=dict(in_channels=1)),
    neck=dict(type='MAEPretrainDecoder', num_patches=4, patch_size=4,
              in_chans=1, embed_dim=16, decoder_embed_dim=8, decoder_depth=1,
              decoder_num_heads=2),
    head=dict(type='MAEPretrainHead', norm_pix=True, patch_size=4,
              in_channels=1,
              loss=dict(type='PixelReconstructionLoss', criterion='L2')))


@pytest.mark.parametrize('mu', [0, -1.0, math.nan, math.inf])
def test_bad_mu(mu):
    with pytest.raises(ValueError, match=r'mu must be .*> 0, got'):
        MODELS.build(dict(type='TCRLoss', mu=mu))


@pytest.mark.parametrize('cls', ['TCRLoss', 'UniformityLoss'])
@pytest.mark.parametrize('weight', [-0.01, math.nan])
def test_bad_loss_weight(cls, weight):
    with pytest.raises(ValueError, match=r'loss_weight must be .*>= 0, got'):
        MODELS.build(dict(type=cls, loss_weight=weight))


def test_unknown_form():
    with pytest.raises(ValueError, match=r"form must be one of .*'paper'.*"
                       r"got 'papr'"):
        MODELS.build(dict(type='TCRLoss', form='papr'))


@pytest.mark.parametrize('cls', ['TCRLoss', 'UniformityLoss'])
def test_unknown_gather(cls):
    with pytest.raises(ValueError, match=r"gather must be one of .*got 'all'"):
        MODELS.build(dict(type=cls, gather='all'))


def test_unknown_feature():
    with pytest.raises(ValueError, match=r"feature must be one of .*'cls'.*"
                       r"got 'avg'"):
        MODELS.build(dict(type='MMAE', feature='avg', **MAE_PARTS))


@pytest.mark.parametrize('loss', [TCRLoss(), UniformityLoss()])
def test_fewer_than_two_samples(loss):
    with pytest.raises(ValueError, match='at least 2 samples.*got 1'):
        loss(torch.randn(1, 8))


@pytest.mark.parametrize('loss', [TCRLoss(), UniformityLoss()])
@pytest.mark.parametrize('bad', [math.nan, math.inf])
def test_non_finite_features(loss, bad):
    z = torch.randn(4, 8)
    z[2, 3] = bad
    with pytest.raises(ValueError, match='features contains 1 non-finite'):
        loss(z)


def test_wrong_rank_features():
    with pytest.raises(ValueError, match=r'features must be a 2-D .*\(4, 2, 3\)'):
        TCRLoss()(torch.randn(4, 2, 3))


def test_model_with_bad_regularizer_fails_when_config_is_built():
    with pytest.raises(ValueError, match='mu must be'):
        MODELS.build(dict(type='MMAE', regularizer=dict(type='TCRLoss', mu=-2),
                          **MAE_PARTS))
