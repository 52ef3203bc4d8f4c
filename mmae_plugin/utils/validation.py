"""General argument checks shared by every part of the plugin.

Checks of plain Python arguments that mean the same thing wherever they are
met (a bool flag, an integer size, a bounded finite real, one of a few
strings, a registry config, an ``init_cfg``), so that a bad argument fails
at construction naming the parameter, the value and what is allowed.
Matrix-information checks live in :mod:`mmae_plugin.matrix_info.validation`;
component-specific ones in their component. Imports only the standard
library and ``torch``, so the framework-free subpackages can use it.
"""
import math
from typing import Any, Optional, Sequence

from torch import Tensor


def _describe(value: Any) -> str:
    """The type and repr of ``value`` (``str 'no'``), for messages."""
    return f'{type(value).__name__} {value!r}'


def _is_numpy_scalar(value: Any, kinds: str) -> bool:
    """Whether ``value`` is a numpy scalar of one of the dtype ``kinds``."""
    dtype = getattr(value, 'dtype', None)
    return (not isinstance(value, Tensor) and getattr(value, 'ndim', 1) == 0
            and getattr(dtype, 'kind', '') in kinds)


def _is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (a bool is not)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or _is_numpy_scalar(value, 'iuf')


def _is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer (a bool is not)."""
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


def check_real(value: Any,
               name: str,
               *,
               minimum: Optional[float] = None,
               strict: bool = False,
               maximum: Optional[float] = None) -> float:
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
        raise ValueError(
            f'{name} must be a finite number {allowed}, got '
            f'{_short_repr(value)}, which overflows float64') from None
    low_ok = minimum is None or (number > minimum
                                 if strict else number >= minimum)
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


def check_non_negative(value: float, name: str) -> float:
    """Return ``value`` as a float, or raise unless it is finite and >= 0.

    Args:
        value: Candidate number (a ridge, an epsilon).
        name: Parameter name used in the error message.

    Returns:
        ``float(value)``.
    """
    return check_real(value, name, minimum=0)


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
    """Whether ``value`` is a registry config: a dict with ``'type'``."""
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


def check_keys(value: Any, name: str, required: str,
               allowed: Sequence[str]) -> dict:
    """Return ``value`` if it is a dict holding ``required`` and only
    ``allowed`` keys.

    Args:
        value: Candidate settings dict.
        name: What it is, in the error messages (``'branch'``).
        required: The key it must have.
        allowed: Every key it may have.

    Returns:
        ``value``.
    """
    if not isinstance(value, dict) or required not in value:
        raise ValueError(f'{name} must be a dict with a "{required}" key, '
                         f'got {value!r}')
    unknown = set(value) - set(allowed)
    if unknown:
        raise ValueError(f'unknown {name} key(s) {sorted(unknown)} in '
                         f'{value!r}; allowed: {", ".join(allowed)}')
    return value


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
