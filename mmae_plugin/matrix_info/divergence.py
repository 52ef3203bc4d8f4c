"""Matrix KL and Jensen-Shannon divergences (paper Definition 4, appendix B).

The zero matrix (no density matrix) is refused with a ``ValueError``.
Inputs with a non-unit diagonal are normalised by their trace: for the KL
divergence rescaled to trace n (so ``H_1(K) = log n - KL(K, I_n) / n``,
Proposition 3, holds for every PSD ``K``), for the JS divergences to
``K / tr K``. ``KL(K1 || K2) = tr[K1 (log(K1 + eps I) - log(K2 + eps I))]``:
the ridge keeps it finite for singular ``K2``, ``KL(K, K) = 0`` for every
eps, and it tends to the paper's value as eps -> 0 when the support of
``K1`` lies in that of ``K2``. Natural logarithms.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..utils.validation import check_non_negative
from .kernels import FactoredPSD, PSDInput
from .spectrum import (check_nonzero_trace, dense_symmetric, eigenvalues,
                       normalize_spectrum, prepare_input, prepared_size,
                       prepared_spectrum, shannon_entropy)
from .validation import check_eigenvalues_psd, check_same_size, resolve_dtype

#: Relative gap below which two eigenvalues are treated as equal in the
#: divided difference of the logarithm (its cancellation error is about
#: machine epsilon divided by the gap).
_EQUAL_EIGENVALUE_RTOL = 1e-6


def _log_divided_differences(mu: Tensor, log_mu: Tensor) -> Tensor:
    """First divided differences ``(log mu_i - log mu_j) / (mu_i - mu_j)``.

    On (near-)equal pairs the limit is the derivative of the logarithm; the
    geometric-mean form ``1 / sqrt(mu_i mu_j)`` is its second-order accurate
    stand-in and is symmetric.

    Args:
        mu: Positive eigenvalues (n,).
        log_mu: Their logarithms (n,).

    Returns:
        (n, n) matrix of divided differences.
    """
    gap = mu[:, None] - mu[None, :]
    close = gap.abs() <= _EQUAL_EIGENVALUE_RTOL * torch.maximum(
        mu[:, None], mu[None, :])
    safe_gap = torch.where(close, torch.ones_like(gap), gap)
    divided = (log_mu[:, None] - log_mu[None, :]) / safe_gap
    return torch.where(close, torch.rsqrt(mu[:, None] * mu[None, :]), divided)


class _TraceTimesLogm(torch.autograd.Function):
    """``tr[A log(B + eps I)]`` with a stable gradient in ``B``.

    Autograd through ``torch.linalg.eigh`` divides by eigenvalue gaps and
    returns Inf/NaN at repeated eigenvalues (identity-like or rank-deficient
    matrices, exactly the ones analysed here). The Daleckii-Krein formula
    ``grad_B = U (Gamma o U^T A U) U^T``, with ``Gamma`` the divided
    differences of the logarithm, has a finite limit there.
    """

    @staticmethod
    def forward(ctx, A: Tensor, B: Tensor, eps: float,
                b_input_dtype: Optional[torch.dtype]) -> Tensor:
        mu, vecs = torch.linalg.eigh(B)
        if b_input_dtype is not None:  # B's PSD check reuses eigh's output
            check_eigenvalues_psd(mu, 'K2', b_input_dtype)
        mu = mu.clamp_min(0) + eps
        # A singular B with eps = 0: floor the spectrum so the value stays
        # finite (huge) rather than -inf.
        floor = max(mu.numel() * torch.finfo(mu.dtype).eps * float(mu.max()),
                    torch.finfo(mu.dtype).tiny)
        mu = mu.clamp_min(floor)
        log_mu = torch.log(mu)
        log_b = (vecs * log_mu) @ vecs.T
        ctx.save_for_backward(A, vecs, mu, log_mu, log_b)
        return (A * log_b).sum()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        A, vecs, mu, log_mu, log_b = ctx.saved_tensors
        grad_a = grad * log_b if ctx.needs_input_grad[0] else None
        grad_b = None
        if ctx.needs_input_grad[1]:
            gamma = _log_divided_differences(mu, log_mu)
            rotated = vecs.T @ A @ vecs
            grad_b = grad * (vecs @ (gamma * rotated) @ vecs.T)
        return grad_a, grad_b, None, None


def _rescaled_to_trace_n(K: PSDInput, name: str,
                         dtype: Optional[torch.dtype]) -> Tensor:
    """Dense symmetric ``n K / tr K`` (zero matrix left as is), PSD-checked.

    Args:
        K: Dense or factored PSD matrix.
        name: Parameter name used in error messages.
        dtype: Compute dtype.

    Returns:
        Dense symmetric matrix with trace n; the zero matrix is refused.
    """
    if isinstance(K, FactoredPSD):
        sym = K.to(resolve_dtype(dtype)).dense()
    else:
        sym = dense_symmetric(K, name, dtype)
    trace = torch.diagonal(sym).sum()
    check_nonzero_trace(trace, name)
    return sym * (sym.shape[0] / trace)


def matrix_kl_divergence(K1: PSDInput,
                         K2: PSDInput,
                         eps: float = 1e-8,
                         dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix KL divergence ``tr[K1 (log K1 - log K2)]`` (Definition 4).

    Computed as ``tr[K1 (log(K1 + eps I) - log(K2 + eps I))]`` after rescaling
    both matrices to trace n (see the module docstring). Needs the
    eigenvectors of ``K2``, hence dense n x n matrices: factored inputs are
    expanded. Not symmetric and unbounded: prefer
    :func:`matrix_js_divergence` to compare two branches.

    Args:
        K1: First PSD matrix (n, n), dense or factored.
        K2: Second PSD matrix (n, n), dense or factored.
        eps: Ridge >= 0 added inside both logarithms; 0 is exact for a
            full-rank ``K2``.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor, differentiable in both arguments.
    """
    eps = check_non_negative(eps, 'eps')
    k1 = _rescaled_to_trace_n(K1, 'K1', dtype)
    k2 = _rescaled_to_trace_n(K2, 'K2', dtype)
    check_same_size(k1.shape[0], k2.shape[0])
    lam1 = torch.linalg.eigvalsh(k1)
    if not isinstance(K1, FactoredPSD):
        check_eigenvalues_psd(lam1, 'K1', K1.dtype)
    lam1 = lam1.clamp_min(0)
    # tr[K1 log(K1 + eps I)] is a spectral function of K1: eigenvalues only.
    shifted = lam1 + eps
    floor = max(
        lam1.numel() * torch.finfo(lam1.dtype).eps *
        float(shifted.detach().max()),
        torch.finfo(lam1.dtype).tiny)
    self_term = (lam1 * torch.log(shifted.clamp_min(floor))).sum()
    k2_dtype = None if isinstance(K2, FactoredPSD) else K2.dtype
    return self_term - _TraceTimesLogm.apply(k1, k2, eps, k2_dtype)


def _mixture(p1: PSDInput, p2: PSDInput) -> PSDInput:
    """``(rho1 + rho2) / 2`` with ``rho = K / tr K``, on its cheaper side.

    Two factors ``F1``, ``F2`` give the factor ``[F1 / sqrt(t1), F2 /
    sqrt(t2)] / sqrt(2)`` of rank <= r1 + r2, kept factored when that is
    smaller than n.

    Args:
        p1: First prepared matrix (see ``prepare_input``).
        p2: Second prepared matrix of the same size.

    Returns:
        The mixture, dense or factored (a zero matrix contributes 0).
    """
    if isinstance(p1, FactoredPSD) and isinstance(p2, FactoredPSD) and \
            p1.inner_size + p2.inner_size < p1.size:
        parts = []
        for factored in (p1, p2):
            trace = factored.trace()
            parts.append(
                factored.factor /
                trace.sqrt() if float(trace.detach()) > 0 else factored.factor)
        return FactoredPSD(torch.cat(parts, dim=1) / math.sqrt(2.0))
    densities = []
    for prepared in (p1, p2):
        sym = prepared.dense() if isinstance(prepared, FactoredPSD) \
            else prepared
        trace = torch.diagonal(sym).sum()
        densities.append(sym / trace if float(trace.detach()) > 0 else sym)
    return (densities[0] + densities[1]) / 2


def _input_dtype(K: PSDInput) -> Optional[torch.dtype]:
    """Dtype a dense input was received in; None for a factor."""
    return None if isinstance(K, FactoredPSD) else K.dtype


def matrix_js_divergence(K1: PSDInput,
                         K2: PSDInput,
                         dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix (quantum) Jensen-Shannon divergence (appendix B, Definition 8).

    ``JS = H_1((rho1 + rho2) / 2) - (H_1(rho1) + H_1(rho2)) / 2`` with
    ``rho = K / tr K`` (for unit-diagonal inputs this is the paper's
    ``H_1((K1 + K2) / 2) - (H_1(K1) + H_1(K2)) / 2``). Symmetric, zero iff
    the density matrices are equal, at most ``log 2``. Only eigenvalues are
    needed, so the gradient is stable.

    Args:
        K1: First PSD matrix (n, n), dense or factored.
        K2: Second PSD matrix (n, n), dense or factored.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor in ``[0, log 2]``, differentiable.
    """
    p1, p2 = prepare_input(K1, 'K1', dtype), prepare_input(K2, 'K2', dtype)
    check_same_size(prepared_size(p1), prepared_size(p2))
    # Eigenvalues of the inputs also validate their definiteness; the
    # mixture of PSD matrices is PSD and is not checked again.
    q1 = prepared_spectrum(p1, 'K1', _input_dtype(K1))
    q2 = prepared_spectrum(p2, 'K2', _input_dtype(K2))
    mix = prepared_spectrum(_mixture(p1, p2))
    return shannon_entropy(mix) - (shannon_entropy(q1) +
                                   shannon_entropy(q2)) / 2


def _padded_descending(p: Tensor, n: int) -> Tensor:
    """Sort descending and pad with the zero eigenvalues up to length n."""
    ordered = torch.flip(p, dims=(0, ))
    if ordered.numel() < n:
        ordered = torch.cat([ordered, ordered.new_zeros(n - ordered.numel())])
    return ordered


def spectrum_js_divergence(K1: PSDInput,
                           K2: PSDInput,
                           dtype: Optional[torch.dtype] = None) -> Tensor:
    """JS divergence between the normalised eigenvalue distributions.

    The "eigenspace" JS of the paper's appendix B: ``p1`` and ``p2`` are the
    eigenvalues of ``K1 / tr K1`` and ``K2 / tr K2`` sorted in descending
    order (the i-th largest of one branch is paired with the i-th largest of
    the other), and the classical Shannon JS divergence
    ``H((p1 + p2) / 2) - (H(p1) + H(p2)) / 2`` is returned. It ignores the
    eigenvectors: comparing it with :func:`matrix_js_divergence` separates
    differences of the spectra from differences of the eigenbases.

    Args:
        K1: First PSD matrix (n, n), dense or factored.
        K2: Second PSD matrix (n, n), dense or factored.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor in ``[0, log 2]``, differentiable.
    """
    vals1, n1 = eigenvalues(K1, 'K1', dtype)
    vals2, n2 = eigenvalues(K2, 'K2', dtype)
    check_same_size(n1, n2)
    q1 = _padded_descending(normalize_spectrum(vals1, 'K1'), n1)
    q2 = _padded_descending(normalize_spectrum(vals2, 'K2'), n2)
    return shannon_entropy(
        (q1 + q2) / 2) - (shannon_entropy(q1) + shannon_entropy(q2)) / 2
