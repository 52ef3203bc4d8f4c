"""``logdet(mu I + Gram(z))`` with a hand-written gradient.

The closed-form gradient ``2 z S^-1`` (``S = mu I + z^T z``) from the
Cholesky factor costs one matrix product instead of autograd's two and its
triangular solves; the value is bit for bit the autograd one. Nothing reads
a device value on the host (``cholesky_ex``, triangular solves without
error checks). Measured: docs/performance.md#the-components.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor


class _RidgeGramLogdet(torch.autograd.Function):
    """``2 sum log diag(chol)`` with ``chol chol^T = mu I + Gram(z)``."""

    @staticmethod
    def forward(ctx, z: Tensor, chol: Tensor, samples_side: bool) -> Tensor:
        ctx.samples_side = samples_side
        ctx.save_for_backward(z, chol)
        return 2.0 * torch.log(torch.diagonal(chol)).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        z, chol = ctx.saved_tensors
        # S^-1 is symmetric: z S^-1 = (S^-1 z^T)^T for z^T z, S^-1 z for
        # z z^T; S^-1 x = L^-T (L^-1 x), two triangular solves.
        rhs = z if ctx.samples_side else z.T
        half = torch.linalg.solve_triangular(chol, rhs, upper=False)
        solved = torch.linalg.solve_triangular(chol.T, half, upper=True)
        grad_z = solved if ctx.samples_side else solved.T
        return grad_z * (2.0 * grad), None, None


class _SignedRidgeGramLogdet(torch.autograd.Function):
    """``sign (offset + logdet(ridge I + Gram(scale z)))``, for a
    factorisation known to succeed (:func:`cholesky_cannot_fail`).

    One autograd node for what is otherwise a chain of them (scaling, the
    logdet, the offset, the sign): the forward is the same ops, bit for bit,
    as scaling ``z``, :func:`ridge_gram_logdet_flagged` and negating; the
    backward is the closed form ``2 sign scale grad (scale z) S^-1`` (or
    ``S^-1 (scale z)`` on the samples' side) from two triangular solves.
    """

    @staticmethod
    def forward(ctx, z: Tensor, scale: float, ridge: float, samples_side: bool,
                offset: float, sign: float) -> Tensor:
        scaled = z * scale if scale != 1.0 else z
        gram = scaled @ scaled.T if samples_side else scaled.T @ scaled
        gram.diagonal().add_(ridge)
        chol, _ = torch.linalg.cholesky_ex(gram)
        # sign * (2 x): exact, as is sign * (offset + v) = sign v + sign
        # offset in round-to-nearest.
        value = (2.0 * sign) * torch.log(torch.diagonal(chol)).sum()
        if offset != 0.0:
            value = value + sign * offset
        ctx.save_for_backward(scaled, chol)
        ctx.samples_side = samples_side
        ctx.factor = 2.0 * sign * scale
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        scaled, chol = ctx.saved_tensors
        rhs = scaled if ctx.samples_side else scaled.T
        half = torch.linalg.solve_triangular(chol, rhs, upper=False)
        solved = torch.linalg.solve_triangular(chol.T, half, upper=True)
        direction = solved if ctx.samples_side else solved.T
        return direction * (grad * ctx.factor), None, None, None, None, None


def signed_ridge_gram_logdet(z: Tensor,
                             ridge: float,
                             samples_side: bool,
                             scale: float = 1.0,
                             offset: float = 0.0,
                             sign: float = 1.0) -> Tensor:
    """``sign * (offset + logdet(ridge I + Gram(scale z)))`` in one node.

    For a factorisation that cannot fail (decide with
    :func:`cholesky_cannot_fail`): nothing is checked, on the device or the
    host. The value equals, bit for bit, ``sign * (offset +
    ridge_gram_logdet_flagged(scale * z, ridge, samples_side)[0])``; the
    forward and backward dispatch 10 and 7 aten ops (d-side), against 17
    and 11 for that chain with its failure masks.

    Args:
        z: Features (B, d) in the compute dtype.
        ridge: Positive ridge.
        samples_side: Use the B x B Gram ``z z^T`` instead of ``z^T z``.
        scale: Factor applied to ``z`` first.
        offset: Added to the log-determinant (Sylvester's ``(d - B) log``).
        sign: ``1.0`` or ``-1.0`` (a loss that maximises the rate).

    Returns:
        Scalar tensor in ``z``'s dtype.
    """
    if sign not in (1.0, -1.0):
        raise ValueError(f'sign must be 1.0 or -1.0, got {sign!r}')
    return _SignedRidgeGramLogdet.apply(z, float(scale), float(ridge),
                                        bool(samples_side), float(offset),
                                        float(sign))


def _ridge_gram_cholesky(z: Tensor, mu: float,
                         samples_side: bool) -> Tuple[Tensor, Tensor]:
    """Cholesky factor of ``mu I + Gram(z)`` and LAPACK's ``info`` (0: ok)."""
    with torch.no_grad():
        shifted = z @ z.T if samples_side else z.T @ z
        shifted.diagonal().add_(mu)
        return torch.linalg.cholesky_ex(shifted)


def ridge_gram_logdet(z: Tensor, mu: float,
                      samples_side: bool) -> Optional[Tensor]:
    """``logdet(mu I + z^T z)`` (or ``mu I + z z^T`` with ``samples_side``).

    Reads the factorisation's status on the host (one sync); the training
    path uses :func:`ridge_gram_logdet_flagged` instead.

    Args:
        z: Features (B, d) in the compute dtype.
        mu: Positive ridge.
        samples_side: Use the B x B Gram ``z z^T`` instead of ``z^T z``.

    Returns:
        Scalar tensor, or ``None`` when rounding breaks the Cholesky
        factorisation (the caller then takes the eigenvalue route).
    """
    chol, info = _ridge_gram_cholesky(z, mu, samples_side)
    if int(info) != 0:
        return None
    return _RidgeGramLogdet.apply(z, chol, samples_side)


def ridge_gram_logdet_flagged(z: Tensor, mu: float,
                              samples_side: bool) -> Tuple[Tensor, Tensor]:
    """:func:`ridge_gram_logdet` without reading anything on the host.

    Where the factorisation fails, the value is NaN and the factor used by
    the backward is replaced by the identity, so a caller that discards the
    value (``torch.where``) also gets a finite, zero gradient.

    Args:
        z: Features (B, d) in the compute dtype.
        mu: Positive ridge.
        samples_side: Use the B x B Gram ``z z^T`` instead of ``z^T z``.

    Returns:
        The scalar value and a boolean scalar tensor, True where the
        Cholesky factorisation succeeded.
    """
    chol, info = _ridge_gram_cholesky(z, mu, samples_side)
    ok = info == 0
    eye = torch.eye(chol.shape[0], dtype=chol.dtype, device=chol.device)
    value = _RidgeGramLogdet.apply(z, torch.where(ok, chol, eye), samples_side)
    return torch.where(ok, value, math.nan), ok


def _gamma(k: int, unit_roundoff: float) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)`` (rounding of a k-term sum)."""
    return k * unit_roundoff / (1.0 - k * unit_roundoff)


def cholesky_cannot_fail(num_samples: int, dim: int, frobenius_sq: float,
                         mu: float, dtype: torch.dtype) -> bool:
    """Whether floating-point Cholesky of ``mu I + Gram(z)`` must succeed.

    For ``z`` (N, d) with ``||z||_F^2 <= F``, the computed matrix of size
    ``n = min(N, d)`` has every eigenvalue at least ``lo = mu - gamma_m F -
    u (mu + F)`` (``m = max(N, d)``) and every diagonal entry at most
    ``mu + F``. By Demmel's theorem (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., Thm 10.7) Cholesky completes when
    ``lo / (mu + F)`` exceeds ``n gamma_{n+1} / (1 - gamma_{n+1})``; we ask
    for twice that (covering the normalisation's and centering's rounding).
    Decided from shapes only, no device sync. For unit rows in float64 it
    fails only for ``mu`` below about ``1e-16 n^2 N`` (the paper form with a
    tiny ``mu``, never the reference form).

    Args:
        num_samples: N, rows of ``z``.
        dim: d, columns of ``z``.
        frobenius_sq: Bound on ``||z||_F^2``.
        mu: Positive ridge.
        dtype: Floating dtype of the computation.

    Returns:
        True when the factorisation provably succeeds.
    """
    u = torch.finfo(dtype).eps / 2
    n, m = min(num_samples, dim), max(num_samples, dim)
    if max(m, n + 1) * u >= 0.5:
        return False
    lowest = mu - _gamma(m, u) * frobenius_sq - u * (mu + frobenius_sq)
    needed = n * _gamma(n + 1, u) / (1.0 - _gamma(n + 1, u))
    return lowest > 2.0 * needed * (mu + frobenius_sq)
