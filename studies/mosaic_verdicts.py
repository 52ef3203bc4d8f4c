"""The mosaic study's verdicts, decided by the criteria of docs/mosaic.md
(fixed before the runs) from the comparison's ``runs.json``.

Seed 001's claim: the TCR term helps where a task needs many directions
(:func:`tcr_verdict`). Seed 000's claim: MAE keeps local features,
contrastive learning mainly global ones (:func:`local_global_verdict`).
Every interval is paired by seed: the mean difference with its two-sided
95 % Student-t interval (:func:`mmae_compare.intervals.paired_interval`).
"""
import dataclasses
from typing import Dict, List, Mapping, Optional

from mmae_compare.intervals import PairedInterval, paired_interval, t_interval
from mmae_plugin.evaluation.mosaic import PCA_DIMS

#: Arm names of the study (dev/mosaic_study.sh).
MAE, UMAE, PRIMARY, SECONDARY = 'mae', 'umae', 'mmae_lam0.01', 'mmae_lam0.05'
SIMCLR, INIT, SUPERVISED = 'simclr', 'random_init', 'supervised'
#: The criteria's thresholds, in accuracy points.
SUPPORT_GAIN, REFUTE_BELOW, MIN_NORMALISER = 2.0, 1.0, 1.0
LOCAL, GLOBAL = 'cell_linear_top1', 'presence_balanced_top1'

#: Arm -> seed -> metric -> value.
Values = Dict[str, Dict[int, Dict[str, float]]]


@dataclasses.dataclass
class Verdict:
    """A verdict with the findings that decided it.

    Attributes:
        outcome: ``'support'``, ``'support, as a reparametrisation'``,
            ``'refutation'`` or ``'undecided'``.
        reason: One sentence: which criterion decided.
        findings: Name -> the interval (or value) the criterion read.
    """
    outcome: str
    reason: str
    findings: Dict[str, str]


def final_values(runs: dict) -> Values:
    """Each arm's metrics at its last evaluated epoch, by seed.

    Args:
        runs: ``runs.json`` as loaded (``comparison`` and ``runs``).

    Returns:
        Arm -> seed -> metric -> value (the record's keys).
    """
    values: Values = {}
    last: Dict[tuple, int] = {}
    for record in runs['runs']:
        key = (record['arm'], record['seed'])
        if record['epoch'] >= last.get(key, -1):
            last[key] = record['epoch']
            values.setdefault(record['arm'], {})[record['seed']] = record
    return values


def metric(values: Values, arm: str, key: str,
           pooling: str) -> Dict[int, float]:
    """Seed -> ``<pooling>/<key>`` of ``arm`` (seeds without it left
    out)."""
    name = f'{pooling}/{key}'
    return {
        seed: float(record[name])
        for seed, record in values.get(arm, {}).items() if name in record
    }


def difference(values: Values, arm: str, base: str, key: str,
               pooling: str) -> Optional[PairedInterval]:
    """``arm - base`` on ``key``, paired by seed."""
    return paired_interval(
        metric(values, arm, key, pooling), metric(values, base, key, pooling))


def above_zero(interval: Optional[PairedInterval]) -> bool:
    return interval is not None and interval.has_interval and \
        interval.low > 0


def below(interval: Optional[PairedInterval], bound: float) -> bool:
    return interval is not None and interval.has_interval and \
        interval.high < bound


def text(interval: Optional[PairedInterval]) -> str:
    return 'no paired seeds' if interval is None else interval.text()


def rank_threshold(values: Values, pooling: str) -> Optional[int]:
    """k*: the smallest probed k at or above MAE's mean ``erank_cov``."""
    ranks = list(metric(values, MAE, 'repr/erank_cov', pooling).values())
    if not ranks:
        return None
    mean = sum(ranks) / len(ranks)
    return next((k for k in PCA_DIMS if k >= mean), None)


def mechanism(values: Values, pooling: str) -> Dict[str, object]:
    """The two conditions of "informative" and what they read."""
    k_star = rank_threshold(values, pooling)
    widest = max(PCA_DIMS)
    rising = None
    if k_star is not None and k_star < widest:
        rising = difference_of_keys(values, MAE,
                                    f'pca{widest}_cell_linear_top1',
                                    f'pca{k_star}_cell_linear_top1', pooling)
    rank_gain = difference(values, PRIMARY, MAE, 'repr/erank_cov', pooling)
    return dict(
        k_star=k_star,
        rising=rising,
        rank_gain=rank_gain,
        informative=above_zero(rising) and above_zero(rank_gain))


def difference_of_keys(values: Values, arm: str, key: str, base_key: str,
                       pooling: str) -> Optional[PairedInterval]:
    """``key - base_key`` within each seed of ``arm``."""
    ours, base = metric(values, arm, key,
                        pooling), metric(values, arm, base_key, pooling)
    return paired_interval(ours, base)


def tcr_verdict(values: Values, pooling: str = 'cls') -> Verdict:
    """Seed 001's claim by the criteria (docs/mosaic.md)."""
    found = mechanism(values, pooling)
    gain = difference(values, PRIMARY, MAE, LOCAL, pooling)
    gain_high = difference(values, SECONDARY, MAE, LOCAL, pooling)
    umae = difference(values, UMAE, MAE, LOCAL, pooling)
    whitened = paired_interval(
        metric(values, PRIMARY, LOCAL, pooling),
        metric(values, MAE, f'pca{max(PCA_DIMS)}_cell_linear_top1', pooling))
    findings = {
        'k* (first probed k >= MAE erank)': str(found['k_star']),
        'MAE top-128 - top-k* probe': text(found['rising']),
        'erank_cov, M-MAE 0.01 - MAE': text(found['rank_gain']),
        'cell probe, M-MAE 0.01 - MAE': text(gain),
        'cell probe, M-MAE 0.05 - MAE': text(gain_high),
        'cell probe, U-MAE - MAE': text(umae),
        'cell probe, M-MAE 0.01 - whitened MAE': text(whitened),
    }
    if not found['informative']:
        return Verdict(
            'undecided', 'not informative: MAE\'s top-k probe does not keep '
            'rising past its effective rank, or M-MAE does not raise the '
            'rank, so this regime cannot decide the claim', findings)
    if gain is not None and gain.has_interval and \
            gain.mean >= SUPPORT_GAIN and gain.low > 0 and \
            umae is not None and gain.mean >= umae.mean:
        if above_zero(whitened):
            return Verdict(
                'support', f'the gain is at least +{SUPPORT_GAIN:g} points '
                'with its interval above 0, at least U-MAE\'s, and above '
                'the whitened MAE', findings)
        return Verdict(
            'support, as a reparametrisation',
            f'the gain is at least +{SUPPORT_GAIN:g} points, but whitening '
            'MAE\'s features does as well', findings)
    if below(gain, REFUTE_BELOW) and below(gain_high, REFUTE_BELOW):
        return Verdict(
            'refutation', 'the mechanism is present and the gain\'s '
            f'interval lies entirely below +{REFUTE_BELOW:g} point at both '
            'λ', findings)
    return Verdict(
        'undecided', 'informative, but neither the support nor the '
        'refutation criterion is met', findings)


def normalised(values: Values, arm: str, key: str,
               pooling: str) -> Optional[Dict[int, float]]:
    """Seed -> (arm - random init) / (supervised - random init), or None
    when the normaliser is under :data:`MIN_NORMALISER` on a seed."""
    ours = metric(values, arm, key, pooling)
    low = metric(values, INIT, key, pooling)
    high = metric(values, SUPERVISED, key, pooling)
    seeds = sorted(set(ours) & set(low) & set(high))
    if any(high[s] - low[s] < MIN_NORMALISER for s in seeds):
        return None
    return {s: (ours[s] - low[s]) / (high[s] - low[s]) for s in seeds}


def local_global_verdict(values: Values, pooling: str = 'cls') -> Verdict:
    """Seed 000's claim by the criteria (docs/mosaic.md)."""
    parts = {(arm, key): normalised(values, arm, key, pooling)
             for arm in (MAE, SIMCLR) for key in (LOCAL, GLOBAL)}
    if any(part is None for part in parts.values()):
        return Verdict(
            'undecided', 'supervised - random init is under '
            f'{MIN_NORMALISER:g} point on a seed: the normalisation is '
            'undefined', {})
    d_local = paired_interval(parts[MAE, LOCAL], parts[SIMCLR, LOCAL])
    d_global = paired_interval(parts[MAE, GLOBAL], parts[SIMCLR, GLOBAL])
    seeds = sorted(set.intersection(*(set(part) for part in parts.values())))
    contrast = None if not seeds else t_interval(
        [(parts[MAE, LOCAL][s] - parts[SIMCLR, LOCAL][s]) -
         (parts[MAE, GLOBAL][s] - parts[SIMCLR, GLOBAL][s]) for s in seeds])
    findings = {
        'D_L (normalised local, MAE - SimCLR)': text(d_local),
        'D_G (normalised global, MAE - SimCLR)': text(d_global),
        'D_L - D_G': text(contrast),
    }
    if above_zero(d_local) and above_zero(contrast):
        return Verdict(
            'support', 'MAE is ahead of SimCLR locally, by more than '
            'globally', findings)
    if below(d_local, 0) or below(contrast, 0):
        return Verdict(
            'refutation', 'SimCLR keeps at least as much local information '
            '(D_L below 0), or MAE\'s lead is not larger locally than '
            'globally (D_L - D_G below 0)', findings)
    return Verdict('undecided', 'neither interval decides', findings)


def verdict_markdown(title: str, verdict: Verdict) -> List[str]:
    """A verdict as a heading line, its reason and a findings table."""
    lines = [f'**{title}: {verdict.outcome}.** {verdict.reason}.', '']
    if verdict.findings:
        lines += ['| finding | value |', '|---|---|']
        lines += [f'| {k} | {v} |' for k, v in verdict.findings.items()]
        lines.append('')
    return lines


def seeds_of(values: Mapping[str, Mapping[int, dict]]) -> List[int]:
    return sorted({seed for by_seed in values.values() for seed in by_seed})
