"""Input checks and dtype handling shared by the matrix-information functions.

Every public function calls these first so that bad input fails with a message
naming the parameter, what was received and what is allowed, instead of a
cryptic LAPACK error or a silent NaN deep inside an eigendecomposition.
"""
import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

#: Floating dtype every quantity is computed in unless a caller asks otherwise.
#: fp16/bf16 have no eigendecomposition kernels and float32 loses the small
#: eigenvalues that dominate entropies of nearly collapsed representations.
DEFAULT_DTYPE = torch.float64


def _describe(value: Any) -> str:
    return f'{type(value).__name__} {value!r}'


def _is_numpy_scalar(value: Any, kinds: str) -> bool:
    """Whether ``value`` is a numpy scalar of one of the dtype ``kinds``."""
    dtype = getattr(value, 'dtype', None)
    return (not isinstance(value, Tensor) and getattr(value, 'ndim', 1) == 0
            and getattr(dtype, 'kind', '') in kinds)


def _is_real(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or _is_numpy_scalar(value, 'iuf')


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or _is_numpy_scalar(value, 'iu')


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool, else raise a clear ``TypeError``.

    Strings such as ``'no'`` and numbers are refused: they are truthy or
    falsy by accident, not by the user's intent.

    Args:
        value: Candidate flag.
        name: Parameter name used in the error message.

    Returns:
        ``value``.
    """
    if not isinstance(value, bool):
        raise TypeError(f'{name} must be True or False, got '
                        f'{_describe(value)}')
    return value


def check_real(value: Any, name: str, *, minimum: Optional[float] = None,
               strict: bool = False, maximum: Optional[float] = None) -> float:
    """Return ``value`` as a float, or raise unless it is an allowed number.

    Booleans, strings, tensors and complex numbers are refused
    (``TypeError``); NaN, infinities and values outside the bounds are
    refused (``ValueError``).

    Args:
        value: Candidate number.
        name: Parameter name used in the error message.
        minimum: Smallest allowed value (None: no bound).
        strict: The minimum itself is excluded.
        maximum: Largest allowed value, included (None: no bound).

    Returns:
        ``float(value)``.
    """
    if not _is_real(value):
        raise TypeError(f'{name} must be a real number, got '
                        f'{_describe(value)}')
    allowed = _allowed_range(minimum, strict, maximum)
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64, e.g. 10**400
        raise ValueError(f'{name} must be a finite number {allowed}, got '
                         f'{_short_repr(value)}, which overflows float64'
                         ) from None
    low_ok = minimum is None or (number > minimum if strict
                                 else number >= minimum)
    high_ok = maximum is None or number <= maximum
    if not (math.isfinite(number) and low_ok and high_ok):
        raise ValueError(f'{name} must be a finite number {allowed}, got '
                         f'{_short_repr(value)}')
    return number


def _allowed_range(minimum: Optional[float], strict: bool,
                   maximum: Optional[float]) -> str:
    """``'> 0 and <= 1e+300'``: the bounds of :func:`check_real` in words."""
    bounds = []
    if minimum is not None:
        bounds.append(f'{">" if strict else ">="} {minimum:g}')
    if maximum is not None:
        bounds.append(f'<= {maximum:g}')
    return ' and '.join(bounds) or 'finite'


def _short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)``, a huge integer shortened to its magnitude."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if _is_integer(value):
        return f'{text[:8]}... (an integer of {len(text.lstrip("-"))} digits)'
    return text[:limit] + '...'


def check_int(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """Return ``value`` as an int, or raise unless it is an allowed integer.

    Args:
        value: Candidate integer (bools and floats are refused).
        name: Parameter name used in the error message.
        minimum: Smallest allowed value (None: no bound).

    Returns:
        ``int(value)``.
    """
    if not _is_integer(value):
        raise TypeError(f'{name} must be an integer, got {_describe(value)}')
    if minimum is not None and value < minimum:
        raise ValueError(f'{name} must be an integer >= {minimum}, got '
                         f'{value!r}')
    return int(value)


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise.

    Args:
        value: Candidate string.
        name: Parameter name used in the error message.
        choices: The allowed strings.

    Returns:
        ``value``.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f'{name} must be one of {tuple(choices)}, got '
                         f'{_describe(value)}')
    return value


def _is_config(value: Any) -> bool:
    return isinstance(value, dict) and 'type' in value


def check_config(cfg: Any, name: str, optional: bool = False) -> Any:
    """Return ``cfg`` if it is a registry config (a dict with ``'type'``).

    Args:
        cfg: Candidate config.
        name: Parameter name used in the error message.
        optional: ``None`` is allowed too.

    Returns:
        ``cfg``.
    """
    if (cfg is None and optional) or _is_config(cfg):
        return cfg
    allowed = 'None or ' if optional else ''
    raise TypeError(f'{name} must be {allowed}a config dict with a "type" '
                    f'key, got {_describe(cfg)}')


def check_init_cfg(init_cfg: Any, name: str = 'init_cfg') -> Any:
    """Return ``init_cfg`` if mmengine can use it, else raise.

    Allowed: ``None``, a dict with a ``'type'`` key, or a non-empty list of
    such dicts (as mmengine's ``BaseModule`` takes).

    Args:
        init_cfg: Candidate initialisation config.
        name: Parameter name used in the error message.

    Returns:
        ``init_cfg``.
    """
    if init_cfg is None or _is_config(init_cfg):
        return init_cfg
    if isinstance(init_cfg, list) and init_cfg and all(
            _is_config(item) for item in init_cfg):
        return init_cfg
    raise TypeError(f'{name} must be None, a dict with a "type" key or a '
                    f'non-empty list of such dicts, got '
                    f'{_describe(init_cfg)}')


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
        raise ValueError(f'{what} is not finite ({value.detach()}); {hint}'
                         .rstrip('; '))
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


def check_non_negative(value: float, name: str) -> float:
    """Return ``value`` as a float, or raise unless it is finite and >= 0.

    Args:
        value: Candidate number (a ridge, an epsilon).
        name: Parameter name used in the error message.

    Returns:
        ``float(value)``.
    """
    return check_real(value, name, minimum=0)


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


def check_same_size(n1: int, n2: int, name1: str = 'K1',
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
