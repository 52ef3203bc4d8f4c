"""MMAE against mmpretrain's MAE, on the Fashion-MNIST model of the configs."""
import copy

import pytest
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401


@pytest.fixture(scope='module')
def model_cfgs(repo_root):
    cfgs = {}
    for name in ('mae', 'umae', 'mmae'):
        cfg = Config.fromfile(
            f'{repo_root}/configs/fashion_mnist/{name}_fmnist.py')
        cfgs[name] = cfg.model
    return cfgs


def build(model_cfg, seed=0):
    torch.manual_seed(seed)
    model = MODELS.build(copy.deepcopy(model_cfg))
    model.init_weights()
    return model


def losses_of(model, images, seed=1):
    torch.manual_seed(seed)  # the same random masks for both models
    return model.loss(images, data_samples=[])


def test_mmae_without_regularizer_equals_mae_bit_for_bit(model_cfgs):
    mae_cfg = model_cfgs['mae']
    mmae_cfg = copy.deepcopy(mae_cfg)
    mmae_cfg.update(type='MMAE', regularizer=None)
    images = torch.randn(8, 1, 28, 28)
    mae, mmae = build(mae_cfg), build(mmae_cfg)
    expected = losses_of(mae, images)
    got = losses_of(mmae, images)
    assert set(got) == {'loss_rec'}
    assert torch.equal(got['loss_rec'], expected['loss'])
    got['loss_rec'].backward()
    expected['loss'].backward()
    for (name, p), (_, q) in zip(mmae.named_parameters(),
                                 mae.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize('name,key', [('mmae', 'loss_tcr'),
                                      ('umae', 'loss_unif')])
def test_regularised_losses_are_logged_separately(model_cfgs, name, key):
    images = torch.randn(8, 1, 28, 28)
    mae_losses = losses_of(build(model_cfgs['mae']), images)
    losses = losses_of(build(model_cfgs[name]), images)
    assert set(losses) == {'loss_rec', key, 'reg_skipped'}
    assert losses['reg_skipped'].item() == 0.0  # the term was applied
    # Same weights and masks: the reconstruction term is MAE's.
    assert torch.equal(losses['loss_rec'], mae_losses['loss'])
    assert torch.isfinite(losses[key])


def regulariser_input_and_latent(model, seed=3):
    """What the regulariser received in ``model.loss`` and, under the same
    mask, the masked encoder output."""
    captured = {}
    model.regularizer.register_forward_pre_hook(
        lambda module, args: captured.setdefault('z', args[0]))
    images = torch.randn(4, 1, 28, 28)
    torch.manual_seed(seed)
    model.loss(images, data_samples=[])
    torch.manual_seed(seed)
    latent, _, _ = model.backbone(images)
    return captured['z'], latent


def test_regulariser_sees_the_cls_token_of_the_masked_pass(model_cfgs):
    model = build(model_cfgs['mmae'])
    z, latent = regulariser_input_and_latent(model)
    assert latent.shape[1] == 1 + 49 // 4  # CLS + the 25 % visible patches
    torch.testing.assert_close(z, latent[:, 0])


def test_mean_feature_is_the_mean_of_the_visible_patches(model_cfgs):
    cfg = copy.deepcopy(model_cfgs['mmae'])
    cfg.feature = 'mean'
    model = build(cfg)
    latent = torch.randn(3, 13, 128)
    torch.testing.assert_close(model.pool(latent), latent[:, 1:].mean(1))


def hand_layer_norm(x, weight, bias, eps):
    """LayerNorm over the last axis, written out (biased variance)."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean)**2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight.double() + bias.double()


@pytest.mark.parametrize('feature', ['cls', 'mean'])
def test_final_norm_twice_applies_the_encoder_norm_again(model_cfgs, feature):
    cfg = copy.deepcopy(model_cfgs['mmae'])
    cfg.update(feature=feature, final_norm_twice=True)
    model = build(cfg)
    norm = model.backbone.norm1
    assert isinstance(norm, torch.nn.LayerNorm)
    with torch.no_grad():  # non-trivial affine parameters
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    z, latent = regulariser_input_and_latent(model)  # latent: normed once
    pooled = latent[:, 0] if feature == 'cls' else latent[:, 1:].mean(1)
    expected = hand_layer_norm(pooled, norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(z.double(), expected, rtol=1e-5, atol=1e-5)
    # Normed twice is not normed once (unit affine would make it idempotent).
    assert not torch.allclose(z, pooled, atol=1e-3)


def test_shipped_configs_norm_the_feature_once(repo_root):
    for name in ('mmae', 'umae'):
        cfg = Config.fromfile(
            f'{repo_root}/configs/fashion_mnist/{name}_fmnist.py')
        assert cfg.model.get('final_norm_twice', False) is False
        assert build(cfg.model).final_norm_twice is False


def test_batch_of_one_skips_the_regulariser_and_keeps_the_graph(model_cfgs):
    model = build(model_cfgs['mmae'])
    losses = model.loss(torch.randn(1, 1, 28, 28), data_samples=[])
    assert losses['loss_tcr'].item() == 0.0
    sum(losses.values()).backward()  # the zero term is part of the graph
    assert model.backbone.cls_token.grad is not None
