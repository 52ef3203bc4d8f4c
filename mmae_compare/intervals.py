"""Paired differences over seeds with Student-t intervals (the one place).

Every comparison the report makes is a paired difference: ``a[seed] -
b[seed]`` over the seeds both arms have, its mean, and a two-sided
Student-t interval of that mean (scipy's ``ttest_1samp``). With a single
common seed, or with differences that are all equal (no spread to estimate
the error from), there is no interval, and the text says so instead of
printing a zero-width ``[mean, mean]`` that would read as significant.
"""
import dataclasses
import math
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

#: The text of a difference measured on one seed only.
NO_INTERVAL = 'n=1, no interval'
#: The text of n >= 2 differences that are all equal: their sample standard
#: deviation is 0, so the t-interval would have zero width whatever n is.
NO_SPREAD = 'all equal, no spread: no interval'
#: Differences closer than this (relative to their size, or absolutely for
#: differences near 0) count as equal: recorded metrics are float64 sums,
#: so equal results can differ by rounding (~1e-14 of the values).
EQUAL_TOLERANCE = 1e-9


@dataclasses.dataclass(frozen=True)
class PairedInterval:
    """Mean paired difference and its two-sided t-interval.

    Attributes:
        mean: Mean of the per-seed differences.
        low: Lower end of the interval; ``None`` when ``n == 1`` or the
            differences are all equal.
        high: Upper end of the interval; ``None`` likewise.
        n: Number of paired seeds.
        level: Confidence level, e.g. 0.95.
    """
    mean: float
    low: Optional[float]
    high: Optional[float]
    n: int
    level: float = 0.95

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    @property
    def half_width(self) -> Optional[float]:
        return None if self.low is None else (self.high - self.low) / 2

    def verdict(self) -> str:
        """``'better'``, ``'worse'``, ``'no sig. difference'`` or ``'n/a'``
        (one seed: nothing can be said)."""
        if not self.has_interval:
            return 'n/a'
        if self.low > 0:
            return 'better'
        if self.high < 0:
            return 'worse'
        return 'no sig. difference'

    def text(self, digits: int = 2) -> str:
        """``+0.12 [-0.30, +0.54] (n=5)``, ``+0.12 (n=1, no interval)`` or
        ``-0.20 (n=2, all equal, no spread: no interval)``."""
        if not self.has_interval:
            if self.n == 1:
                return f'{self.mean:+.{digits}f} ({NO_INTERVAL})'
            return f'{self.mean:+.{digits}f} (n={self.n}, {NO_SPREAD})'
        return (f'{self.mean:+.{digits}f} [{self.low:+.{digits}f}, '
                f'{self.high:+.{digits}f}] (n={self.n})')

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def t_interval(values: Sequence[float], level: float = 0.95) -> PairedInterval:
    """Mean of ``values`` with its two-sided Student-t interval.

    Args:
        values: The per-seed differences (at least one).
        level: Confidence level in (0, 1).

    Returns:
        The :class:`PairedInterval` (scipy's ``ttest_1samp`` interval);
        without ends for a single value or for values that are all equal
        (to :data:`EQUAL_TOLERANCE`).

    Raises:
        ValueError: If ``values`` is empty, not finite, or ``level`` is
            outside (0, 1).
    """
    if not 0 < level < 1:
        raise ValueError(f'level must be in (0, 1), got {level!r}')
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f'values must be a non-empty 1-D sequence, got '
                         f'shape {x.shape}')
    if not np.isfinite(x).all():
        raise ValueError(f'values must be finite, got {x.tolist()}')
    mean = float(x.mean())
    if x.size == 1 or all_equal(x):
        return PairedInterval(mean, None, None, int(x.size), level)
    interval = stats.ttest_1samp(
        x, 0.0).confidence_interval(confidence_level=level)
    return PairedInterval(mean, float(interval.low), float(interval.high),
                          int(x.size), level)


def welch_interval(first: Sequence[float],
                   second: Sequence[float],
                   level: float = 0.95) -> PairedInterval:
    """Mean of ``first`` minus mean of ``second``, unpaired, with Welch's
    two-sided interval (scipy's ``ttest_ind`` with unequal variances): for
    two comparisons whose seeds do not correspond.

    Args:
        first: Values of the first comparison (one per seed).
        second: Values of the second.
        level: Confidence level in (0, 1).

    Returns:
        The :class:`PairedInterval` of the difference, ``n`` the smaller
        sample; without ends if either side has fewer than 2 values or no
        spread.

    Raises:
        ValueError: If either side is empty or not finite.
    """
    a, b = (np.asarray(v, dtype=np.float64) for v in (first, second))
    for name, x in (('first', a), ('second', b)):
        if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
            raise ValueError(f'{name} must be a non-empty 1-D sequence of '
                             f'finite values, got {x.tolist()}')
    mean = float(a.mean() - b.mean())
    n = int(min(a.size, b.size))
    if n < 2 or (all_equal(a) and all_equal(b)):
        return PairedInterval(mean, None, None, n, level)
    interval = stats.ttest_ind(
        a, b, equal_var=False).confidence_interval(confidence_level=level)
    return PairedInterval(mean, float(interval.low), float(interval.high), n,
                          level)


def all_equal(values: np.ndarray) -> bool:
    """Whether ``values`` differ by no more than rounding.

    Args:
        values: Finite float64 values.

    Returns:
        True when their range is within :data:`EQUAL_TOLERANCE` of their
        largest magnitude (or of 1, for values near 0).
    """
    scale = max(1.0, float(np.abs(values).max()))
    return float(np.ptp(values)) <= EQUAL_TOLERANCE * scale


def paired_interval(ours: Mapping[int, float],
                    base: Mapping[int, float],
                    level: float = 0.95) -> Optional[PairedInterval]:
    """``ours - base`` paired by seed, over the seeds both have.

    Args:
        ours: Seed -> value of the compared arm.
        base: Seed -> value of the baseline.
        level: Confidence level.

    Returns:
        The interval of the mean difference, or ``None`` when no seed is
        common to both.
    """
    seeds = sorted(set(ours) & set(base))
    if not seeds:
        return None
    return t_interval([ours[s] - base[s] for s in seeds], level)


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (NaN for fewer than 2 values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float('nan'), float('nan')
    std = float(x.std(ddof=1)) if x.size > 1 else float('nan')
    return float(x.mean()), std


def format_mean_std(values: Sequence[float], digits: int = 2) -> str:
    """``84.10 ± 0.32`` (the std over seeds), or the value alone for one."""
    mean, std = mean_std(values)
    if math.isnan(mean):
        return '–'
    if math.isnan(std):
        return f'{mean:.{digits}f}'
    return f'{mean:.{digits}f} ± {std:.{digits}f}'
