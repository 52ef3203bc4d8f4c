"""Independent float64 numpy/scipy implementations of the matrix quantities.

Written from the formulas of REFERENCE.md section 2 with matrix functions
(``scipy.linalg.logm``, matrix powers, ``slogdet``) rather than the
eigenvalue shortcuts of ``mmae_plugin.matrix_info``, so that tests and the
benchmark compare two different computations. Shared by
``tests/test_matrix_info.py`` and ``tools/benchmarks/bench_matrix_info.py``.
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
    """``tr[K1 (logm(K1 + eps I) - logm(K2 + eps I))]``, traces rescaled to n."""
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
    return float(jensenshannon(p1, p2) ** 2)


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
