"""Tests of the matrix-information toolbox (pure PyTorch, no runner).

Identities of REFERENCE.md section 2, agreement of values and gradients with
an independent numpy/scipy implementation, the Gram/covariance duality, and
finiteness on degenerate and low-precision inputs.
"""
import math
import re

import numpy as np
import pytest
import scipy_matrix_info_reference as ref
import torch

# yapf: disable (isort wraps this import; yapf would rewrap it)
from mmae_plugin.matrix_info import (FactoredPSD, effective_rank,
                                     hadamard_product, matrix_entropy,
                                     matrix_joint_entropy,
                                     matrix_js_divergence,
                                     matrix_kl_divergence,
                                     matrix_mutual_information,
                                     normalized_covariance, normalized_gram,
                                     rankme, spectrum_js_divergence,
                                     total_coding_rate)

# yapf: enable

ALPHAS = [0.5, 1.0, 2.0, 3.0]


def random_features(b: int, d: int, seed: int, mix: float = 0.5):
    """Correlated Gaussian features (B, d) in float64."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(b, d, generator=gen, dtype=torch.float64)
    mixing = torch.eye(
        d, dtype=torch.float64) + mix * torch.randn(
            d, d, generator=gen, dtype=torch.float64)
    return base @ mixing


def random_correlation(d: int, seed: int, b: int = None) -> torch.Tensor:
    """A random unit-diagonal PSD matrix (full rank when b > d)."""
    return normalized_covariance(random_features(b or 4 * d, d, seed))


def random_psd(n: int, seed: int) -> torch.Tensor:
    """A random full-rank PSD matrix with a non-unit diagonal."""
    z = random_features(3 * n, n, seed)
    return z.T @ z / (3 * n)


# --------------------------------------------------------------------------
# Identities (REFERENCE.md section 2, paper propositions 1-5)
# --------------------------------------------------------------------------
@pytest.mark.parametrize('alpha', ALPHAS)
def test_identity_has_entropy_log_d_and_it_is_the_maximum(alpha):
    d = 12
    eye = torch.eye(d)
    assert matrix_entropy(eye, alpha).item() == pytest.approx(
        math.log(d), abs=1e-12)
    for seed in range(20):
        corr = random_correlation(d, seed, b=d + seed)  # some rank-deficient
        value = matrix_entropy(corr, alpha).item()
        assert value < math.log(d) - 1e-6
        assert value >= 0


@pytest.mark.parametrize('alpha', ALPHAS)
def test_mutual_information_at_most_log_d_proposition_1(alpha):
    d = 10
    for seed in range(10):
        k1 = random_correlation(d, seed)
        k2 = random_correlation(d, 100 + seed)
        mi = matrix_mutual_information(k1, k2, alpha).item()
        assert mi <= math.log(d) + 1e-12
    eye = torch.eye(d, dtype=torch.float64)
    assert matrix_mutual_information(eye, eye, alpha).item() == \
        pytest.approx(math.log(d), abs=1e-12)


@pytest.mark.parametrize('alpha', ALPHAS)
def test_joint_entropy_bounds_proposition_2(alpha):
    d = 10
    for seed in range(10):
        k1 = random_correlation(d, seed, b=6 + seed)
        k2 = random_correlation(d, 50 + seed)
        h1 = matrix_entropy(k1, alpha).item()
        h2 = matrix_entropy(k2, alpha).item()
        joint = matrix_joint_entropy(k1, k2, alpha).item()
        assert max(h1, h2) <= joint + 1e-10
        assert joint <= h1 + h2 + 1e-10


def test_joint_entropy_bounded_by_log_rank_proposition_2():
    d = 16
    z1 = random_features(5, d, 0)  # rank(K1) <= 4 after centering
    z2 = random_features(7, d, 1)  # rank(K2) <= 6
    k1, k2 = normalized_covariance(z1), normalized_covariance(z2)

    def rank(k):
        return int(torch.linalg.matrix_rank(k, hermitian=True))

    joint = matrix_joint_entropy(k1, k2).item()
    assert joint <= math.log(rank(k1 * k2)) + 1e-10
    assert math.log(rank(k1 * k2)) <= math.log(rank(k1)) + \
        math.log(rank(k2)) + 1e-10


def test_entropy_and_coding_rate_through_kl_proposition_3():
    d = 9
    eye = torch.eye(d, dtype=torch.float64)
    for seed in range(5):
        k = random_correlation(d, seed)
        kl_to_identity = matrix_kl_divergence(k, eye, eps=0.0).item()
        assert matrix_entropy(k).item() == pytest.approx(
            math.log(d) - kl_to_identity / d, abs=1e-10)
        for mu in (0.5, 1.0, 3.0):
            features = torch.linalg.cholesky(k).T  # features^T features = k
            tcr = total_coding_rate(features, mu).item()
            target = (mu * eye + k) / (1 + mu)
            kl_value = matrix_kl_divergence(eye, target, eps=0.0).item()
            assert tcr == pytest.approx(
                d * math.log(1 + mu) - kl_value, abs=1e-9)


def test_hadamard_coding_rate_inequality_proposition_4():
    d = 8
    for seed in range(10):
        k1, k2 = random_correlation(d, seed), random_correlation(d, 30 + seed)
        for mu in (0.1, 1.0, 2.0):
            joint_factor = torch.linalg.cholesky(k1 * k2 +
                                                 1e-12 * torch.eye(d)).T
            lhs = total_coding_rate(joint_factor, mu**2 + 2 * mu).item()
            rhs = total_coding_rate(torch.linalg.cholesky(k1).T, mu).item() \
                + total_coding_rate(torch.linalg.cholesky(k2).T, mu).item()
            assert lhs >= rhs - 1e-9


def test_identity_maximises_coding_rate_proposition_5():
    d = 8
    best = total_coding_rate(torch.eye(d, dtype=torch.float64), 1.0).item()
    for seed in range(10):
        factor = torch.linalg.cholesky(random_correlation(d, seed)).T
        assert total_coding_rate(factor, 1.0).item() <= best + 1e-12


@pytest.mark.parametrize('js', [matrix_js_divergence, spectrum_js_divergence])
def test_js_symmetric_zero_on_equal_and_at_most_log2(js):
    d = 10
    for seed in range(8):
        k1, k2 = random_correlation(d, seed), random_psd(d, 40 + seed)
        forward, backward = js(k1, k2).item(), js(k2, k1).item()
        assert forward == pytest.approx(backward, abs=1e-12)
        assert 0 <= forward <= math.log(2) + 1e-12
        assert abs(js(k1, k1).item()) < 1e-12
        # Trace normalisation: a rescaled copy is the same density matrix.
        assert abs(js(k2, 7.5 * k2).item()) < 1e-12
    # Orthogonal supports reach the bound log 2 exactly.
    p = torch.diag(torch.tensor([1., 1., 0., 0.], dtype=torch.float64))
    q = torch.diag(torch.tensor([0., 0., 1., 1.], dtype=torch.float64))
    if js is matrix_js_divergence:
        assert js(p, q).item() == pytest.approx(math.log(2), abs=1e-12)


def test_matrix_js_exceeds_spectrum_js_for_rotated_equal_spectra():
    k = random_correlation(6, 0)
    rotation, _ = torch.linalg.qr(random_features(6, 6, 1))
    rotated = rotation @ k @ rotation.T
    assert spectrum_js_divergence(k, rotated).item() < 1e-12
    assert matrix_js_divergence(k, rotated).item() > 1e-3


def test_effective_rank_of_identity_and_rank_one():
    assert effective_rank(torch.eye(17)).item() == pytest.approx(17, abs=1e-9)
    u = torch.randn(9, 1, dtype=torch.float64)
    assert effective_rank(u @ u.T).item() == pytest.approx(1, abs=1e-9)
    assert effective_rank(torch.ones(5, 3)).item() == pytest.approx(1, 1e-9)
    assert rankme(torch.eye(17), eps=0.0).item() == pytest.approx(17, 1e-9)


# --------------------------------------------------------------------------
# Values and gradients against numpy/scipy
# --------------------------------------------------------------------------
def symmetric_direction(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(n, n, generator=gen, dtype=torch.float64)
    return (e + e.T) / 2


def directional_derivative(fn,
                           K: np.ndarray,
                           direction: np.ndarray,
                           h: float = 1e-6) -> float:
    """Central difference of a numpy/scipy function along ``direction``."""
    return (fn(K + h * direction) - fn(K - h * direction)) / (2 * h)


def check_value_and_gradient(torch_fn, ref_fn, mats, seed=0, rtol=1e-6):
    """Compare values and directional derivatives in every argument."""
    tensors = [m.clone().requires_grad_(True) for m in mats]
    value = torch_fn(*tensors)
    arrays = [m.numpy() for m in mats]
    assert value.item() == pytest.approx(ref_fn(*arrays), rel=rtol, abs=1e-9)
    grads = torch.autograd.grad(value, tensors)
    for index, grad in enumerate(grads):
        for trial in range(2):
            direction = symmetric_direction(mats[index].shape[0],
                                            seed + 10 * index + trial)

            def along(x, index=index):
                args = list(arrays)
                args[index] = x
                return ref_fn(*args)

            expected = directional_derivative(along, arrays[index],
                                              direction.numpy())
            got = float((grad * direction).sum())
            assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize('alpha', ALPHAS)
def test_entropy_mi_joint_match_scipy(alpha):
    k1, k2 = random_psd(7, 1), random_psd(7, 2)
    check_value_and_gradient(lambda a: matrix_entropy(a, alpha),
                             lambda a: ref.renyi(a, alpha), [k1])
    check_value_and_gradient(lambda a, b: matrix_joint_entropy(a, b, alpha),
                             lambda a, b: ref.joint(a, b, alpha), [k1, k2])
    check_value_and_gradient(
        lambda a, b: matrix_mutual_information(a, b, alpha),
        lambda a, b: ref.mutual(a, b, alpha), [k1, k2])


def test_divergences_match_scipy():
    k1, k2 = random_psd(6, 3), random_psd(6, 4)
    check_value_and_gradient(lambda a, b: matrix_kl_divergence(a, b, 1e-3),
                             lambda a, b: ref.kl(a, b, 1e-3), [k1, k2])
    check_value_and_gradient(matrix_js_divergence, ref.js, [k1, k2])
    check_value_and_gradient(spectrum_js_divergence, ref.spectrum_js, [k1, k2])


def test_kl_gradient_finite_at_repeated_eigenvalues():
    d = 6
    eye = torch.eye(d, dtype=torch.float64, requires_grad=True)
    k = random_correlation(d, 0).requires_grad_(True)
    value = matrix_kl_divergence(k, eye, eps=1e-6)
    grad_k, grad_eye = torch.autograd.grad(value, [k, eye])
    assert torch.isfinite(grad_k).all() and torch.isfinite(grad_eye).all()
    # d/dB tr[A log B] at B = I (equal eigenvalues) is A / 1 (+ trace terms).
    expected = directional_derivative(
        lambda b: ref.kl(k.detach().numpy(), b, 1e-6), np.eye(d),
        symmetric_direction(d, 5).numpy())
    assert float((grad_eye * symmetric_direction(d, 5)).sum()) == \
        pytest.approx(expected, rel=1e-4)


def test_feature_quantities_match_scipy():
    z = random_features(20, 8, 5)
    for mu in (0.5, 1.0):
        assert total_coding_rate(z, mu).item() == pytest.approx(
            ref.tcr(z.numpy(), mu), rel=1e-10)
    assert effective_rank(z).item() == pytest.approx(
        ref.effective_rank(z.numpy()), rel=1e-10)
    assert rankme(z).item() == pytest.approx(
        ref.rankme(z.numpy(), 1e-7), rel=1e-10)
    np.testing.assert_allclose(
        normalized_covariance(z).numpy(),
        ref.normalized_covariance(z.numpy()),
        atol=1e-12)
    np.testing.assert_allclose(
        normalized_gram(z).numpy(), ref.normalized_gram(z.numpy()), atol=1e-12)
    z_grad = z.clone().requires_grad_(True)
    grad, = torch.autograd.grad(effective_rank(z_grad), z_grad)
    direction = torch.randn_like(z)
    expected = directional_derivative(ref.effective_rank, z.numpy(),
                                      direction.numpy())
    assert float((grad * direction).sum()) == pytest.approx(expected, rel=1e-4)


# --------------------------------------------------------------------------
# Gram / covariance duality and factored inputs
# --------------------------------------------------------------------------
@pytest.mark.parametrize('alpha', ALPHAS)
def test_dxd_and_bxb_sides_agree(alpha):
    for b, d in ((6, 15), (15, 6)):
        z = random_features(b, d, b + d)
        cov_side, gram_side = z.T @ z, z @ z.T
        assert matrix_entropy(cov_side, alpha).item() == pytest.approx(
            matrix_entropy(gram_side, alpha).item(), abs=1e-10)
        assert effective_rank(cov_side).item() == pytest.approx(
            effective_rank(gram_side).item(), rel=1e-8)
        z2 = random_features(b, d, 99)
        assert spectrum_js_divergence(cov_side, z2.T @ z2).item() == \
            pytest.approx(
                spectrum_js_divergence(gram_side, z2 @ z2.T).item(),
                abs=1e-10)
        # total_coding_rate switches sides internally (Sylvester).
        dense = torch.logdet(2.0 * torch.eye(d, dtype=torch.float64) +
                             cov_side).item()
        assert total_coding_rate(z, 2.0).item() == pytest.approx(
            dense, rel=1e-10)


@pytest.mark.parametrize('alpha', ALPHAS)
def test_factored_inputs_equal_dense(alpha):
    for b in (5, 40):  # small side is B, then d
        z1, z2 = random_features(b, 12, 1), random_features(b, 12, 2)
        for build in (normalized_covariance, normalized_gram):
            dense1, dense2 = build(z1), build(z2)
            fac1, fac2 = build(z1, factored=True), build(z2, factored=True)
            assert isinstance(fac1, FactoredPSD)
            for fn in (matrix_entropy, ):
                assert fn(fac1, alpha).item() == pytest.approx(
                    fn(dense1, alpha).item(), abs=1e-10)
            for fn in (matrix_joint_entropy, matrix_mutual_information):
                assert fn(fac1, fac2, alpha).item() == pytest.approx(
                    fn(dense1, dense2, alpha).item(), abs=1e-10)
            for fn in (matrix_js_divergence, spectrum_js_divergence):
                assert fn(fac1, fac2).item() == pytest.approx(
                    fn(dense1, dense2).item(), abs=1e-10)
            assert matrix_kl_divergence(fac1, fac2, 1e-4).item() == \
                pytest.approx(
                    matrix_kl_divergence(dense1, dense2, 1e-4).item(),
                    rel=1e-8)


def test_khatri_rao_factor_used_when_cheaper():
    z1, z2 = random_features(3, 40, 1), random_features(4, 40, 2)
    fac = hadamard_product(
        normalized_gram(z1.T, factored=True),
        normalized_gram(z2.T, factored=True))
    assert isinstance(fac, FactoredPSD) and fac.inner_size == 12
    dense = normalized_gram(z1.T) * normalized_gram(z2.T)
    torch.testing.assert_close(fac.dense(), dense)


# --------------------------------------------------------------------------
# Degenerate inputs and low precision
# --------------------------------------------------------------------------
def all_quantities(
    z: torch.Tensor,
    z_other: torch.Tensor,
    builds=(normalized_covariance, normalized_gram)
) -> torch.Tensor:
    """Sum of every quantity on covariance and Gram sides (finite check)."""
    total = total_coding_rate(z) + effective_rank(z) + rankme(z)
    for build in builds:
        for factored in (False, True):
            k1 = build(z, factored=factored)
            k2 = build(z_other, factored=factored)
            for alpha in ALPHAS:
                total = total + matrix_entropy(k1, alpha) + \
                    matrix_mutual_information(k1, k2, alpha) + \
                    matrix_joint_entropy(k1, k2, alpha)
            total = total + matrix_js_divergence(k1, k2) + \
                spectrum_js_divergence(k1, k2) + \
                matrix_kl_divergence(k1, k2) + matrix_kl_divergence(k2, k1)
    return total


def degenerate_inputs():
    z = random_features(12, 8, 0).float()
    low_rank = random_features(12, 2, 1).float() @ torch.randn(2, 8)
    collapsed = z[:1].repeat(12, 1)
    return {
        'rank_deficient': low_rank,
        'collapsed': collapsed,
        'tiny': 1e-8 * z,
        'huge': 1e8 * z,
        'fp16': z.half(),
        'bf16': z.bfloat16(),
        'fewer_samples_than_features': z[:3],
        'zero_row': torch.cat([z[:-1], torch.zeros(1, 8)]),
    }


@pytest.mark.parametrize('case', list(degenerate_inputs()))
def test_finite_values_and_gradients_on_degenerate_inputs(case):
    z = degenerate_inputs()[case].clone().requires_grad_(True)
    other = (degenerate_inputs()[case].float() + 0.1 * torch.randn(
        z.shape, generator=torch.Generator().manual_seed(3))).to(z.dtype)
    # A collapsed batch has the zero covariance kernel, which is refused
    # (test_zero_matrix_is_refused_by_every_quantity); its Gram is rank one.
    builds = (normalized_gram, ) if case == 'collapsed' else \
        (normalized_covariance, normalized_gram)
    value = all_quantities(z, other, builds)
    assert value.dtype == torch.float64
    assert torch.isfinite(value)
    grad, = torch.autograd.grad(value, z)
    assert grad.dtype == z.dtype
    assert torch.isfinite(grad).all()


def test_collapse_reads_as_zero_entropy_and_unit_rank():
    collapsed = random_features(1, 8, 0).repeat(10, 1)
    assert matrix_entropy(normalized_gram(collapsed)).item() == \
        pytest.approx(0, abs=1e-9)
    # Every feature constant over the batch: no correlation is defined.
    assert torch.count_nonzero(normalized_covariance(collapsed)) == 0
    with pytest.raises(ValueError, match='K is the zero matrix'):
        matrix_entropy(normalized_covariance(collapsed))
    assert effective_rank(collapsed).item() == pytest.approx(1, abs=1e-6)


def test_scale_invariance_tiny_and_huge():
    z = random_features(12, 8, 0)
    for scale in (1e-8, 1e8):
        torch.testing.assert_close(
            normalized_covariance(scale * z), normalized_covariance(z))
        assert matrix_entropy(normalized_gram(scale * z)).item() == \
            pytest.approx(matrix_entropy(normalized_gram(z)).item(),
                          rel=1e-10)


def test_half_precision_inputs_give_float64_close_to_float32():
    z = random_features(32, 8, 0).float()
    k_ref = normalized_covariance(z)
    for dtype in (torch.float16, torch.bfloat16):
        k = normalized_covariance(z.to(dtype))
        assert k.dtype == torch.float64
        assert matrix_entropy(k).item() == pytest.approx(
            matrix_entropy(k_ref).item(), abs=0.02)
        # A half-precision matrix is upcast, not fed to an eig kernel.
        assert matrix_entropy(k_ref.to(dtype)).item() == pytest.approx(
            matrix_entropy(k_ref).item(), abs=0.02)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------
@pytest.mark.parametrize('bad, message', [
    (torch.ones(3, 4), r'K must be a square \(n, n\) matrix, got shape'),
    (torch.tensor([[1., 2.], [0., 1.]]), r'K must be symmetric'),
    (torch.tensor([[1., float('nan')], [float('nan'), 1.]
                   ]), r'K contains 2 non-finite'),
    (-torch.eye(3), r'K must be positive semi-definite.*-1'),
    (torch.tensor([[1., 2.], [2., 1.]]), r'K must be positive semi-definite'),
    (torch.ones(2, 2, 2), r'K must be a 2-D tensor, got shape \(2, 2, 2\)'),
    (torch.eye(3, dtype=torch.int64), r'K must be a real floating-point'),
])
@pytest.mark.parametrize('alpha', [1.0, 2.0])
def test_bad_matrix_errors_name_parameter_and_value(bad, message, alpha):
    with pytest.raises((ValueError, TypeError), match=message):
        matrix_entropy(bad, alpha)


def test_bad_arguments_errors():
    eye = torch.eye(3)
    with pytest.raises(
            ValueError,
            match=r'alpha must be a positive finite '
            r'number.*got -1'):
        matrix_entropy(eye, -1)
    with pytest.raises(ValueError, match=r'eps must be a finite number >= 0'):
        matrix_kl_divergence(eye, eye, eps=-1e-3)
    with pytest.raises(
            ValueError,
            match=r'K1 and K2 must have the same size'
            r', got 3 x 3 and 4 x 4'):
        matrix_js_divergence(eye, torch.eye(4))
    with pytest.raises(ValueError, match=r'K2 must be positive semi-definite'):
        matrix_mutual_information(eye, -eye)
    with pytest.raises(ValueError, match=r'K2 must be symmetric'):
        matrix_kl_divergence(eye, torch.triu(torch.ones(3, 3)))
    with pytest.raises(ValueError, match=r'z has 1 sample\(s\); at least 2'):
        normalized_covariance(torch.ones(1, 4))
    with pytest.raises(ValueError, match=r'x contains 1 non-finite'):
        effective_rank(torch.tensor([[1., float('inf')]]))
    with pytest.raises(
            ValueError, match=r'dtype must be torch.float32 or '
            r'torch.float64'):
        matrix_entropy(eye, dtype=torch.float16)


def test_toolbox_modules_import_only_torch_and_the_standard_library():
    import ast
    import pathlib

    import mmae_plugin.matrix_info as package
    allowed = {'torch', 'math', 'typing'}
    for path in pathlib.Path(package.__file__).parent.glob('*.py'):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split('.')[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {node.module.split('.')[0]}
            else:
                continue
            assert roots <= allowed, (path.name, roots)


# --------------------------------------------------------------------------
# Edge cases: large orders, zero matrices, zero features, huge parameters
# --------------------------------------------------------------------------
@pytest.mark.parametrize('alpha', [50.0, 500.0, 1075.0, 1e4, 1e6, 1e300])
def test_large_orders_match_the_closed_form(alpha):
    """``K = diag(2, 1, 1)``: ``p = (1/2, 1/4, 1/4)``, so ``H_alpha =
    (alpha log(1/2) + log(1 + 2^(1 - alpha))) / (1 - alpha)``, which tends
    to the min-entropy log 2 (``p ** alpha`` underflows from alpha ~1075)."""
    K = torch.diag(torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64))
    closed = (-alpha * math.log(2) + math.log1p(2.0**(1 - alpha))) / \
        (1 - alpha)
    value = matrix_entropy(K, alpha).item()
    assert value == pytest.approx(closed, rel=1e-12)
    assert 0 <= value <= math.log(3)
    # The identity stays at log n for every order, dense and factored.
    assert matrix_entropy(torch.eye(7), alpha).item() == pytest.approx(
        math.log(7), rel=1e-12)
    assert matrix_entropy(FactoredPSD(torch.eye(7)), alpha).item() == \
        pytest.approx(math.log(7), rel=1e-12)


def test_large_order_entropy_has_finite_gradient_and_is_monotone():
    k = random_correlation(6, 3).requires_grad_(True)
    values = [matrix_entropy(k, alpha) for alpha in (2.0, 50.0, 1e3, 1e6)]
    for higher, lower in zip(values[1:], values[:-1]):
        assert higher.item() <= lower.item() + 1e-12  # Renyi decreases
    grad, = torch.autograd.grad(values[-1], k)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize('alpha', [1e3, 1e6])
def test_mutual_information_at_large_orders(alpha):
    """``I(I_n; I_n) = log n + log n - log n``; random kernels stay within
    ``[.., log n]`` and finite (1e6 gave NaN: inf - inf)."""
    eye = torch.eye(5, dtype=torch.float64)
    assert matrix_mutual_information(eye, eye, alpha).item() == \
        pytest.approx(math.log(5), rel=1e-12)
    k1, k2 = random_correlation(5, 1), random_correlation(5, 2)
    value = matrix_mutual_information(k1, k2, alpha).item()
    assert math.isfinite(value) and value <= math.log(5) + 1e-12
    assert math.isfinite(matrix_joint_entropy(k1, k2, alpha).item())


ZERO = torch.zeros(4, 4, dtype=torch.float64)
EYE = torch.eye(4, dtype=torch.float64)


@pytest.mark.parametrize('name,call,argument', [
    ('entropy', lambda: matrix_entropy(ZERO), 'K'),
    ('entropy alpha 2', lambda: matrix_entropy(ZERO, 2.0), 'K'),
    ('entropy factored', lambda: matrix_entropy(
        FactoredPSD(torch.zeros(4, 2, dtype=torch.float64))), 'K'),
    ('joint', lambda: matrix_joint_entropy(ZERO, EYE), 'K1 o K2'),
    ('mutual information', lambda: matrix_mutual_information(EYE, ZERO), 'K2'),
    ('KL first', lambda: matrix_kl_divergence(ZERO, EYE), 'K1'),
    ('KL second', lambda: matrix_kl_divergence(EYE, ZERO), 'K2'),
    ('JS', lambda: matrix_js_divergence(ZERO, ZERO), 'K1'),
    ('spectrum JS', lambda: spectrum_js_divergence(EYE, ZERO), 'K2'),
    ('disjoint Hadamard', lambda: matrix_joint_entropy(
        torch.diag(torch.tensor([1., 1., 0., 0.], dtype=torch.float64)),
        torch.diag(torch.tensor([0., 0., 1., 1.], dtype=torch.float64))),
     'K1 o K2'),
])
def test_zero_matrix_is_refused_by_every_quantity(name, call, argument):
    """The zero matrix has no density matrix: no entropy 0, KL 0 or JS
    log 2 by convention, an error naming the argument instead."""
    with pytest.raises(
            ValueError,
            match=f'^{re.escape(argument)} is the '
            'zero matrix \\(trace 0\\)'):
        call()


def test_ranks_of_zero_features_are_zero_for_both_measures():
    zeros = torch.zeros(6, 3, dtype=torch.float64)
    assert effective_rank(zeros).item() == 0
    assert rankme(zeros).item() == 0
    assert rankme(zeros, eps=0.0).item() == 0
    # Any non-zero matrix has rank measures >= 1 (rank one: exactly 1).
    one = torch.zeros(6, 3, dtype=torch.float64)
    one[0, 0] = 1e-300
    assert effective_rank(one).item() == pytest.approx(1.0)
    assert rankme(one, eps=0.0).item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    'mu,words', [
        (10**400, [
            'mu', '> 0 and <= 1e+300', 'an integer of 401 digits',
            'overflows float64'
        ]),
        (1e301, ['mu', '> 0 and <= 1e+300', '1e+301']),
        (0, ['mu', '> 0', 'got 0']),
    ],
    ids=['10**400', '1e301', '0'])
def test_tcr_parameters_out_of_range_are_refused_at_build_time(mu, words):
    from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
    from mmae_plugin.models import TCRLoss
    for build in (lambda: TCRLoss(mu=mu),
                  lambda: MatrixInfoHook(tcr='paper', mu=mu),
                  lambda: total_coding_rate(torch.eye(3), mu=mu)):
        with pytest.raises(ValueError) as info:
            build()
        for word in words:
            assert word in str(info.value), (word, str(info.value))
    assert TCRLoss(mu=1e300).mu == 1e300  # the bound itself is allowed
