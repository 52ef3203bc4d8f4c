"""Input checks and dtype handling of the matrix-information functions.

Every public function of :mod:`mmae_plugin.matrix_info` calls these first,
so bad input fails with a message naming the parameter, the value and what
is allowed, not a LAPACK error or a silent NaN. Checks whose meaning is
matrix-information math (Renyi order, finite 2-D features, square PSD
kernels, finite results) and the compute dtype live here; general argument
checks in :mod:`mmae_plugin.utils.validation`.
"""
import math
from typing import Optional

import torch
from torch import Tensor

from ..utils.validation import check_real

#: Floating dtype every quantity is computed in unless a caller asks otherwise.
#: fp16/bf16 have no eigendecomposition kernels and float32 loses the small
#: eigenvalues that dominate entropies of nearly collapsed representations.
DEFAULT_DTYPE = torch.float64


def check_finite_result(value: Tensor, what: str, hint: str = '') -> Tensor:
    """Return ``value`` if every entry is finite, else raise.

    Args:
        value: A computed result.
        what: What the result is (used in the message).
        hint: Which setting to change (appended to the message).

    Returns:
        ``value``.
    """
    if not bool(torch.isfinite(value.detach()).all()):
        raise ValueError(
            f'{what} is not finite ({value.detach()}); {hint}'.rstrip('; '))
    return value


def check_alpha(alpha: float, name: str = 'alpha') -> float:
    """Return ``alpha`` as a float, or raise unless it is positive and finite.

    Args:
        alpha: Order of the Renyi entropy (1 is the von Neumann entropy).
        name: Parameter name used in the error message.

    Returns:
        ``float(alpha)``.
    """
    value = check_real(alpha, name)
    if not value > 0:
        raise ValueError(f'{name} must be a positive finite number (1 is the '
                         f'von Neumann entropy), got {alpha!r}')
    return value


def check_tensor(x: Tensor, name: str, check_finite: bool = True) -> None:
    """Raise unless ``x`` is a finite floating-point 2-D tensor.

    Args:
        x: Candidate tensor.
        name: Parameter name used in the error message.
        check_finite: Also scan the values (callers that reduce ``x``
            anyway check them through :func:`raise_if_not_finite`).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f'{name} must be a torch.Tensor, got '
                        f'{type(x).__name__}')
    if x.dim() != 2:
        raise ValueError(f'{name} must be a 2-D tensor, got shape '
                         f'{tuple(x.shape)}')
    if not x.is_floating_point():
        raise TypeError(f'{name} must be a real floating-point tensor, got '
                        f'dtype {x.dtype}')
    if x.numel() == 0:
        raise ValueError(f'{name} is empty: shape {tuple(x.shape)}')
    if check_finite and not bool(torch.isfinite(x).all()):
        raise_if_not_finite(x, name)


def raise_if_not_finite(x: Tensor, name: str) -> None:
    """Raise, counting the NaN and Inf entries, if ``x`` has any."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f'{name} contains {bad} non-finite value(s) (NaN or '
                         f'Inf); only finite matrices are allowed')


def max_abs(x: Tensor) -> float:
    """``max |x|`` in one reduction, without a temporary; NaN or Inf when
    ``x`` has a non-finite entry."""
    return float(torch.linalg.vector_norm(x.detach(), ord=math.inf))


def check_features(z: Tensor, name: str = 'z', min_samples: int = 1) -> None:
    """Raise unless ``z`` is a finite (samples, features) matrix.

    Args:
        z: Candidate feature matrix (B, d), rows are samples.
        name: Parameter name used in the error messages.
        min_samples: Smallest allowed number of rows B.
    """
    check_tensor(z, name)
    if z.shape[0] < min_samples:
        raise ValueError(f'{name} has {z.shape[0]} sample(s); at least '
                         f'{min_samples} are required')


def psd_tolerance(n: int, input_dtype: torch.dtype) -> float:
    """Relative tolerance for symmetry and definiteness checks.

    Rounding in the dtype the matrix was *built* in (often fp16 under autocast)
    leaves an asymmetry and negative eigenvalues of order ``sqrt(n) eps``
    relative to the largest entry; only violations well above that are
    reported as errors, smaller ones are treated as rounding and clamped.

    Args:
        n: Matrix size.
        input_dtype: Dtype of the matrix as received.

    Returns:
        Relative tolerance in (0, 0.1].
    """
    eps = torch.finfo(input_dtype).eps if input_dtype.is_floating_point \
        else torch.finfo(torch.float32).eps
    return min(0.1, max(1e-6, 10.0 * math.sqrt(n) * eps))


def check_square(K: Tensor, name: str) -> None:
    """Raise unless ``K`` is a square floating-point matrix (no value scan).

    Args:
        K: Candidate matrix.
        name: Parameter name used in the error message.
    """
    check_tensor(K, name, check_finite=False)
    rows, cols = K.shape
    if rows != cols:
        raise ValueError(f'{name} must be a square (n, n) matrix, got shape '
                         f'{tuple(K.shape)}; to analyse features of shape '
                         f'(B, d) build a matrix first with normalized_'
                         f'covariance(z) or normalized_gram(z)')


def check_finite_symmetric(K: Tensor, sym: Tensor, name: str,
                           input_dtype: torch.dtype) -> None:
    """Raise unless ``K`` is finite and numerically symmetric.

    Two reductions and no transposed pass: ``max |K|`` (NaN or Inf if any
    entry is) and ``max |K - K^T| = 2 max |K - sym|`` from the symmetric part
    the caller needs anyway.

    Args:
        K: Square matrix, in the compute dtype.
        sym: Its symmetric part ``(K + K^T) / 2``.
        name: Parameter name used in the error message.
        input_dtype: Dtype the matrix was received in (sets the tolerance).
    """
    scale = max_abs(K)
    if not math.isfinite(scale):
        raise_if_not_finite(K, name)
    tol = psd_tolerance(K.shape[0], input_dtype)
    asym = 2 * max_abs(K.detach() - sym.detach())
    if asym > tol * scale:
        raise ValueError(f'{name} must be symmetric: max |{name} - {name}.T| '
                         f'= {asym:.3g} exceeds {tol:.1g} x max |{name}| '
                         f'({scale:.3g})')


def check_eigenvalues_psd(eigvals: Tensor, name: str,
                          input_dtype: torch.dtype) -> None:
    """Raise if eigenvalues show that a matrix is clearly not PSD.

    Args:
        eigvals: Eigenvalues of the (symmetrised) matrix, any order.
        name: Parameter name used in the error message.
        input_dtype: Dtype of the matrix as received (sets the tolerance).
    """
    vals = eigvals.detach()
    largest = float(vals.abs().max())
    smallest = float(vals.min())
    tol = psd_tolerance(vals.numel(), input_dtype)
    if smallest < -tol * largest:
        raise ValueError(f'{name} must be positive semi-definite: its '
                         f'smallest eigenvalue is {smallest:.4g} while the '
                         f'largest magnitude is {largest:.4g} (allowed: '
                         f'eigenvalues >= -{tol:.1g} x largest, rounding)')


def check_same_size(n1: int,
                    n2: int,
                    name1: str = 'K1',
                    name2: str = 'K2') -> None:
    """Raise unless two matrices have the same size.

    Args:
        n1: Size of the first matrix.
        n2: Size of the second matrix.
        name1: Name of the first parameter.
        name2: Name of the second parameter.
    """
    if n1 != n2:
        raise ValueError(f'{name1} and {name2} must have the same size, got '
                         f'{n1} x {n1} and {n2} x {n2}')


def resolve_dtype(dtype: Optional[torch.dtype],
                  name: str = 'dtype') -> torch.dtype:
    """Return the compute dtype, float64 when ``dtype`` is None.

    Args:
        dtype: Requested dtype or None.
        name: Parameter name used in the error message.

    Returns:
        ``torch.float32`` or ``torch.float64``.
    """
    dtype = DEFAULT_DTYPE if dtype is None else dtype
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f'{name} must be torch.float32 or torch.float64 (no '
                         f'half-precision eigen kernels exist), got {dtype!r}')
    return dtype


def to_compute_dtype(x: Tensor, dtype: Optional[torch.dtype]) -> Tensor:
    """Upcast ``x`` to the compute dtype (float64 unless given).

    Args:
        x: Tensor in any floating dtype (fp16 and bf16 included).
        dtype: Target dtype; ``None`` means :data:`DEFAULT_DTYPE`.

    Returns:
        ``x`` in the compute dtype (differentiable cast).
    """
    return x.to(resolve_dtype(dtype))
