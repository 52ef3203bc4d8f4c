"""Do label-free representation statistics predict linear-probe accuracy?

Reads the records of a ``tools/compare.py`` comparison (its out dir, or a
``runs.json`` such as ``docs/study/runs.json``; a list of records, the
former study driver's layout, is read too), one record per (arm, seed,
epoch) with
``<pooling>/linear_top1`` and ``<pooling>/repr/<statistic>``, and gives the
Spearman and Kendall (tau-b) rank correlations between each statistic and
the accuracy, with 95 % percentile bootstrap intervals over seeds, in three
settings:

(a) **across arms at a fixed epoch**: the arms' seed means (one point per
    arm; an arm evaluated at one epoch only, such as the random-init
    control, enters with that evaluation), with and without such
    untrained controls;
(b) **across epochs within an arm**: the correlation over one seed's
    evaluation epochs, averaged over seeds;
(c) **across lambda** (``mmae_lam<value>_...`` arms, the reference arm as
    lambda = 0) at a fixed epoch: every (arm, seed) run is a point.

The bootstrap resamples seeds with replacement and keeps a resampled seed's
records together (all its arms and epochs), so the interval reflects
seed-to-seed variation, the only replication a study has; resamples where a
correlation is undefined (a constant input) are dropped and counted. With
5 seeds there are only 126 distinct resamples: the intervals are coarse.

Example::

    python tools/analysis/label_free_predictors.py docs/study/runs.json \\
        --pooling cls --epoch 20 --json /tmp/predictors.json
"""
import argparse
import dataclasses
import json
import math
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

#: The statistics the study logs for every evaluation (prefix ``repr/``).
STATISTICS = ('erank_cov', 'erank_gram', 'rankme_raw', 'tcr_reference_mu1')
METHODS = ('spearman', 'kendall')
#: Arm names carrying their TCR weight: ``mmae_lam0.01_mu1``.
LAMBDA_PATTERN = re.compile(r'lam([0-9.eE+-]+?)(?:_|$)')


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
        """``+0.60 [+0.20, +1.00]``."""
        if math.isnan(self.estimate):
            return 'undefined'
        if math.isnan(self.low):
            return f'{self.estimate:+.2f}'
        return f'{self.estimate:+.2f} [{self.low:+.2f}, {self.high:+.2f}]'


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------
def load_rows(path: str) -> List[dict]:
    """The evaluation records of a comparison.

    Args:
        path: A comparison's out dir (read by
            :func:`mmae_plugin.comparison.records.read_runs`, which first
            rebuilds its ``runs.json`` from the run folders if they are
            there), its ``runs.json``, or a JSON list of records.

    Returns:
        The records.
    """
    from mmae_plugin.comparison.records import FORMAT, read_runs
    if os.path.isdir(path):
        return read_runs(path)[1]
    with open(path) as handle:
        data = json.load(handle)
    if isinstance(data, dict):
        if data.get('format') != FORMAT:
            raise ValueError(f'{path}: runs.json format '
                             f'{data.get("format")!r}, this version reads '
                             f'format {FORMAT}')
        data = data.get('runs')
    rows = data
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and {'arm', 'seed', 'epoch'} <= set(r)
            for r in rows):
        raise ValueError(f'{path}: expected evaluation records with arm, '
                         f'seed and epoch')
    return rows


#: Records by (arm, seed, epoch), per list of records (the bootstrap looks
#: values up hundreds of thousands of times).
_INDEX: Dict[int, Tuple[List[dict], Dict[tuple, dict]]] = {}


def value(rows: List[dict], arm: str, seed: int, epoch: int,
          key: str) -> Optional[float]:
    """``key`` of one evaluation, or None when it is missing."""
    cached = _INDEX.get(id(rows))
    if cached is None or cached[0] is not rows:
        cached = (rows, {(r['arm'], r['seed'], r['epoch']): r for r in rows})
        _INDEX[id(rows)] = cached
    row = cached[1].get((arm, seed, epoch))
    return None if row is None or key not in row else float(row[key])


def arms_of(rows: List[dict]) -> List[str]:
    """Arm names in first-appearance order."""
    return list(dict.fromkeys(row['arm'] for row in rows))


def epochs_of(rows: List[dict], arm: str) -> List[int]:
    return sorted({row['epoch'] for row in rows if row['arm'] == arm})


def seeds_of(rows: List[dict]) -> List[int]:
    return sorted({row['seed'] for row in rows})


def arm_epoch(rows: List[dict], arm: str, epoch: int) -> Optional[int]:
    """The epoch at which ``arm`` enters a fixed-epoch comparison.

    ``epoch`` itself, or the only epoch of an arm evaluated once (an
    untrained control); None if the arm has neither.
    """
    epochs = epochs_of(rows, arm)
    if epoch in epochs:
        return epoch
    return epochs[0] if len(epochs) == 1 else None


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
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    if method == 'spearman':
        return float(stats.spearmanr(x, y)[0])
    if method == 'kendall':
        return float(stats.kendalltau(x, y)[0])
    raise ValueError(f'method must be one of {METHODS}, got {method!r}')


def bootstrap(seeds: Sequence[int], estimate: Callable[[List[int]], float],
              resamples: int, rng: np.random.Generator
              ) -> Tuple[float, float, int]:
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
    draws = np.sort(rng.choice(np.asarray(seeds),
                               size=(resamples, len(seeds))), axis=1)
    distinct, inverse = np.unique(draws, axis=0, return_inverse=True)
    once = np.array([estimate([int(s) for s in draw]) for draw in distinct])
    values = once[np.ravel(inverse)]
    defined = values[~np.isnan(values)]
    if not len(defined):
        return math.nan, math.nan, resamples
    low, high = np.percentile(defined, [2.5, 97.5])
    return float(low), float(high), int(resamples - len(defined))


def across_arms(rows: List[dict], arms: Sequence[str], epoch: int,
                stat_key: str, acc_key: str, method: str,
                seeds: Sequence[int]) -> float:
    """(a): correlation of the arms' seed means at ``epoch``."""
    xs, ys = [], []
    for arm in arms:
        at = arm_epoch(rows, arm, epoch)
        pairs = [(value(rows, arm, s, at, stat_key),
                  value(rows, arm, s, at, acc_key)) for s in seeds]
        pairs = [p for p in pairs if None not in p]
        if not pairs:
            return math.nan
        xs.append(np.mean([p[0] for p in pairs]))
        ys.append(np.mean([p[1] for p in pairs]))
    return rank_correlation(xs, ys, method)


def within_arm(rows: List[dict], arm: str, stat_key: str, acc_key: str,
               method: str, seeds: Sequence[int]) -> float:
    """(b): per-seed correlation over the epochs, averaged over seeds."""
    per_seed = []
    for seed in seeds:
        pairs = [(value(rows, arm, seed, e, stat_key),
                  value(rows, arm, seed, e, acc_key))
                 for e in epochs_of(rows, arm)]
        pairs = [p for p in pairs if None not in p]
        per_seed.append(rank_correlation([p[0] for p in pairs],
                                         [p[1] for p in pairs], method))
    per_seed = [r for r in per_seed if not math.isnan(r)]
    return float(np.mean(per_seed)) if per_seed else math.nan


def pooled_runs(rows: List[dict], arms: Sequence[str], epoch: int,
                stat_key: str, acc_key: str, method: str,
                seeds: Sequence[int]) -> float:
    """(c): correlation over every (arm, seed) run at ``epoch``."""
    xs, ys = [], []
    for arm in arms:
        at = arm_epoch(rows, arm, epoch)
        for seed in seeds:
            x = value(rows, arm, seed, at, stat_key)
            y = value(rows, arm, seed, at, acc_key)
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return rank_correlation(xs, ys, method)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One correlation setting: a name, its points, its estimator."""
    name: str
    points: int
    estimate: Callable[[str, str, str, Sequence[int]], float]


def settings(rows: List[dict], epoch: int, reference: str) -> List[Setting]:
    """The (a), (b) and (c) settings the records support.

    Args:
        rows: The records.
        epoch: The fixed budget of (a) and (c).
        reference: The arm that is lambda = 0 in (c).

    Returns:
        The settings, in table order.
    """
    arms = [a for a in arms_of(rows) if arm_epoch(rows, a, epoch) is not None]
    trained = [a for a in arms if len(epochs_of(rows, a)) > 1]
    out = [Setting(f'(a) {len(arms)} arms at epoch {epoch}', len(arms),
                   lambda s, a, m, seeds, arms=arms: across_arms(
                       rows, arms, epoch, s, a, m, seeds))]
    if 1 < len(trained) < len(arms):
        out.append(Setting(
            f'(a) {len(trained)} trained arms at epoch {epoch}', len(trained),
            lambda s, a, m, seeds, arms=trained: across_arms(
                rows, arms, epoch, s, a, m, seeds)))
    for arm in trained:
        out.append(Setting(
            f'(b) {arm}, epochs {",".join(map(str, epochs_of(rows, arm)))}',
            len(epochs_of(rows, arm)),
            lambda s, a, m, seeds, arm=arm: within_arm(rows, arm, s, a, m,
                                                       seeds)))
    lambdas = {arm: lam for arm, lam in lambda_arms(rows, reference).items()
               if arm_epoch(rows, arm, epoch) is not None}
    if len(lambdas) > 1:
        names = sorted(lambdas, key=lambdas.get)
        out.append(Setting(
            f'(c) lambda {", ".join(f"{lambdas[n]:g}" for n in names)} at '
            f'epoch {epoch}, arm means', len(names),
            lambda s, a, m, seeds, arms=names: across_arms(
                rows, arms, epoch, s, a, m, seeds)))
        out.append(Setting(
            f'(c) lambda {", ".join(f"{lambdas[n]:g}" for n in names)} at '
            f'epoch {epoch}, every run', len(names) * len(seeds_of(rows)),
            lambda s, a, m, seeds, arms=names: pooled_runs(
                rows, arms, epoch, s, a, m, seeds)))
    return out


def correlations(rows: List[dict], pooling: str = 'cls',
                 accuracy: str = 'linear_top1', epoch: Optional[int] = None,
                 reference: str = 'mae',
                 statistics: Sequence[str] = STATISTICS,
                 resamples: int = 10000, seed: int = 0) -> List[Correlation]:
    """Every setting x statistic x method, with bootstrap intervals.

    Args:
        rows: The records (:func:`load_rows`).
        pooling: Feature pooling of both the statistic and the accuracy.
        accuracy: Accuracy metric (without the pooling prefix).
        epoch: Fixed budget of (a) and (c); default the last epoch of the
            reference arm.
        reference: Arm that is lambda = 0 in (c).
        statistics: Statistic names (without ``<pooling>/repr/``).
        resamples: Bootstrap resamples.
        seed: Seed of the bootstrap (the same draws for every statistic).

    Returns:
        The correlations, in table order.
    """
    if epoch is None:
        epoch = epochs_of(rows, reference)[-1]
    seeds = seeds_of(rows)
    acc_key = f'{pooling}/{accuracy}'
    out = []
    for setting in settings(rows, epoch, reference):
        for name in statistics:
            stat_key = f'{pooling}/repr/{name}'
            for method in METHODS:
                def estimate(draw, k=stat_key, m=method, st=setting):
                    return st.estimate(k, acc_key, m, draw)
                low, high, undefined = bootstrap(
                    seeds, estimate, resamples, np.random.default_rng(seed))
                out.append(Correlation(setting.name, name, method,
                                       estimate(seeds), low, high,
                                       setting.points, len(seeds),
                                       undefined))
    return out


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------
def markdown_table(results: List[Correlation]) -> List[str]:
    """One row per setting and statistic: Spearman and Kendall cells."""
    lines = ['| setting | points | statistic | Spearman ρ [95 % CI] | '
             'Kendall τ-b [95 % CI] |', '|---|---|---|---|---|']
    by_key = {(r.setting, r.statistic, r.method): r for r in results}
    for setting, statistic in dict.fromkeys(
            (r.setting, r.statistic) for r in results):
        rho = by_key[(setting, statistic, 'spearman')]
        tau = by_key[(setting, statistic, 'kendall')]
        lines.append(f'| {setting} | {rho.points} | {statistic} | '
                     f'{rho.text()} | {tau.text()} |')
    return lines


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('runs_json', help="a comparison's out dir or "
                        'runs.json')
    parser.add_argument('--pooling', default='cls',
                        help='feature pooling (cls, cls+mean, mean)')
    parser.add_argument('--accuracy', default='linear_top1',
                        help='accuracy metric (default linear_top1)')
    parser.add_argument('--epoch', type=int,
                        help='fixed budget of (a) and (c) (default: the '
                        "reference arm's last epoch)")
    parser.add_argument('--reference', default='mae',
                        help='the arm that is lambda = 0 in (c)')
    parser.add_argument('--statistics', nargs='+', default=list(STATISTICS))
    parser.add_argument('--resamples', type=int, default=10000)
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the bootstrap')
    parser.add_argument('--json', help='also write the numbers here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    try:
        rows = load_rows(args.runs_json)
        results = correlations(rows, args.pooling, args.accuracy, args.epoch,
                               args.reference, args.statistics,
                               args.resamples, args.seed)
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise SystemExit(f'label_free_predictors.py: error: {error}')
    print(f'{args.pooling} features, {args.accuracy}, {len(rows)} '
          f'evaluations, {len(seeds_of(rows))} seeds, {args.resamples} '
          f'bootstrap resamples over seeds\n')
    print('\n'.join(markdown_table(results)))
    if args.json:
        with open(args.json, 'w') as handle:
            json.dump([dataclasses.asdict(r) for r in results], handle,
                      indent=1)


if __name__ == '__main__':
    sys.exit(main())
