"""Total coding rate (TCR) of a batch of representations.

Rows of ``z`` are samples, so the paper's ``TCR_mu(Z) = logdet(mu I_d +
Z Z^T)`` (eq. 8, ``Z = z.T``) is ``logdet(mu I_d + z^T z)``.
:func:`coding_rate` is the one definition ``TCRLoss`` maximises,
``MatrixInfoHook`` logs and ``RepresentationStatistics`` reports, named by
:func:`coding_rate_key`. Pure PyTorch.
"""
import math

import torch
from torch import Tensor

from ..utils.validation import check_bool, check_choice, check_real
from .gram_logdet import (cholesky_cannot_fail, ridge_gram_logdet,
                          signed_ridge_gram_logdet)
from .validation import check_features, check_finite_result, resolve_dtype

#: ``'reference'``: ``logdet(I_d + (mu / d) zn^T zn)``, what the published
#: M-MAE code computes; ``'paper'``: ``logdet(mu I_d + zn^T zn)`` (eq. 8, 13).
TCR_FORMS = ('reference', 'paper')
#: Largest allowed ``mu``: beyond it the scaled Gram matrix (trace
#: ``mu B / d`` in the reference form) or the ridge ``mu I`` of a batch of
#: up to 1e8 unit rows could overflow float64 (max 1.8e308).
MAX_MU = 1e300


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

    One autograd node: the forward is the two divisions and the norm (bit
    for bit those of autograd's chain), the backward the closed form
    ``(g - u (u . g)) / (|z / m| m)`` per row (``u`` the unit row, ``m``
    its magnitude, held constant): 5 aten ops instead of autograd's 14.

    Args:
        z: Features (B, d), rows are samples.
        magnitude: ``row_magnitudes(z)``.

    Returns:
        Rows of unit norm, same dtype.
    """
    return _UnitRows.apply(z, magnitude)


class _UnitRows(torch.autograd.Function):
    """``(z / m) / |z / m|`` per row, ``m`` a constant (the row's largest
    magnitude), with its closed-form gradient."""

    @staticmethod
    def forward(ctx, z: Tensor, magnitude: Tensor) -> Tensor:
        rows = magnitude.unsqueeze(1)
        scaled = z / rows
        norm = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
        unit = scaled / norm
        ctx.save_for_backward(unit, norm * rows)
        return unit

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        unit, lengths = ctx.saved_tensors
        radial = (unit * grad).sum(dim=1, keepdim=True)
        return (grad - unit * radial) / lengths, None


def logdet_identity_plus(a: Tensor, mu: float) -> Tensor:
    """``logdet(mu I + a)`` for a symmetric PSD matrix ``a``.

    ``mu I + a`` has every eigenvalue >= mu > 0, so Cholesky is defined in
    exact arithmetic; where rounding still breaks it (huge-scale inputs)
    the eigenvalues, clamped at 0, give the same value with a stable
    gradient.

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


def total_coding_rate(z: Tensor,
                      mu: float = 1.0,
                      dtype: torch.dtype = torch.float64) -> Tensor:
    """Total coding rate ``TCR_mu = logdet(mu I_d + z^T z)``.

    Computed on the cheaper side of Sylvester's identity: when B < d,
    ``logdet(mu I_d + z^T z) = (d - B) log mu + logdet(mu I_B + z z^T)``.
    Differentiable; autocast is disabled and the arithmetic runs in ``dtype``
    whatever the input dtype.

    Args:
        z: Features (B, d), rows are samples.
        mu: Ridge of the coding rate, in ``(0, MAX_MU]``.
        dtype: ``torch.float64`` (default) or ``torch.float32``, the dtype
            the computation runs in.

    Returns:
        Scalar tensor in ``dtype``.
    """
    mu = check_real(mu, 'mu', minimum=0, strict=True, maximum=MAX_MU)
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
            value = logdet_identity_plus(z @ z.T if samples_side else z.T @ z,
                                         mu)
        value = offset + value
    return check_finite_result(value,
                               f'total_coding_rate(mu={mu!r}, dtype={dtype})')


def total_coding_rate_sync_free(z: Tensor,
                                mu: float,
                                frobenius_sq: float,
                                scale: float = 1.0,
                                sign: float = 1.0) -> Tensor:
    """``sign *`` :func:`total_coding_rate` of ``scale * z``, no host read.

    For the training step. Where Cholesky provably cannot fail
    (:func:`~.gram_logdet.cholesky_cannot_fail`) the value is bit for bit
    :func:`total_coding_rate`'s, in one autograd node
    (:func:`~.gram_logdet.signed_ridge_gram_logdet`); otherwise (paper form
    with a tiny ``mu``) clamped eigenvalues are used (one sync in
    ``eigvalsh``). float32 ``z`` is computed in float64 where only float64 is
    proven to factorise. The caller disables autocast.

    Args:
        z: Finite features (B, d) in float32 or float64.
        mu: Positive ridge of the coding rate.
        frobenius_sq: Bound on ``||scale z||_F^2`` (B scale^2 for unit rows).
        scale: Factor applied to ``z`` first.
        sign: ``1.0``, or ``-1.0`` for the negative rate (a loss).

    Returns:
        Scalar tensor in ``z``'s dtype (float64 when promoted); NaN if the
        factorisation failed after all.
    """
    num_samples, dim = z.shape
    samples_side = num_samples < dim
    offset = (dim - num_samples) * math.log(mu) if samples_side else 0.0
    if (z.dtype != torch.float64 and not cholesky_cannot_fail(
            num_samples, dim, frobenius_sq, mu, z.dtype)
            and cholesky_cannot_fail(num_samples, dim, frobenius_sq, mu,
                                     torch.float64)):
        # float32 is not provably safe here and float64 is: the cast keeps
        # the step free of host reads (the eigenvalue route has one).
        z = z.to(torch.float64)
    if cholesky_cannot_fail(num_samples, dim, frobenius_sq, mu, z.dtype):
        return signed_ridge_gram_logdet(z, mu, samples_side, scale, offset,
                                        sign)
    if scale != 1.0:
        z = z * scale
    gram = z @ z.T if samples_side else z.T @ z
    value = offset + torch.log(torch.linalg.eigvalsh(gram).clamp_min(0) +
                               mu).sum()
    return value if sign == 1.0 else -value


def check_coding_rate_args(form: str, mu: float, centering: bool) -> tuple:
    """Validate the three settings of :func:`coding_rate`.

    Args:
        form: One of :data:`TCR_FORMS`.
        mu: Coding-rate parameter, in ``(0, MAX_MU]``.
        centering: A bool.

    Returns:
        ``(form, float(mu), centering)``.
    """
    form = check_choice(form, 'form', TCR_FORMS)
    mu = check_real(mu, 'mu', minimum=0, strict=True, maximum=MAX_MU)
    return form, mu, check_bool(centering, 'centering')


def coding_rate_key(form: str, mu: float, centering: bool) -> str:
    """The logged name of a coding rate: ``tcr_<form>[_centered]_mu<mu>``.

    ``tcr_reference_mu1`` is the published M-MAE objective at mu 1; the
    name says everything that changes the value on the same features.

    Args:
        form: One of :data:`TCR_FORMS`.
        mu: Coding-rate parameter.
        centering: Whether the rows are centred over the batch.

    Returns:
        The key, e.g. ``'tcr_paper_centered_mu0.5'``.
    """
    form, mu, centering = check_coding_rate_args(form, mu, centering)
    return f'tcr_{form}{"_centered" if centering else ""}_mu{mu:g}'


def coding_rate_of_unit_rows(zn: Tensor,
                             form: str,
                             mu: float,
                             centering: bool,
                             sign: float = 1.0) -> Tensor:
    """:func:`coding_rate` of rows already of unit norm, sync-free.

    For the training step (``TCRLoss``): nothing is read on the host (see
    :func:`total_coding_rate_sync_free`). Runs in ``zn``'s dtype; the caller
    disables autocast. Arguments are not validated here.

    Args:
        zn: Finite unit-norm rows (B, d), float32 or float64.
        form: One of :data:`TCR_FORMS`.
        mu: Positive coding-rate parameter.
        centering: Centre the rows over the batch first.
        sign: ``1.0``, or ``-1.0`` for the negative rate (``TCRLoss``),
            folded into the log-determinant's node (bit for bit ``-rate``).

    Returns:
        Scalar tensor; NaN if the factorisation failed.
    """
    num_samples, dim = zn.shape
    if centering:
        # zn^T J zn == (J zn)^T (J zn): J = I - 11^T / B is a symmetric
        # projection. ||J zn||_F^2 <= ||zn||_F^2 = B.
        zn = zn - zn.mean(dim=0, keepdim=True)
    if form == 'paper':
        return total_coding_rate_sync_free(zn, mu, num_samples, sign=sign)
    scale = math.sqrt(mu / dim)
    return total_coding_rate_sync_free(
        zn, 1.0, num_samples * scale**2, scale=scale, sign=sign)


def coding_rate(z: Tensor,
                form: str = 'reference',
                mu: float = 1.0,
                centering: bool = False) -> Tensor:
    """Coding rate of a batch of features, the plugin's one definition.

    The rows of ``z`` are l2-normalised (:func:`unit_rows`, any scale; an
    all-zero row is refused), centred over the batch if ``centering``
    (``zn`` -> ``J_B zn``, ``J_B = I_B - 11^T / B``), then

    * ``form='reference'``: ``logdet(I_d + (mu / d) zn^T zn)``;
    * ``form='paper'``: ``logdet(mu I_d + zn^T zn)``.

    The same ``mu`` is not the same quantity in the two forms. Computed in
    float64 with autocast off, on the cheaper side of Sylvester's identity.

    Args:
        z: Features (B, d), rows are samples, any floating dtype.
        form: One of :data:`TCR_FORMS`.
        mu: Coding-rate parameter in ``(0, MAX_MU]``.
        centering: Centre the unit rows over the batch (a bool).

    Returns:
        Scalar float64 tensor, differentiable.
    """
    form, mu, centering = check_coding_rate_args(form, mu, centering)
    check_features(z)
    with torch.autocast(device_type=z.device.type, enabled=False):
        zn = unit_rows(z.to(torch.float64))
        if centering:
            zn = zn - zn.mean(dim=0, keepdim=True)
        if form == 'paper':
            return total_coding_rate(zn, mu)
        return total_coding_rate(zn * math.sqrt(mu / zn.shape[1]), 1.0)
