"""Total coding rate (TCR) of a batch of representations.

Pure PyTorch; no framework imports. Rows of ``z`` are samples, so in the
paper's notation ``Z = z.T`` and ``TCR_mu(Z) = logdet(mu I_d + Z Z^T)``
(information-flow paper, eq. 8) becomes ``logdet(mu I_d + z^T z)``.
"""
import math

import torch
from torch import Tensor

from .gram_logdet import (cholesky_cannot_fail, ridge_gram_logdet,
                          ridge_gram_logdet_flagged)
from .validation import (check_features, check_finite_result, check_real,
                         resolve_dtype)


def unit_rows(z: Tensor, name: str = 'z') -> Tensor:
    """l2-normalise the rows of ``z`` at any scale.

    ``F.normalize`` divides by ``max(norm, 1e-12)``, so rows of norm below
    1e-12 come out shorter than 1 (features at scale 1e-20 give a TCR of 0).
    Dividing first by the row's largest magnitude brings every row to a
    norm in [1, sqrt(d)] without under- or overflow; the direction, and so
    the result, is the same. That scale is held constant in the backward
    pass, which changes nothing: the result does not depend on it.

    Args:
        z: Features (B, d), rows are samples.
        name: Parameter name used in the error message.

    Returns:
        Rows of unit norm, same dtype.
    """
    magnitude = row_magnitudes(z)
    zero = magnitude == 0
    if bool(zero.any()):
        rows = zero.nonzero().flatten().tolist()
        raise ValueError(f'{name} has all-zero row(s) {rows[:10]}: a zero '
                         'vector has no direction to normalise')
    return unit_rows_unchecked(z, magnitude)


def row_magnitudes(z: Tensor) -> Tensor:
    """``max_j |z_ij|`` of every row (N,), detached; NaN or Inf for a row
    with a non-finite entry, 0 for an all-zero row."""
    return z.detach().abs().amax(dim=1)


def unit_rows_unchecked(z: Tensor, magnitude: Tensor) -> Tensor:
    """:func:`unit_rows` for rows known to be finite and non-zero.

    Reads nothing on the host (the training path checks the rows on the
    device instead).

    Args:
        z: Features (B, d), rows are samples.
        magnitude: ``row_magnitudes(z)``.

    Returns:
        Rows of unit norm, same dtype.
    """
    scaled = z / magnitude.unsqueeze(1)
    return scaled / torch.linalg.vector_norm(scaled, dim=1, keepdim=True)


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
        dtype: ``torch.float64`` (default) or ``torch.float32``, the dtype
            the computation runs in.

    Returns:
        Scalar tensor in ``dtype``.
    """
    mu = check_real(mu, 'mu', minimum=0, strict=True)
    dtype = resolve_dtype(dtype)
    check_features(z)
    num_samples, dim = z.shape
    largest = float(z.detach().abs().max())
    if largest * largest * max(num_samples, dim) > torch.finfo(dtype).max:
        raise ValueError(
            f'z is too large for total_coding_rate in {dtype}: its largest '
            f'magnitude {largest:.3g} overflows the Gram matrix; rescale z')
    with torch.autocast(device_type=z.device.type, enabled=False):
        z = z.to(dtype)
        samples_side = num_samples < dim
        offset = (dim - num_samples) * math.log(mu) if samples_side else 0.0
        # Closed-form gradient (half the cost); autograd where Cholesky fails.
        value = ridge_gram_logdet(z, mu, samples_side)
        if value is None:
            value = logdet_identity_plus(
                z @ z.T if samples_side else z.T @ z, mu)
        value = offset + value
    return check_finite_result(
        value, f'total_coding_rate(mu={mu!r}, dtype={dtype})')


def total_coding_rate_sync_free(z: Tensor, mu: float,
                                frobenius_sq: float) -> Tensor:
    """:func:`total_coding_rate` of finite ``z`` without any host read.

    For the training step: no input scan and no check of the factorisation
    on the host. Whether Cholesky can fail is decided from the shapes and
    ``frobenius_sq`` (:func:`~.gram_logdet.cholesky_cannot_fail`); where it
    provably cannot, the value is the Cholesky one, bit for bit that of
    :func:`total_coding_rate`. Otherwise (paper form with a tiny ``mu``) the
    clamped eigenvalues are used, whose kernel still checks its convergence
    on the host (one sync in torch's ``eigvalsh``). Runs in ``z``'s dtype;
    the caller disables autocast.

    Args:
        z: Finite features (B, d) in float32 or float64.
        mu: Positive ridge of the coding rate.
        frobenius_sq: Bound on ``||z||_F^2`` (B for unit rows).

    Returns:
        Scalar tensor; NaN if the factorisation failed after all.
    """
    num_samples, dim = z.shape
    samples_side = num_samples < dim
    offset = (dim - num_samples) * math.log(mu) if samples_side else 0.0
    if cholesky_cannot_fail(num_samples, dim, frobenius_sq, mu, z.dtype):
        value, _ = ridge_gram_logdet_flagged(z, mu, samples_side)
    else:
        gram = z @ z.T if samples_side else z.T @ z
        value = torch.log(torch.linalg.eigvalsh(gram).clamp_min(0) + mu).sum()
    return offset + value
