"""Do label-free representation statistics predict linear-probe accuracy?

Reads the records of a ``tools/compare.py`` comparison (its out dir, or a
``runs.json`` such as ``docs/study/runs.json``; a list of records, the
former study driver's layout, is read too), one record per (arm, seed,
epoch) with ``<pooling>/<accuracy>`` and ``<pooling>/repr/<statistic>``,
and gives the Spearman and Kendall (tau-b) rank correlations between each
statistic and the accuracy, with 95 % percentile bootstrap intervals over
seeds, in three settings:

(a) **across arms at a fixed epoch**: the arms' seed means (one point per
    arm; an arm evaluated at one epoch only, such as the random-init
    control, enters with that evaluation), with and without such
    untrained controls;
(b) **across epochs within an arm**: the correlation over one seed's
    evaluation epochs, averaged over seeds, beside that of the epoch
    number itself (:data:`EPOCH_CONTROL`);
(c) **across lambda** (``mmae_lam<value>_...`` arms, the reference arm as
    lambda = 0) at a fixed epoch: on the arm means and with every (arm,
    seed) run as a point. A comparison without such arms (Siamese methods,
    say) has no (c): :func:`inapplicable` says so.

The bootstrap resamples seeds with replacement and keeps a resampled
seed's records together (all its arms and epochs), so the interval
reflects seed-to-seed variation, the only replication a study has;
resamples where a correlation is undefined (a constant input) are dropped
and counted. With 5 seeds there are only 126 distinct resamples: the
intervals are coarse. ``tools/analysis/label_free_predictors.py`` is the
command line.
"""
import dataclasses
import json
import math
import os.path as osp
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

from mmae_compare.records import checked_runs, read_runs
from mmae_compare.spec import read_json

#: The statistics the study logs for every evaluation (prefix ``repr/``).
STATISTICS = ('erank_cov', 'erank_gram', 'rankme_raw', 'tcr_reference_mu1')
METHODS = ('spearman', 'kendall')
#: The control of (b): the number of epochs trained, which any quantity
#: that grows with training matches while accuracy still rises. A
#: statistic that predicts no better than it says only that training went
#: on. Its record key is the record's own ``epoch``.
EPOCH_CONTROL = 'epoch (control)'
#: Arm names carrying their TCR weight: ``mmae_lam0.01_mu1``.
LAMBDA_PATTERN = re.compile(r'lam([0-9.eE+-]+?)(?:_|$)')
#: What a correlation estimator is given: the statistic's key, the
#: accuracy's key, the method and the (resampled) seeds.
Estimator = Callable[[str, str, str, Sequence[int]], float]


@dataclasses.dataclass(frozen=True)
class Correlation:
    """A rank correlation with its bootstrap interval.

    Attributes:
        setting: ``'(a) ...'``, ``'(b) <arm>'`` or ``'(c) ...'``.
        statistic: The statistic's name (``erank_cov``).
        method: ``'spearman'`` or ``'kendall'``.
        estimate: The correlation on all seeds.
        low: 2.5 % bootstrap percentile (NaN if no resample defined it).
        high: 97.5 % bootstrap percentile.
        points: Points per correlation (arms, epochs or runs).
        seeds: Seeds used.
        undefined: Bootstrap resamples dropped as undefined.
    """
    setting: str
    statistic: str
    method: str
    estimate: float
    low: float
    high: float
    points: int
    seeds: int
    undefined: int = 0

    def text(self) -> str:
        """``+0.60 [+0.20, +1.00]``, or ``undefined``."""
        if math.isnan(self.estimate):
            return 'undefined'
        if math.isnan(self.low):
            return f'{self.estimate:+.2f}'
        return f'{self.estimate:+.2f} [{self.low:+.2f}, {self.high:+.2f}]'


@dataclasses.dataclass(frozen=True)
class Setting:
    """One correlation setting: a name, its points, its estimator, and the
    controls reported beside the statistics (:data:`EPOCH_CONTROL`)."""
    name: str
    points: int
    estimate: Estimator
    controls: Tuple[str, ...] = ()


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
def load_rows(path: str) -> List[dict]:
    """The evaluation records of a comparison.

    Args:
        path: A comparison's out dir (read by
            :func:`mmae_compare.records.read_runs`, which first
            rebuilds its ``runs.json`` from the run folders if they are
            there), a ``runs.json`` file (read as it is, under any name),
            or a JSON list of records.

    Returns:
        The records.

    Raises:
        ValueError: If the file is a ``runs.json`` of another format or
            holds no list of records with arm, seed and epoch.
        OSError: If the path cannot be read.
    """
    if osp.isdir(path):
        return check_rows(read_runs(path)[1], path)
    data = read_json(path)
    if isinstance(data, dict):
        data = checked_runs(data, path).get('runs')
    return check_rows(data, path)


def check_rows(rows: object, path: str) -> List[dict]:
    """``rows`` if it is a list of records with arm, seed and epoch.

    Raises:
        ValueError: Otherwise (the message names ``path``).
    """
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and {'arm', 'seed', 'epoch'} <= set(r)
            for r in rows):
        raise ValueError(f'{path}: expected evaluation records with arm, '
                         f'seed and epoch')
    return rows


def arms_of(rows: List[dict]) -> List[str]:
    """Arm names in first-appearance order."""
    return list(dict.fromkeys(row['arm'] for row in rows))


def epochs_of(rows: List[dict], arm: str) -> List[int]:
    """The epochs ``arm`` was evaluated at, ascending."""
    return sorted({row['epoch'] for row in rows if row['arm'] == arm})


def seeds_of(rows: List[dict]) -> List[int]:
    """Every seed of the records, ascending."""
    return sorted({row['seed'] for row in rows})


class RecordIndex:
    """The records looked up by (arm, seed, epoch).

    The bootstrap looks values up hundreds of thousands of times, so the
    arms, seeds and each arm's epochs are computed once.

    Attributes:
        rows: The records.
        arms: Arm names in first-appearance order.
        seeds: Every seed, ascending.
    """

    def __init__(self, rows: List[dict]) -> None:
        self.rows = rows
        self.arms = arms_of(rows)
        self.seeds = seeds_of(rows)
        self._epochs = {arm: epochs_of(rows, arm) for arm in self.arms}
        self._by_run = {(r['arm'], r['seed'], r['epoch']): r for r in rows}

    def epochs(self, arm: str) -> List[int]:
        """The epochs ``arm`` was evaluated at, ascending."""
        return self._epochs.get(arm, [])

    def trained(self, arm: str) -> bool:
        """Whether ``arm`` was evaluated at more than one epoch."""
        return len(self.epochs(arm)) > 1

    def value(self, arm: str, seed: int, epoch: Optional[int],
              key: str) -> Optional[float]:
        """``key`` of one evaluation, or None when it is missing."""
        row = self._by_run.get((arm, seed, epoch))
        return None if row is None or key not in row else float(row[key])

    def arm_epoch(self, arm: str, epoch: int) -> Optional[int]:
        """The epoch at which ``arm`` enters a fixed-epoch comparison.

        ``epoch`` itself, or the only epoch of an arm evaluated once (an
        untrained control); None if the arm has neither.
        """
        epochs = self.epochs(arm)
        if epoch in epochs:
            return epoch
        return epochs[0] if len(epochs) == 1 else None

    def pairs(self, arm: str, seed: int, epoch: Optional[int], stat_key: str,
              acc_key: str) -> Tuple[Optional[float], Optional[float]]:
        """``(statistic, accuracy)`` of one evaluation (None if missing)."""
        return (self.value(arm, seed, epoch,
                           stat_key), self.value(arm, seed, epoch, acc_key))


def lambda_arms(rows: List[dict], reference: str) -> Dict[str, float]:
    """``{arm: lambda}`` of the ``lam<value>`` arms, ``reference`` as 0."""
    found = {}
    for arm in arms_of(rows):
        match = LAMBDA_PATTERN.search(arm)
        if match:
            found[arm] = float(match.group(1))
        elif arm == reference:
            found[arm] = 0.0
    return found


def default_epoch(index: RecordIndex, reference: str) -> int:
    """The fixed budget of (a) and (c) when none is given.

    Args:
        index: The records.
        reference: The reference arm.

    Returns:
        The reference arm's last epoch; without that arm, the last epoch
        every trained arm was evaluated at, else the last epoch of all.

    Raises:
        ValueError: If there are no records.
    """
    if not index.rows:
        raise ValueError('no evaluation records')
    if index.epochs(reference):
        return index.epochs(reference)[-1]
    trained = [set(index.epochs(a)) for a in index.arms if index.trained(a)]
    common = set.intersection(*trained) if trained else set()
    return max(common or {row['epoch'] for row in index.rows})


def fixed_epoch(rows: List[dict], epoch: Optional[int], reference: str) -> int:
    """``epoch``, or :func:`default_epoch` when it is None."""
    return default_epoch(RecordIndex(rows), reference) if epoch is None \
        else epoch


# ----------------------------------------------------------------------------
# Correlations and the bootstrap over seeds
# ----------------------------------------------------------------------------
def rank_correlation(x: Sequence[float], y: Sequence[float],
                     method: str) -> float:
    """Spearman's rho or Kendall's tau-b; NaN when undefined.

    Args:
        x: Values of the statistic.
        y: Accuracies, paired with ``x``.
        method: ``'spearman'`` or ``'kendall'``.

    Returns:
        The correlation (NaN for fewer than 2 points or a constant input).

    Raises:
        ValueError: For another ``method``.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    if method == 'spearman':
        return float(stats.spearmanr(x, y)[0])
    if method == 'kendall':
        return float(stats.kendalltau(x, y)[0])
    raise ValueError(f'method must be one of {METHODS}, got {method!r}')


def bootstrap(seeds: Sequence[int], estimate: Callable[[List[int]],
                                                       float], resamples: int,
              rng: np.random.Generator) -> Tuple[float, float, int]:
    """Percentile interval of ``estimate`` over seed resamples.

    Args:
        seeds: The seeds of the study.
        estimate: The correlation computed from a list of seeds (repeats
            allowed: a seed drawn twice counts twice); it must not depend
            on their order, which lets each distinct resample be computed
            once (5 seeds have 126).
        resamples: Number of resamples.
        rng: Generator of the resamples.

    Returns:
        ``(low, high, undefined)``: the 2.5 % and 97.5 % percentiles of the
        defined resamples and how many were undefined.
    """
    draws = np.sort(
        rng.choice(np.asarray(seeds), size=(resamples, len(seeds))), axis=1)
    distinct, inverse = np.unique(draws, axis=0, return_inverse=True)
    once = np.array([estimate([int(s) for s in draw]) for draw in distinct])
    values = once[np.ravel(inverse)]
    defined = values[~np.isnan(values)]
    if not len(defined):
        return math.nan, math.nan, resamples
    low, high = np.percentile(defined, [2.5, 97.5])
    return float(low), float(high), int(resamples - len(defined))


def across_arms(index: RecordIndex, arms: Sequence[str], epoch: int,
                stat_key: str, acc_key: str, method: str,
                seeds: Sequence[int]) -> float:
    """(a): correlation of the arms' seed means at ``epoch``."""
    xs, ys = [], []
    for arm in arms:
        at = index.arm_epoch(arm, epoch)
        pairs = [index.pairs(arm, s, at, stat_key, acc_key) for s in seeds]
        pairs = [p for p in pairs if None not in p]
        if not pairs:
            return math.nan
        xs.append(np.mean([p[0] for p in pairs]))
        ys.append(np.mean([p[1] for p in pairs]))
    return rank_correlation(xs, ys, method)


def within_arm(index: RecordIndex, arm: str, stat_key: str, acc_key: str,
               method: str, seeds: Sequence[int]) -> float:
    """(b): per-seed correlation over the epochs, averaged over seeds."""
    per_seed = []
    for seed in seeds:
        pairs = [
            index.pairs(arm, seed, e, stat_key, acc_key)
            for e in index.epochs(arm)
        ]
        pairs = [p for p in pairs if None not in p]
        per_seed.append(
            rank_correlation([p[0] for p in pairs], [p[1] for p in pairs],
                             method))
    per_seed = [r for r in per_seed if not math.isnan(r)]
    return float(np.mean(per_seed)) if per_seed else math.nan


def pooled_runs(index: RecordIndex, arms: Sequence[str], epoch: int,
                stat_key: str, acc_key: str, method: str,
                seeds: Sequence[int]) -> float:
    """(c): correlation over every (arm, seed) run at ``epoch``."""
    xs, ys = [], []
    for arm in arms:
        at = index.arm_epoch(arm, epoch)
        for seed in seeds:
            x, y = index.pairs(arm, seed, at, stat_key, acc_key)
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return rank_correlation(xs, ys, method)


# ----------------------------------------------------------------------------
# The settings (a), (b) and (c)
# ----------------------------------------------------------------------------
def arm_settings(index: RecordIndex, epoch: int) -> List[Setting]:
    """(a): every arm at ``epoch``, then the trained arms alone."""
    arms = [a for a in index.arms if index.arm_epoch(a, epoch) is not None]
    trained = [a for a in arms if index.trained(a)]
    groups = [(f'{len(arms)} arms', arms)]
    if 1 < len(trained) < len(arms):
        groups.append((f'{len(trained)} trained arms', trained))
    return [
        Setting(
            f'(a) {label} at epoch {epoch}',
            len(names),
            lambda s, a, m, seeds, names=names: across_arms(
                index, names, epoch, s, a, m, seeds))
        for label, names in groups
    ]


def epoch_settings(index: RecordIndex) -> List[Setting]:
    """(b): one setting per arm evaluated at more than one epoch."""
    return [
        Setting(
            f'(b) {arm}, epochs {",".join(map(str, index.epochs(arm)))}',
            len(index.epochs(arm)),
            lambda s, a, m, seeds, arm=arm: within_arm(index, arm, s, a, m,
                                                       seeds),
            controls=(EPOCH_CONTROL, )) for arm in index.arms
        if index.trained(arm)
    ]


def lambdas_at(index: RecordIndex, epoch: int,
               reference: str) -> Dict[str, float]:
    """``{arm: lambda}`` of the lambda arms that enter at ``epoch``."""
    return {
        arm: lam
        for arm, lam in lambda_arms(index.rows, reference).items()
        if index.arm_epoch(arm, epoch) is not None
    }


def lambda_settings(index: RecordIndex, epoch: int,
                    reference: str) -> List[Setting]:
    """(c): the lambda arms' means and every run; none for < 2 arms."""
    lambdas = lambdas_at(index, epoch, reference)
    if len(lambdas) < 2:
        return []
    names = sorted(lambdas, key=lambdas.get)
    head = (f'(c) lambda {", ".join(f"{lambdas[n]:g}" for n in names)} at '
            f'epoch {epoch}')
    return [
        Setting(
            f'{head}, arm means',
            len(names), lambda s, a, m, seeds: across_arms(
                index, names, epoch, s, a, m, seeds)),
        Setting(
            f'{head}, every run',
            len(names) * len(index.seeds), lambda s, a, m, seeds: pooled_runs(
                index, names, epoch, s, a, m, seeds))
    ]


def settings(rows: List[dict], epoch: int, reference: str) -> List[Setting]:
    """The (a), (b) and (c) settings the records support.

    Args:
        rows: The records.
        epoch: The fixed budget of (a) and (c).
        reference: The arm that is lambda = 0 in (c).

    Returns:
        The settings, in table order.
    """
    index = RecordIndex(rows)
    return (arm_settings(index, epoch) + epoch_settings(index) +
            lambda_settings(index, epoch, reference))


def inapplicable(rows: List[dict], epoch: int, reference: str) -> List[str]:
    """One line per setting the records cannot support, and why.

    Args:
        rows: The records.
        epoch: The fixed budget of (a) and (c).
        reference: The arm that is lambda = 0 in (c).

    Returns:
        The lines (none when (b) and (c) both apply).
    """
    index = RecordIndex(rows)
    lines = []
    if not any(index.trained(arm) for arm in index.arms):
        lines.append('(b) across epochs: not applicable (no arm was '
                     'evaluated at more than one epoch)')
    found = sorted(lambdas_at(index, epoch, reference))
    if len(found) < 2:
        lines.append(
            f'(c) across lambda: not applicable (needs 2 or more '
            f'lam<value> arms, the reference {reference!r} as lambda = 0, '
            f'at epoch {epoch}; found {", ".join(found) or "none"})')
    return lines


def correlations(rows: List[dict],
                 pooling: str = 'cls',
                 accuracy: str = 'linear_top1',
                 epoch: Optional[int] = None,
                 reference: str = 'mae',
                 statistics: Sequence[str] = STATISTICS,
                 resamples: int = 10000,
                 seed: int = 0) -> List[Correlation]:
    """Every setting x statistic x method, with bootstrap intervals; each
    setting's controls follow its statistics.

    Args:
        rows: The records (:func:`load_rows`).
        pooling: Feature pooling of both the statistic and the accuracy.
        accuracy: Accuracy metric (without the pooling prefix).
        epoch: Fixed budget of (a) and (c); default
            :func:`default_epoch` (the reference arm's last epoch).
        reference: Arm that is lambda = 0 in (c).
        statistics: Statistic names (without ``<pooling>/repr/``).
        resamples: Bootstrap resamples.
        seed: Seed of the bootstrap (the same draws for every statistic).

    Returns:
        The correlations, in table order.
    """
    index = RecordIndex(rows)
    epoch = fixed_epoch(rows, epoch, reference)
    acc_key = f'{pooling}/{accuracy}'
    out = []
    for setting in settings(rows, epoch, reference):
        for name in (*statistics, *setting.controls):
            stat_key = 'epoch' if name == EPOCH_CONTROL else \
                f'{pooling}/repr/{name}'
            for method in METHODS:
                out.append(
                    correlate(setting, name, stat_key, acc_key, method,
                              index.seeds, resamples, seed))
    return out


def correlate(setting: Setting, statistic: str, stat_key: str, acc_key: str,
              method: str, seeds: Sequence[int], resamples: int,
              seed: int) -> Correlation:
    """One setting's correlation on all seeds, with its interval.

    Args:
        setting: The setting.
        statistic: The statistic's name.
        stat_key: Its record key (``<pooling>/repr/<statistic>``).
        acc_key: The accuracy's record key.
        method: ``'spearman'`` or ``'kendall'``.
        seeds: Every seed.
        resamples: Bootstrap resamples.
        seed: Seed of the bootstrap.

    Returns:
        The correlation.
    """

    def estimate(draw: Sequence[int]) -> float:
        return setting.estimate(stat_key, acc_key, method, draw)

    low, high, undefined = bootstrap(seeds, estimate, resamples,
                                     np.random.default_rng(seed))
    return Correlation(setting.name, statistic, method, estimate(seeds), low,
                       high, setting.points, len(seeds), undefined)


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------
def markdown_table(results: List[Correlation]) -> List[str]:
    """One row per setting and statistic: Spearman and Kendall cells."""
    lines = [
        '| setting | points | statistic | Spearman ρ [95 % CI] | '
        'Kendall τ-b [95 % CI] |', '|---|---|---|---|---|'
    ]
    by_key = {(r.setting, r.statistic, r.method): r for r in results}
    settings = dict.fromkeys((r.setting, r.statistic) for r in results)
    for setting, statistic in settings:
        rho = by_key[(setting, statistic, 'spearman')]
        tau = by_key[(setting, statistic, 'kendall')]
        lines.append(f'| {setting} | {rho.points} | {statistic} | '
                     f'{rho.text()} | {tau.text()} |')
    return lines


def report_lines(rows: List[dict],
                 results: List[Correlation],
                 pooling: str,
                 accuracy: str,
                 resamples: int,
                 notes: Sequence[str] = ()) -> List[str]:
    """The text the command line prints.

    Args:
        rows: The records.
        results: Their correlations (:func:`correlations`).
        pooling: Feature pooling.
        accuracy: Accuracy metric.
        resamples: Bootstrap resamples.
        notes: Lines after the table (:func:`inapplicable`), if any.

    Returns:
        A summary line, a blank line, the table and then the notes.
    """
    lines = [
        f'{pooling} features, {accuracy}, {len(rows)} evaluations, '
        f'{len(seeds_of(rows))} seeds, {resamples} bootstrap '
        f'resamples over seeds', ''
    ]
    lines += markdown_table(results)
    return lines + ([''] + list(notes) if notes else [])


def write_json(path: str, results: List[Correlation]) -> None:
    """The correlations as a JSON list of :class:`Correlation` fields."""
    with open(path, 'w') as handle:
        json.dump([dataclasses.asdict(r) for r in results], handle, indent=1)
