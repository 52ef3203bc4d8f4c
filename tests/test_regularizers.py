"""TCRLoss and UniformityLoss against an independent float64 numpy reference.

Gradients are checked against central finite differences of the numpy
reference, so nothing here trusts torch's autograd.
"""
import zlib

import numpy as np
import pytest
import torch

import mmae_plugin  # noqa: F401
from mmae_plugin.models import TCRLoss, UniformityLoss
import scipy_matrix_info_reference as reference
from scipy_matrix_info_reference import finite_difference_grad


def np_tcr(z: np.ndarray, mu: float, form: str, centering: bool) -> float:
    """The loss TCRLoss computes at weight 1: minus the coding rate."""
    return -reference.coding_rate(z, form, mu, centering)


def make_features(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == 'B<d':
        return rng.normal(size=(5, 9))
    if kind == 'B>d':
        return rng.normal(size=(11, 4))
    # collapsed: every row the same direction, different lengths
    direction = rng.normal(size=(1, 6))
    return rng.uniform(0.5, 2.0, size=(8, 1)) * direction


KINDS = ['B<d', 'B>d', 'rank1']


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('form', ['reference', 'paper'])
@pytest.mark.parametrize('centering', [False, True])
@pytest.mark.parametrize('mu', [0.5, 3.0])
def test_tcr_value_and_grad_match_numpy(kind, form, centering, mu):
    rng = np.random.default_rng(zlib.crc32(repr((kind, form, centering, mu)).encode()))
    z = make_features(kind, rng)
    weight = 0.3
    loss_fn = TCRLoss(mu=mu, form=form, centering=centering, gather='local',
                      loss_weight=weight)
    zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    loss = loss_fn(zt)
    loss.backward()

    def ref(x):
        return weight * np_tcr(x, mu, form, centering)

    assert torch.isfinite(loss) and torch.isfinite(zt.grad).all()
    np.testing.assert_allclose(loss.item(), ref(z), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        zt.grad.numpy(), finite_difference_grad(ref, z), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_uniformity_value_and_grad_match_numpy(kind):
    rng = np.random.default_rng(7)
    z = make_features(kind, rng)
    loss_fn = UniformityLoss(gather='local', loss_weight=0.5)
    zt = torch.tensor(z, requires_grad=True)
    loss = loss_fn(zt)
    loss.backward()

    def ref(x):
        return 0.5 * reference.uniformity(x)

    np.testing.assert_allclose(loss.item(), ref(z), rtol=1e-6)
    np.testing.assert_allclose(
        zt.grad.numpy(), finite_difference_grad(ref, z), rtol=1e-4, atol=1e-7)


def test_collapsed_uniformity_is_one_and_tcr_is_one_direction():
    z = torch.ones(16, 32)
    assert UniformityLoss(gather='local', loss_weight=1.0)(z).item() == \
        pytest.approx(1.0)
    # one unit direction repeated B times: logdet(I + (mu/d) B e e^T)
    tcr = -TCRLoss(mu=2.0, gather='local', loss_weight=1.0)(z).item()
    assert tcr == pytest.approx(np.log1p(2.0 / 32 * 16), rel=1e-6)


def test_tcr_second_order_expansion_relates_to_uniformity():
    # logdet(I + cS) ~ c tr S - c^2/2 ||S||_F^2 with tr S = B (REFERENCE.md).
    rng = np.random.default_rng(0)
    z = torch.tensor(rng.normal(size=(64, 256)))
    b, d, mu = z.shape[0], z.shape[1], 0.05
    c = mu / d
    tcr = -TCRLoss(mu=mu, gather='local', loss_weight=1.0)(z).item()
    unif = UniformityLoss(gather='local', loss_weight=1.0)(z).item()
    approx = c * b - c**2 / 2 * b**2 * unif
    assert tcr == pytest.approx(approx, rel=1e-6)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_input_gives_finite_float32_loss(dtype):
    z = torch.randn(32, 64).to(dtype).requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = TCRLoss(gather='local')(z)
    loss.backward()
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss) and torch.isfinite(z.grad.float()).all()


def test_loss_is_negative_weighted_tcr():
    z = torch.randn(10, 6)
    plain = TCRLoss(mu=1.0, gather='local', loss_weight=1.0)(z)
    weighted = TCRLoss(mu=1.0, gather='local', loss_weight=0.01)(z)
    assert plain.item() < 0
    assert weighted.item() == pytest.approx(0.01 * plain.item(), rel=1e-6)


@pytest.mark.parametrize('scale', [1e-20, 1e-150, 1e150])
@pytest.mark.parametrize('cls', [TCRLoss, UniformityLoss])
def test_regularizers_are_scale_invariant_at_any_scale(cls, scale):
    z = torch.randn(6, 5, dtype=torch.float64)
    loss_fn = cls(gather='local', loss_weight=1.0)
    torch.testing.assert_close(loss_fn(z * scale), loss_fn(z))
    assert loss_fn(z).item() != 0.0


@pytest.mark.parametrize('form', ['reference', 'paper'])
def test_tcr_under_bf16_autocast_is_the_float64_value(form):
    """The term runs in float64 with autocast off, whatever the context."""
    rng = np.random.default_rng(7)
    z = rng.normal(size=(24, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = TCRLoss(mu=1.5, form=form, gather='local',
                       loss_weight=1.0)(torch.tensor(z, dtype=torch.float32))
    expected = np_tcr(z.astype(np.float32).astype(np.float64), 1.5, form,
                      False)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected, rel=1e-6)
