"""Independent float64 numpy/scipy implementations of the matrix quantities.

Written from the formulas of REFERENCE.md section 2 with matrix functions
(``scipy.linalg.logm``, matrix powers, ``slogdet``) rather than the
eigenvalue shortcuts of ``mmae_plugin.matrix_info``, so that tests and the
benchmark compare two different computations. Shared by
``tests/test_matrix_info.py`` and ``dev/benchmarks/bench_matrix_info.py``.
"""
import numpy as np
import scipy.linalg
from scipy.spatial.distance import jensenshannon


def density(K: np.ndarray) -> np.ndarray:
    """``K / tr K`` of the symmetric part of ``K``."""
    sym = (K + K.T) / 2
    return sym / np.trace(sym)


def von_neumann(K: np.ndarray) -> float:
    """``-tr(rho logm rho)`` (full-rank ``K``)."""
    rho = density(K)
    return float(-np.trace(rho @ np.real(scipy.linalg.logm(rho))))


def renyi(K: np.ndarray, alpha: float) -> float:
    """Matrix Renyi entropy through matrix powers (``sqrtm`` for 1/2)."""
    if alpha == 1:
        return von_neumann(K)
    rho = density(K)
    if alpha == 0.5:
        power = np.real(scipy.linalg.sqrtm(rho))
    else:
        power = np.linalg.matrix_power(rho, int(alpha))
    return float(np.log(np.trace(power)) / (1 - alpha))


def joint(K1: np.ndarray, K2: np.ndarray, alpha: float) -> float:
    """``H_alpha(K1 o K2)``."""
    return renyi(K1 * K2, alpha)


def mutual(K1: np.ndarray, K2: np.ndarray, alpha: float) -> float:
    """``H(K1) + H(K2) - H(K1 o K2)``."""
    return renyi(K1, alpha) + renyi(K2, alpha) - joint(K1, K2, alpha)


def kl(K1: np.ndarray, K2: np.ndarray, eps: float) -> float:
    """``tr[K1 (logm(K1 + eps I) - logm(K2 + eps I))]``, traces scaled to n.
    """
    n = K1.shape[0]
    eye = np.eye(n)
    k1 = n * density(K1)
    k2 = n * density(K2)
    diff = np.real(scipy.linalg.logm(k1 + eps * eye)) - \
        np.real(scipy.linalg.logm(k2 + eps * eye))
    return float(np.trace(k1 @ diff))


def js(K1: np.ndarray, K2: np.ndarray) -> float:
    """Quantum JS of the density matrices via ``logm`` entropies."""
    mix = (density(K1) + density(K2)) / 2
    return von_neumann(mix) - (von_neumann(K1) + von_neumann(K2)) / 2


def spectrum_js(K1: np.ndarray, K2: np.ndarray) -> float:
    """scipy's Jensen-Shannon of the descending normalised spectra."""
    p1 = np.sort(np.clip(np.linalg.eigvalsh(density(K1)), 0, None))[::-1]
    p2 = np.sort(np.clip(np.linalg.eigvalsh(density(K2)), 0, None))[::-1]
    return float(jensenshannon(p1, p2)**2)


def tcr(z: np.ndarray, mu: float) -> float:
    """``logdet(mu I_d + z^T z)`` by ``slogdet``."""
    sign, value = np.linalg.slogdet(mu * np.eye(z.shape[1]) + z.T @ z)
    assert sign > 0
    return float(value)


def effective_rank(x: np.ndarray) -> float:
    """``exp`` Shannon entropy of normalised singular values."""
    s = scipy.linalg.svdvals(x)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def rankme(z: np.ndarray, eps: float) -> float:
    """RankMe with ``eps`` added to every probability."""
    s = scipy.linalg.svdvals(z)
    p = s / s.sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


def normalized_covariance(z: np.ndarray) -> np.ndarray:
    """Correlation matrix with biased (ddof 0) standardisation."""
    zb = (z - z.mean(0)) / z.std(0)
    return zb.T @ zb / z.shape[0]


def normalized_gram(z: np.ndarray) -> np.ndarray:
    """Gram matrix of l2-normalised rows."""
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    return zn @ zn.T


# ---------------------------------------------------------------------------
# The named statistics of mmae_plugin.matrix_info.representation, written
# out from their definitions (float64 numpy, matrix functions where there
# are any), for tests/test_statistic_keys.py.
# ---------------------------------------------------------------------------
def pool(tokens: np.ndarray, pooling: str) -> np.ndarray:
    """'cls': token 0; 'mean': mean of tokens 1:; 'cls+mean': both."""
    cls_token, patch_mean = tokens[:, 0], tokens[:, 1:].mean(axis=1)
    return {
        'cls': cls_token,
        'mean': patch_mean,
        'cls+mean': np.concatenate([cls_token, patch_mean], 1)
    }[pooling]


def coding_rate(z: np.ndarray, form: str, mu: float, centering: bool) -> float:
    """TCR of unit rows, optionally centred; reference or paper form."""
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    if centering:
        centering_matrix = np.eye(len(zn)) - np.ones((len(zn), len(zn))) / \
            len(zn)
        gram = zn.T @ centering_matrix @ zn
    else:
        gram = zn.T @ zn
    d = z.shape[1]
    matrix = np.eye(d) + mu / d * gram if form == 'reference' else \
        mu * np.eye(d) + gram
    sign, value = np.linalg.slogdet(matrix)
    assert sign > 0
    return float(value)


def uniformity(z: np.ndarray) -> float:
    """U-MAE's uniformity loss: mean squared cosine over all row pairs."""
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    return float(np.mean((zn @ zn.T)**2))


def finite_difference_grad(f, z: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central finite differences of a scalar ``f`` at ``z``: a gradient
    that does not trust any autograd."""
    grad = np.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        grad[idx] = (f(zp) - f(zm)) / (2 * h)
    return grad


def renyi_of_spectrum(K: np.ndarray, alpha: float) -> float:
    """Renyi entropy from the eigenvalues (rank-deficient K allowed)."""
    p = np.clip(np.linalg.eigvalsh(density(K)), 0, None)
    p = p[p > 1e-14]
    if alpha == 1:
        return float(-(p * np.log(p)).sum())
    return float(np.log((p**alpha).sum()) / (1 - alpha))


def named_statistics(z: np.ndarray,
                     alpha: float = 1.0,
                     form='reference',
                     mu: float = 1.0,
                     centering: bool = False) -> dict:
    """Every one-branch key of both kernels, from its definition."""
    values = {}
    for kernel, matrix in (('gram', normalized_gram(z)),
                           ('cov', normalized_covariance(z))):
        entropy = renyi_of_spectrum(matrix, alpha)
        suffix = '' if alpha == 1 else f'_alpha{alpha:g}'
        values[f'entropy_{kernel}{suffix}'] = entropy
        values[f'erank_{kernel}'] = float(
            np.exp(renyi_of_spectrum(matrix, 1.0)))
    values['rankme_raw'] = rankme(z, 1e-7)
    key = f'tcr_{form}{"_centered" if centering else ""}_mu{mu:g}'
    values[key] = coding_rate(z, form, mu, centering)
    return values
