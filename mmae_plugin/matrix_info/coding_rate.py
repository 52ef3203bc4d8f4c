"""Total coding rate (TCR) of a batch of representations.

Pure PyTorch; no framework imports. Rows of ``z`` are samples, so in the
paper's notation ``Z = z.T`` and ``TCR_mu(Z) = logdet(mu I_d + Z Z^T)``
(information-flow paper, eq. 8) becomes ``logdet(mu I_d + z^T z)``.
"""
import math

import torch
from torch import Tensor

from .validation import check_features


def logdet_identity_plus(a: Tensor, mu: float) -> Tensor:
    """``logdet(mu I + a)`` for a symmetric PSD matrix ``a``.

    ``mu I + a`` has every eigenvalue >= mu > 0, so Cholesky is defined in exact
    arithmetic; where rounding still breaks it (huge-scale inputs) the
    eigenvalues, clamped at 0, give the same value with a stable gradient.

    Args:
        a: Symmetric positive semi-definite matrix (n, n).
        mu: Positive ridge.

    Returns:
        Scalar tensor.
    """
    n = a.shape[-1]
    shifted = a + mu * torch.eye(n, dtype=a.dtype, device=a.device)
    chol, info = torch.linalg.cholesky_ex(shifted)
    if int(info) == 0:
        return 2.0 * torch.log(torch.diagonal(chol)).sum()
    eigvals = torch.linalg.eigvalsh(a).clamp_min(0)
    return torch.log(eigvals + mu).sum()


def total_coding_rate(z: Tensor, mu: float = 1.0,
                      dtype: torch.dtype = torch.float64) -> Tensor:
    """Total coding rate ``TCR_mu = logdet(mu I_d + z^T z)``.

    Computed on the cheaper side of Sylvester's identity: when B < d,
    ``logdet(mu I_d + z^T z) = (d - B) log mu + logdet(mu I_B + z z^T)``.
    Differentiable; autocast is disabled and the arithmetic runs in ``dtype``
    whatever the input dtype.

    Args:
        z: Features (B, d), rows are samples.
        mu: Positive ridge of the coding rate.
        dtype: Floating dtype the computation runs in (float64 by default).

    Returns:
        Scalar tensor in ``dtype``.
    """
    if not mu > 0 or not math.isfinite(mu):
        raise ValueError(f'mu must be a positive finite number, got {mu!r}')
    check_features(z)
    num_samples, dim = z.shape
    with torch.autocast(device_type=z.device.type, enabled=False):
        z = z.to(dtype)
        if num_samples < dim:
            small = z @ z.T
            return (dim - num_samples) * math.log(mu) + \
                logdet_identity_plus(small, mu)
        return logdet_identity_plus(z.T @ z, mu)
