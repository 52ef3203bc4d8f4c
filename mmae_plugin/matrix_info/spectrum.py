"""Normalised spectra of PSD matrices and entropies of distributions.

Turns a dense or factored PSD matrix into the spectrum of its density
matrix ``rho = K / tr K`` (on the cheaper side of ``F F^T`` / ``F^T F``),
with the guards every quantity shares: only eigenvalues are computed
(finite gradients at repeated eigenvalues), they are clamped at 0, and
probabilities below a noise floor ``n eps max(p)`` count as 0 inside
logarithms and negative powers (finite values and gradients at singular
matrices).
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .kernels import FactoredPSD, PSDInput
from .validation import (check_eigenvalues_psd, check_finite_symmetric,
                         check_square, max_abs, psd_tolerance, resolve_dtype,
                         to_compute_dtype)


def dense_symmetric(K: Tensor,
                    name: str,
                    dtype: Optional[torch.dtype] = None) -> Tensor:
    """Validate a dense matrix and return its symmetric part in ``dtype``.

    Args:
        K: Square, symmetric, finite matrix (any floating dtype).
        name: Parameter name used in error messages.
        dtype: Compute dtype (float64 by default).

    Returns:
        ``(K + K^T) / 2`` in the compute dtype.
    """
    check_square(K, name)
    k = to_compute_dtype(K, dtype)
    sym = (k + k.T).mul_(0.5)  # == (k + k.T) / 2 exactly, one temporary less
    check_finite_symmetric(k, sym, name, K.dtype)
    return sym


def check_psd_by_cholesky(sym: Tensor, name: str,
                          input_dtype: torch.dtype) -> None:
    """Raise unless ``sym`` is PSD up to rounding, without eigenvalues.

    A Cholesky factorisation of ``sym + tol |sym| I`` costs a fraction of an
    eigendecomposition; only when it fails are the eigenvalues computed, to
    produce an exact error message (or to accept a borderline rounding case).

    Args:
        sym: Symmetric matrix in the compute dtype.
        name: Parameter name used in the error message.
        input_dtype: Dtype of the matrix as received (sets the tolerance).
    """
    n = sym.shape[0]
    detached = sym.detach()
    scale = max_abs(detached)
    if scale == 0:
        return
    ridge = psd_tolerance(n, input_dtype) * scale
    # Shift the diagonal of one copy: no n x n identity, no second full pass.
    shifted = detached.clone()
    shifted.diagonal().add_(ridge)
    _, info = torch.linalg.cholesky_ex(shifted)
    if int(info) != 0:
        check_eigenvalues_psd(
            torch.linalg.eigvalsh(detached), name, input_dtype)


def eigenvalues(K: PSDInput,
                name: str,
                dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, int]:
    """Non-negative eigenvalues of a PSD matrix, on its cheaper side.

    Args:
        K: Dense (n, n) PSD matrix or :class:`FactoredPSD`.
        name: Parameter name used in error messages.
        dtype: Compute dtype (float64 by default).

    Returns:
        ``(eigvals, n)``: ascending eigenvalues clamped at 0 (``min(n, r)`` of
        them for a factor with r columns; the others are exactly 0) and the
        matrix size n.
    """
    if isinstance(K, FactoredPSD):
        small = K.to(resolve_dtype(dtype)).small_gram()
        vals = torch.linalg.eigvalsh((small + small.T) / 2)
        return vals.clamp_min(0), K.size
    sym = dense_symmetric(K, name, dtype)
    vals = torch.linalg.eigvalsh(sym)
    check_eigenvalues_psd(vals, name, K.dtype)
    return vals.clamp_min(0), sym.shape[0]


def prepare_input(K: PSDInput, name: str,
                  dtype: Optional[torch.dtype]) -> PSDInput:
    """Factor cast to the compute dtype, or the checked symmetric matrix.

    Args:
        K: Dense (n, n) matrix or :class:`FactoredPSD`.
        name: Parameter name used in error messages.
        dtype: Compute dtype.

    Returns:
        :class:`FactoredPSD` or dense symmetric tensor in the compute dtype
        (square, symmetric and finite; definiteness is checked by the
        caller, once).
    """
    if isinstance(K, FactoredPSD):
        return K.to(resolve_dtype(dtype))
    return dense_symmetric(K, name, dtype)


def prepared_size(prepared: PSDInput) -> int:
    """Side n of a prepared matrix."""
    if isinstance(prepared, FactoredPSD):
        return prepared.size
    return prepared.shape[0]


def prepared_spectrum(prepared: PSDInput,
                      name: str = '',
                      input_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Density-matrix eigenvalues of a prepared matrix (cheaper side).

    Args:
        prepared: Output of :func:`prepare_input` or of a Hadamard product.
        name: Parameter name used in the PSD error message.
        input_dtype: Dtype the dense matrix was received in; ``None`` means
            it is PSD by construction (a factor, a Hadamard product of PSD
            matrices) and is not checked.

    Returns:
        Probabilities summing to 1.
    """
    if isinstance(prepared, FactoredPSD):
        small = prepared.small_gram()
        vals = torch.linalg.eigvalsh((small + small.T) / 2)
    else:
        vals = torch.linalg.eigvalsh(prepared)
        if input_dtype is not None:
            check_eigenvalues_psd(vals, name, input_dtype)
    return normalize_spectrum(vals.clamp_min(0), name)


ZERO_MATRIX_HINT = (
    'it has no density matrix K / tr K, so its entropies and divergences '
    'are undefined (a zero covariance kernel means every feature is '
    'constant over the batch; a zero Gram kernel, all-zero features)')


class ZeroMatrixError(ValueError):
    """A PSD matrix argument is the zero matrix, which has no density
    matrix (its entropies and divergences are undefined)."""


def check_nonzero_trace(trace: Tensor, name: str) -> None:
    """Raise :class:`ZeroMatrixError` if a PSD matrix has trace 0.

    Args:
        trace: Its trace (a scalar tensor).
        name: Parameter name used in the error message.
    """
    if not float(trace.detach()) > 0:
        raise ZeroMatrixError(f'{name or "the matrix"} is the zero matrix '
                              f'(trace 0): {ZERO_MATRIX_HINT}')


def normalize_spectrum(eigvals: Tensor, name: str = '') -> Tensor:
    """Eigenvalues of ``K`` -> eigenvalues of ``rho = K / tr K`` (sum 1).

    The zero matrix has no density matrix and is refused (``ValueError``
    naming the parameter). The result stays attached to the graph.

    Args:
        eigvals: Non-negative eigenvalues.
        name: Parameter name used in the error message.

    Returns:
        Probabilities of the same length.
    """
    total = eigvals.sum()
    check_nonzero_trace(total, name)
    return eigvals / total


def _noise_floor(p: Tensor) -> Tensor:
    """``len(p) eps max(p)``: eigenvalues below it are rounding noise."""
    floor = (p.numel() * torch.finfo(p.dtype).eps) * p.detach().max()
    return torch.clamp_min(floor, torch.finfo(p.dtype).tiny)


def _split_at_noise_floor(p: Tensor) -> Tuple[Tensor, Tensor]:
    """Probabilities with noise set to 0, and a copy floored for logs.

    eigvalsh resolves eigenvalues only to about ``n eps max``; below that a
    zero eigenvalue comes out as +-1e-16 noise, which ``p ** alpha`` with
    alpha < 1 would inflate. The floored copy keeps ``log p`` and
    ``p ** (alpha - 1)`` finite, so values and gradients are finite at
    singular matrices.

    Args:
        p: Non-negative probabilities summing to 1.

    Returns:
        ``(cleaned, floored)`` of the same shape.
    """
    floor = _noise_floor(p)
    cleaned = torch.where(p < floor, torch.zeros_like(p), p)
    return cleaned, torch.maximum(p, floor)


def shannon_entropy(p: Tensor) -> Tensor:
    """``-sum p log p`` (nats) of a probability vector, 0 log 0 = 0.

    Args:
        p: Non-negative probabilities summing to 1.

    Returns:
        Scalar tensor.
    """
    cleaned, floored = _split_at_noise_floor(p)
    return -(cleaned * torch.log(floored)).sum()


def renyi_entropy(p: Tensor, alpha: float) -> Tensor:
    """Renyi entropy ``log(sum p^alpha) / (1 - alpha)`` (Shannon at 1).

    Args:
        p: Non-negative probabilities summing to 1.
        alpha: Positive order.

    Returns:
        Scalar tensor.
    """
    if alpha == 1.0:
        return shannon_entropy(p)
    return log_power_sum(p, alpha) / (1.0 - alpha)


def log_power_sum(p: Tensor, alpha: float) -> Tensor:
    """``log sum p^alpha``, stable for every positive ``alpha``.

    Computed as ``alpha log c + log sum (p / c)^alpha`` with ``c = max p``
    (held constant in the backward pass; the value does not depend on it):
    the largest term of the scaled sum is 1, so it neither underflows (``p
    ** alpha`` is 0 in float64 for ``p <= 1/2`` once alpha exceeds about
    1075, which made the entropy infinite) nor overflows.

    Args:
        p: Non-negative probabilities summing to 1.
        alpha: Positive order.

    Returns:
        Scalar tensor.
    """
    # p * p^(alpha-1) with the floored base keeps the alpha < 1 gradient
    # alpha p^(alpha-1) finite at p = 0 (its exact value there is infinite).
    cleaned, floored = _split_at_noise_floor(p)
    scale = p.detach().max()
    scaled_sum = ((cleaned / scale) * (floored / scale).pow(alpha - 1.0)).sum()
    return alpha * torch.log(scale) + torch.log(scaled_sum)


def purity(K: PSDInput,
           name: str,
           dtype: Optional[torch.dtype] = None) -> Tensor:
    """``tr(rho^2) = ||K||_F^2 / (tr K)^2`` without an eigendecomposition.

    Args:
        K: Dense (n, n) PSD matrix or :class:`FactoredPSD`.
        name: Parameter name used in error messages.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor in (0, 1]; the zero matrix is refused.
    """
    if isinstance(K, FactoredPSD):
        small = K.to(resolve_dtype(dtype)).small_gram()
        frob_sq, trace = small.pow(2).sum(), torch.diagonal(small).sum()
    else:
        sym = dense_symmetric(K, name, dtype)
        check_psd_by_cholesky(sym, name, K.dtype)
        frob_sq, trace = sym.pow(2).sum(), torch.diagonal(sym).sum()
    check_nonzero_trace(trace, name)
    return frob_sq / trace.pow(2)


def max_entropy(n: int) -> float:
    """``log n``: entropy of the maximally mixed state ``I_n / n``."""
    return math.log(n)
