"""Spectral contrastive learning: the loss against float64 numpy references,
and the algorithm trained by a real mmengine Runner from its config."""
import glob
import json
import math
import os

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401  (registers the components)
from mmae_plugin.models.algorithms import SpectralContrastive
from mmae_plugin.models.losses.spectral_contrastive_loss import (
    SpectralContrastiveLoss, project_to_ball, spectral_contrastive_loss)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, 'configs', 'fashion_mnist', 'spectral_fmnist.py')


# --------------------------------------------------------------------------
# float64 numpy references, written from the formulas with explicit loops
# --------------------------------------------------------------------------
def numpy_ball(z: np.ndarray, mu: float) -> np.ndarray:
    """Rows of norm >= sqrt(mu) scaled to norm sqrt(mu), one by one."""
    out = z.copy()
    for i, row in enumerate(z):
        norm = math.sqrt(float(row @ row))
        if norm >= math.sqrt(mu):
            out[i] = row * math.sqrt(mu) / norm
    return out


def numpy_loss(z1: np.ndarray, z2: np.ndarray, mu=None) -> float:
    """-(2/B) sum_i z1_i.z2_i + sum_{i != j} (z1_i.z2_j)^2 / (B (B-1))."""
    if mu is not None:
        z1, z2 = numpy_ball(z1, mu), numpy_ball(z2, mu)
    b = z1.shape[0]
    positive = sum(float(z1[i] @ z2[i]) for i in range(b)) * 2.0 / b
    negative = sum(
        float(z1[i] @ z2[j])**2 for i in range(b)
        for j in range(b) if i != j) / (
            b * (b - 1))
    loss = negative - positive
    return loss if mu is None else loss / mu


def numpy_gradient(z1: np.ndarray, z2: np.ndarray):
    """Analytic gradient of the loss without projection, by loops."""
    b = z1.shape[0]
    g1, g2 = np.zeros_like(z1), np.zeros_like(z2)
    for i in range(b):
        g1[i] -= 2.0 / b * z2[i]
        g2[i] -= 2.0 / b * z1[i]
        for j in range(b):
            if i != j:
                dot = float(z1[i] @ z2[j])
                g1[i] += 2.0 * dot * z2[j] / (b * (b - 1))
                g2[j] += 2.0 * dot * z1[i] / (b * (b - 1))
    return g1, g2


def numpy_finite_difference(z1, z2, mu, step=1e-6):
    """Central differences of :func:`numpy_loss` in every coordinate."""
    grads = []
    for which in (0, 1):
        z = (z1, z2)[which]
        grad = np.zeros_like(z)
        for index in np.ndindex(z.shape):
            plus, minus = z.copy(), z.copy()
            plus[index] += step
            minus[index] -= step
            args_plus = (plus, z2) if which == 0 else (z1, plus)
            args_minus = (minus, z2) if which == 0 else (z1, minus)
            grad[index] = (numpy_loss(*args_plus, mu) -
                           numpy_loss(*args_minus, mu)) / (2 * step)
        grads.append(grad)
    return grads


def torch_loss_and_grads(z1: np.ndarray, z2: np.ndarray, mu):
    t1 = torch.tensor(z1, requires_grad=True)
    t2 = torch.tensor(z2, requires_grad=True)
    loss = spectral_contrastive_loss(t1, t2, mu)
    loss.backward()
    return float(loss.detach()), t1.grad.numpy(), t2.grad.numpy()


def pairs(b: int = 6, d: int = 5, scale: float = 0.3, seed: int = 0):
    rng = np.random.default_rng(seed)
    z1 = rng.normal(size=(b, d)) * scale
    z2 = z1 + 0.5 * scale * rng.normal(size=(b, d))  # correlated positives
    return z1, z2


# --------------------------------------------------------------------------
# the loss
# --------------------------------------------------------------------------
@pytest.mark.parametrize('b,d,seed', [(2, 3, 0), (6, 5, 1), (17, 4, 2)])
def test_loss_and_gradient_match_numpy_without_projection(b, d, seed):
    z1, z2 = pairs(b, d, scale=1.0, seed=seed)
    loss, g1, g2 = torch_loss_and_grads(z1, z2, mu=None)
    assert loss == pytest.approx(numpy_loss(z1, z2), rel=1e-12, abs=1e-12)
    r1, r2 = numpy_gradient(z1, z2)
    np.testing.assert_allclose(g1, r1, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(g2, r2, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize('mu,scale', [(1.0, 0.2), (1.0, 1.5), (0.5, 0.6),
                                      (4.0, 1.2)])
def test_loss_and_gradient_match_numpy_with_the_ball(mu, scale):
    """Rows inside and outside the ball: value and finite differences."""
    z1, z2 = pairs(6, 4, scale=scale, seed=3)
    norms = np.linalg.norm(np.concatenate([z1, z2]), axis=1)
    # No row on the ball's surface, where the projection has a kink.
    assert np.min(np.abs(norms - math.sqrt(mu))) > 1e-3
    loss, g1, g2 = torch_loss_and_grads(z1, z2, mu)
    assert loss == pytest.approx(numpy_loss(z1, z2, mu), rel=1e-12, abs=1e-12)
    r1, r2 = numpy_finite_difference(z1, z2, mu)
    np.testing.assert_allclose(g1, r1, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g2, r2, rtol=1e-6, atol=1e-8)


def test_rows_inside_the_ball_are_left_alone():
    z1, z2 = pairs(5, 3, scale=0.1)
    assert np.linalg.norm(np.concatenate([z1, z2]), axis=1).max() < 1
    assert float(spectral_contrastive_loss(torch.tensor(z1),
                                           torch.tensor(z2), 1.0)) == \
        pytest.approx(numpy_loss(z1, z2), rel=1e-12)
    far = torch.tensor([[3.0, 4.0], [0.0, 0.1]], dtype=torch.float64)
    projected = project_to_ball(far, 1.0)
    assert torch.allclose(
        projected,
        torch.tensor([[0.6, 0.8], [0.0, 0.1]], dtype=torch.float64),
        atol=1e-15)


def test_estimator_is_symmetric_in_the_views():
    z1, z2 = pairs(7, 4, scale=0.8)
    a = spectral_contrastive_loss(torch.tensor(z1), torch.tensor(z2), 1.0)
    b = spectral_contrastive_loss(torch.tensor(z2), torch.tensor(z1), 1.0)
    assert float(a) == pytest.approx(float(b), rel=1e-13)


def test_estimator_is_unbiased_for_the_population_loss():
    """Gaussian pairs with known moments: the mean of the estimator over many
    batches is the population loss, -2 tr(C) + tr(S^2) (no projection).

    z1 = x + e1, z2 = x + e2 with x ~ N(0, S_x) and e ~ N(0, S_e): the
    positive term is E[z1.z2] = tr(S_x); independent samples have second
    moment S = S_x + S_e, and E[(z.z')^2] = tr(S S) for independent z, z'.
    """
    rng = np.random.default_rng(0)
    d, b, batches = 3, 8, 4000
    sx, se = np.diag([1.0, 0.5, 0.25]), 0.3 * np.eye(d)
    population = -2 * np.trace(sx) + np.trace((sx + se) @ (sx + se))
    values, with_diagonal = [], []
    for _ in range(batches):
        x = rng.normal(size=(b, d)) @ np.sqrt(sx)
        z1 = x + rng.normal(size=(b, d)) @ np.sqrt(se)
        z2 = x + rng.normal(size=(b, d)) @ np.sqrt(se)
        values.append(
            float(
                spectral_contrastive_loss(
                    torch.tensor(z1), torch.tensor(z2), None)))
        # The same batch with the positive pairs counted as negatives.
        with_diagonal.append(-2.0 / b * np.sum(z1 * z2) +
                             np.sum((z1 @ z2.T)**2) / b**2)
    mean = np.mean(values)
    stderr = np.std(values, ddof=1) / math.sqrt(batches)
    assert abs(mean - population) < 4 * stderr, (mean, population, stderr)
    # The test can tell: the diagonal-including estimator is biased upwards
    # (positive pairs are more aligned than independent ones).
    assert np.mean(with_diagonal) - population > 8 * stderr


def test_module_weight_and_bad_inputs():
    z1, z2 = pairs(4, 3)
    t1, t2 = torch.tensor(z1), torch.tensor(z2)
    module = SpectralContrastiveLoss(mu=None, loss_weight=0.5)
    assert float(module(t1, t2)) == pytest.approx(0.5 * numpy_loss(z1, z2))
    with pytest.raises(ValueError, match='same shape'):
        module(t1, t2[:3])
    with pytest.raises(ValueError, match='B >= 2'):
        module(t1[:1], t2[:1])
    with pytest.raises(ValueError, match='mu'):
        SpectralContrastiveLoss(mu=0.0)
    with pytest.raises(ValueError, match='loss_weight'):
        SpectralContrastiveLoss(loss_weight=-1.0)


def test_registered_head_and_loss_build_from_configs():
    head = MODELS.build(
        dict(
            type='SpectralContrastiveHead',
            loss=dict(type='SpectralContrastiveLoss', mu=2.0)))
    assert head.loss_module.mu == 2.0
    z1, z2 = pairs(5, 3, scale=1.0)
    value = head.loss(torch.tensor(z1), torch.tensor(z2))
    assert float(value) == pytest.approx(numpy_loss(z1, z2, 2.0), rel=1e-12)


# --------------------------------------------------------------------------
# the algorithm, from its config, in a real Runner
# --------------------------------------------------------------------------
def test_algorithm_loss_is_the_head_loss_of_the_two_projections():
    cfg = Config.fromfile(CONFIG)
    model = MODELS.build(cfg.model)
    assert isinstance(model, SpectralContrastive)
    model.eval()  # fixed BatchNorm statistics: the two passes agree
    torch.manual_seed(0)
    views = [
        torch.randint(0, 255, (6, 1, 28, 28), dtype=torch.uint8)
        for _ in range(2)
    ]
    data = model.data_preprocessor(
        dict(inputs=views, data_samples=None), training=False)
    with torch.no_grad():
        loss = model.loss(**data)['loss']
        z1 = model.neck(model.backbone(data['inputs'][0]))[0]
        z2 = model.neck(model.backbone(data['inputs'][1]))[0]
    expected = numpy_loss(z1.double().numpy(), z2.double().numpy(), 1.0)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_config_trains_in_a_runner_and_logs_the_matrix_information(tmp_path):
    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = str(tmp_path)
    cfg.train_dataloader.batch_size = 8
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = 24  # 3 iterations
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = None
    cfg.custom_hooks = [dict(type='MatrixInfoHook', interval=1)]
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.train()
    after = runner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before
               if k.startswith('backbone.'))
    paths = glob.glob(
        os.path.join(str(tmp_path), '*', 'vis_data', 'scalars.json'))
    rows = [json.loads(line) for line in open(paths[0]) if line.strip()]
    assert [row['step'] for row in rows] == [1, 2, 3]
    for row in rows:
        assert math.isfinite(row['loss'])
        # -2 <= loss: with mu = 1 every |z_i . z'_j| <= 1 (Cauchy-Schwarz).
        assert -2.0 <= row['loss'] <= 1.0
        for key in ('mutual_info_cov', 'joint_entropy_cov', 'matrix_js_cov',
                    'spectrum_js_cov', 'entropy_1_cov', 'entropy_2_cov'):
            assert math.isfinite(row[f'minfo/{key}'])
