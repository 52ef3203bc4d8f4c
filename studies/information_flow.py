"""The information-flow paper's statements on Siamese methods, tested.

*Information Flow in Self-Supervised Learning* (section 3, figures 1-3)
states, for SimCLR, BYOL and Barlow Twins trained on CIFAR-10, of the
matrix information (alpha = 1) of the batch-normalised covariance of the
two branches' embeddings:

1. the matrix mutual information rises during training;
2. SimCLR's and Barlow Twins' mutual information meet at the end;
3. the matrix joint entropy rises, and SimCLR's and Barlow Twins' meet at
   the end;
4. the matrix JS divergence between the branches is small and rises
   ("symmetry breaking");
5. the JS divergence of the two eigenvalue distributions is much smaller
   than the matrix JS divergence;

and its Theorems 1 and 2 say Barlow Twins and spectral contrastive
learning *seek* maximal mutual information and joint entropy (T1, T2:
tested as their rise). From Theorem 2 we add a hypothesis the paper does
not state (J): those two methods end with more joint entropy than SimCLR
and BYOL. This module decides each from the per-epoch curves
``MatrixInfoHook`` logged in a comparison (:mod:`.curves`), with the
comparison's one kind of interval (:func:`.intervals.t_interval`, 95 %
Student-t over seeds). A statement *holds* when every interval it needs
excludes the contrary, *does not hold* when an interval excludes the
statement, and *cannot tell* otherwise; the thresholds that turn "small"
and "much smaller" into numbers are module constants, stated on the page.
"""
import dataclasses
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mmae_compare.curves import Curves
from mmae_compare.intervals import PairedInterval, t_interval

#: (arm, seed) -> that run's curves.
RunCurves = Mapping[Tuple[str, int], Curves]

HOLDS = 'holds'
FAILS = 'does not hold'
UNDECIDED = 'cannot tell at this scale'

#: "Small" JS divergence: below this fraction of the branch entropy.
SMALL_JS_FRACTION = 0.05
#: "Much smaller": the spectrum JS below this fraction of the matrix JS.
MUCH_SMALLER_RATIO = 0.1
#: "Meet" read as equivalence: the end gap within this fraction of the
#: ceiling ln d (0.24 nats at d = 128). Fixed before the width and length
#: controls were run: the paper reads "meet" off figures whose axis spans
#: the quantity's range, and 5 % of it is about what such a figure cannot
#: separate from equal.
MEET_MARGIN_FRACTION = 0.05
#: Equivalence is two one-sided 5 % tests: the 90 % interval in the margin.
EQUIVALENCE_LEVEL = 0.90

#: The methods a statement names, as roles an arm is mapped to.
ROLES = ('simclr', 'byol', 'barlowtwins', 'spectral')


def quantity_key(prefix: str, name: str, kernel: str = 'cov') -> str:
    """``minfo_heldout/mutual_info_cov`` from its parts."""
    return f'{prefix}/{name}_{kernel}'


def resolve_roles(names: Sequence[str], given: Mapping[str,
                                                       str]) -> Dict[str, str]:
    """Role -> arm name: ``given``, else the arm named like the role.

    Args:
        names: The comparison's arm names.
        given: Roles mapped explicitly (``--arm ROLE=NAME``).

    Returns:
        Every role of :data:`ROLES`; ``spectral`` only when it is given or
        an arm bears its name.

    Raises:
        ValueError: For an unknown role or an empty name.
    """
    unknown = sorted(set(given) - set(ROLES))
    if unknown or not all(given.values()):
        raise ValueError(f'roles must be ROLE=NAME with ROLE in {ROLES}, '
                         f'got {dict(given)}')
    roles = dict(given)
    for role in ROLES:
        if role not in roles and (role in names or role != 'spectral'):
            roles[role] = role
    return roles


def values_at(curves: RunCurves, arm: str, key: str,
              epoch: int) -> Dict[int, float]:
    """Seed -> the arm's value of ``key`` at ``epoch`` (runs that have it)."""
    return {
        seed: run[key][epoch]
        for (name, seed), run in curves.items()
        if name == arm and epoch in run.get(key, {})
    }


def paired(first: Mapping[int, float], second: Mapping[int, float],
           combine) -> List[float]:
    """``combine(first[s], second[s])`` over the seeds both have."""
    return [
        combine(first[s], second[s]) for s in sorted(set(first) & set(second))
    ]


def interval_of(values: Sequence[float]) -> Optional[PairedInterval]:
    return t_interval(values) if values else None


def critical_margin(interval: Optional[PairedInterval]) -> Optional[float]:
    """The smallest margin within which a gap is equivalent to 0.

    Equivalence within ``margin`` (:func:`equivalence_verdict`) holds
    when the 90 % interval lies inside ``(-margin, margin)``, that is
    exactly when ``margin`` exceeds ``max(|low|, |high|)``: the critical
    margin. How far a "meet" read as equivalence is from flipping.

    Args:
        interval: The gap's :data:`EQUIVALENCE_LEVEL` interval.

    Returns:
        ``max(|low|, |high|)``; ``None`` without an interval.
    """
    if interval is None or not interval.has_interval:
        return None
    return max(abs(interval.low), abs(interval.high))


@dataclasses.dataclass(frozen=True)
class CriticalMargin:
    """The critical margin (:func:`critical_margin`) of a "meet".

    Attributes:
        nats: The margin, in nats.
        ceiling: ``ln d``, which the margin is stated as a share of.
    """
    nats: float
    ceiling: float

    @property
    def share(self) -> float:
        """The margin as a share of ``ln d``."""
        return self.nats / self.ceiling

    def text(self) -> str:
        """``critical margin 0.134 nats = 0.028 ln d``."""
        return (f'critical margin {self.nats:.3f} nats = {self.share:.3f} '
                'ln d')


def gap_critical(values: Sequence[float],
                 ceiling: Optional[float]) -> Optional[CriticalMargin]:
    """The critical margin of a gap over seeds (``None`` without
    ``ceiling`` or without an interval)."""
    if ceiling is None or not values:
        return None
    nats = critical_margin(t_interval(values, EQUIVALENCE_LEVEL))
    return None if nats is None else CriticalMargin(nats, ceiling)


def sign_verdict(interval: Optional[PairedInterval],
                 positive_is_true: bool = True) -> str:
    """Holds if the interval is above 0 (below, for ``False``), fails if
    on the other side, cannot tell if it contains 0 or is missing."""
    if interval is None or not interval.has_interval:
        return UNDECIDED
    above, below = interval.low > 0, interval.high < 0
    if not (above or below):
        return UNDECIDED
    return HOLDS if above == positive_is_true else FAILS


def all_of(verdicts: Sequence[str]) -> str:
    """A statement about several methods holds if it holds for each."""
    if verdicts and all(v == HOLDS for v in verdicts):
        return HOLDS
    if any(v == FAILS for v in verdicts):
        return FAILS
    return UNDECIDED


@dataclasses.dataclass
class Finding:
    """One measured part of a statement.

    Attributes:
        subject: What was measured (method, quantity, epochs).
        interval: The measured mean and its interval.
        verdict: :data:`HOLDS`, :data:`FAILS`, :data:`UNDECIDED`, or
            what the part shows (``'apart'``, ``'shrinks'``...).
        ratio: The interval is of a ratio (printed unsigned).
        critical: For the end gap of a "meet": the smallest margin
            within which it would be equivalent to 0 (it does not decide
            the verdict).
    """
    subject: str
    interval: Optional[PairedInterval]
    verdict: str
    ratio: bool = False
    critical: Optional[CriticalMargin] = None

    def verdict_text(self) -> str:
        """The verdict, with the critical margin where there is one."""
        if self.critical is None:
            return self.verdict
        return f'{self.verdict}; {self.critical.text()}'


@dataclasses.dataclass
class Statement:
    """One of the paper's statements with its findings and verdict."""
    number: str
    text: str
    findings: List[Finding]
    verdict: str

    @property
    def critical(self) -> Optional[CriticalMargin]:
        """The critical margin of the statement's "meet", if it has one."""
        return next((f.critical
                     for f in self.findings if f.critical is not None), None)


def rise(curves: RunCurves, arm: str, key: str, first: int,
         last: int) -> Optional[PairedInterval]:
    """``key`` at ``last`` minus at ``first``, paired by seed."""
    return interval_of(
        paired(
            values_at(curves, arm, key, last),
            values_at(curves, arm, key, first), lambda a, b: a - b))


def rise_finding(curves: RunCurves, arm: str, label: str, key: str, first: int,
                 last: int) -> Finding:
    interval = rise(curves, arm, key, first, last)
    return Finding(f'{label}: epoch {last} - epoch {first}', interval,
                   sign_verdict(interval))


def gap(curves: RunCurves, arm_a: str, arm_b: str, key: str,
        epoch: int) -> Dict[int, float]:
    """Seed -> ``key`` of ``arm_a`` minus ``arm_b`` at ``epoch``."""
    a = values_at(curves, arm_a, key, epoch)
    b = values_at(curves, arm_b, key, epoch)
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def meeting_findings(
        curves: RunCurves,
        arm_a: str,
        arm_b: str,
        labels: Tuple[str, str],
        key: str,
        mid: int,
        last: int,
        ceiling: Optional[float] = None) -> Tuple[List[Finding], str]:
    """Whether two methods' values meet at the end.

    They meet when their gap at ``last`` is indistinguishable from 0 while
    at ``mid`` it was not, or when the gap's size shrank (paired by
    seed) and is indistinguishable from 0 at the end. A gap that excludes
    0 at the end fails; one that never excluded 0 cannot tell (the two
    were never apart). With ``ceiling`` (``ln d``), the end gap's finding
    also reports its critical margin (:func:`gap_critical`).
    """
    at_mid, at_last = (gap(curves, arm_a, arm_b, key, e) for e in (mid, last))
    name = f'{labels[0]} - {labels[1]}'
    mid_iv, last_iv = interval_of(list(at_mid.values())), \
        interval_of(list(at_last.values()))
    shrink_iv = interval_of(
        paired(at_mid, at_last, lambda mid, last: abs(mid) - abs(last)))
    apart_at_end = sign_verdict(last_iv) != UNDECIDED
    apart_mid = sign_verdict(mid_iv) != UNDECIDED
    if last_iv is None or not last_iv.has_interval:
        verdict = UNDECIDED
    elif apart_at_end:
        verdict = FAILS
    elif apart_mid or sign_verdict(shrink_iv) == HOLDS:
        verdict = HOLDS
    else:
        verdict = UNDECIDED
    findings = [
        Finding(f'{name} at epoch {mid}', mid_iv,
                'apart' if apart_mid else 'not apart'),
        Finding(
            f'{name} at epoch {last}',
            last_iv,
            'apart' if apart_at_end else 'not apart',
            critical=gap_critical(list(at_last.values()), ceiling)),
        Finding(
            f'abs(gap) at epoch {mid} - abs(gap) at epoch {last}', shrink_iv,
            'shrinks' if sign_verdict(shrink_iv) == HOLDS else 'grows'
            if sign_verdict(shrink_iv) == FAILS else 'no clear change'),
    ]
    return findings, verdict


def equivalence_verdict(values: Sequence[float],
                        margin: float) -> Tuple[Optional[PairedInterval], str]:
    """Whether a paired difference is equivalent to 0 within ``margin``.

    Two one-sided tests at 5 %: holds when the 90 % interval lies inside
    ``(-margin, margin)``, fails when the 95 % interval lies wholly
    outside it (the difference is larger than the margin), cannot tell
    otherwise.

    Returns:
        The 90 % interval (``None`` without values) and the verdict.
    """
    if not values:
        return None, UNDECIDED
    iv = t_interval(values, EQUIVALENCE_LEVEL)
    if not iv.has_interval:
        return iv, UNDECIDED
    if -margin < iv.low and iv.high < margin:
        return iv, HOLDS
    wide = t_interval(values)
    if wide.low > margin or wide.high < -margin:
        return iv, FAILS
    return iv, UNDECIDED


def equivalence_meeting(
        curves: RunCurves,
        arm_a: str,
        arm_b: str,
        labels: Tuple[str, str],
        key: str,
        last: int,
        margin: float,
        ceiling: Optional[float] = None) -> Tuple[List[Finding], str]:
    """Whether two methods' values meet at the end, read as equivalence:
    their gap at ``last`` is within ``margin`` (:func:`equivalence_verdict`).
    With ``ceiling`` (``ln d``), the finding also reports the critical
    margin (:func:`gap_critical`): the verdict holds exactly when
    ``margin`` exceeds it.
    """
    values = list(gap(curves, arm_a, arm_b, key, last).values())
    iv, verdict = equivalence_verdict(values, margin)
    return [
        Finding(
            f'{labels[0]} - {labels[1]} at epoch {last} (90 % CI; '
            f'margin +-{margin:.3f})',
            iv,
            'within margin' if verdict == HOLDS else
            'beyond margin' if verdict == FAILS else 'cannot tell',
            critical=gap_critical(values, ceiling))
    ], verdict


def fraction(curves: RunCurves, arm: str, num_key: str, den_key: str,
             epoch: int) -> Optional[PairedInterval]:
    """``num / den`` at ``epoch`` over seeds, its interval on the log
    scale (a ratio's spread is multiplicative), returned as ratios."""
    logs = paired(
        values_at(curves, arm, num_key, epoch),
        values_at(curves, arm, den_key, epoch), lambda n, d: math.log(n / d)
        if n > 0 and d > 0 else float('nan'))
    logs = [x for x in logs if math.isfinite(x)]
    if not logs:
        return None
    iv = t_interval(logs)
    if not iv.has_interval:
        return PairedInterval(math.exp(iv.mean), None, None, iv.n, iv.level)
    return PairedInterval(
        math.exp(iv.mean), math.exp(iv.low), math.exp(iv.high), iv.n, iv.level)


def below_verdict(interval: Optional[PairedInterval], threshold: float) -> str:
    """Holds if the interval lies below ``threshold``, fails if above."""
    if interval is None or not interval.has_interval:
        return UNDECIDED
    if interval.high < threshold:
        return HOLDS
    if interval.low > threshold:
        return FAILS
    return UNDECIDED


def evaluate_statements(curves: RunCurves,
                        arms: Mapping[str, str],
                        labels: Mapping[str, str],
                        first: int,
                        mid: int,
                        last: int,
                        prefix: str = 'minfo_heldout',
                        kernel: str = 'cov',
                        meet_margin: Optional[float] = None,
                        ceiling: Optional[float] = None) -> List[Statement]:
    """Statements 1-5 and the joint-entropy hypothesis J, decided.

    Args:
        curves: The comparison's per-run curves.
        arms: Role -> arm name, for the roles ``simclr``, ``byol``,
            ``barlowtwins`` and (optional) ``spectral``.
        labels: Arm name -> its label on the page.
        first: The epoch a rise is measured from (1: after the first
            epoch; 0: from the initialisation).
        mid: The mid-training epoch of "meet at the end".
        last: The last epoch.
        prefix: The hook's key prefix (``minfo_heldout``: the fixed
            held-out batches; ``minfo``: the training batches).
        kernel: The logged kernel (``cov``: batch-normalised covariance).
        meet_margin: ``None``: "meet at the end" is a gap that cannot be
            told from 0 (:func:`meeting_findings`); a margin in nats: a
            gap equivalent to 0 within it (:func:`equivalence_meeting`).
        ceiling: ``ln d``; when given, each "meet" also reports its
            critical margin (:func:`critical_margin`), in nats and as a
            share of ``ln d``.

    Returns:
        The statements in order, each with its findings and verdict.
    """
    key = {
        name: quantity_key(prefix, name, kernel)
        for name in ('mutual_info', 'joint_entropy', 'matrix_js',
                     'spectrum_js', 'entropy_1')
    }
    paper = [arms[r] for r in ('simclr', 'byol', 'barlowtwins') if r in arms]
    simclr, barlow = arms['simclr'], arms['barlowtwins']
    pair = (labels[simclr], labels[barlow])

    def meeting(quantity: str) -> Tuple[List[Finding], str]:
        if meet_margin is None:
            return meeting_findings(curves, simclr, barlow, pair,
                                    key[quantity], mid, last, ceiling)
        return equivalence_meeting(curves, simclr, barlow, pair, key[quantity],
                                   last, meet_margin, ceiling)

    def rises(quantity: str) -> List[Finding]:
        return [
            rise_finding(curves, arm, labels[arm], key[quantity], first, last)
            for arm in paper
        ]

    statements = []
    findings = rises('mutual_info')
    statements.append(
        Statement(
            '1', 'The matrix mutual information rises during training '
            '(SimCLR, BYOL, Barlow Twins).', findings,
            all_of([f.verdict for f in findings])))
    findings, verdict = meeting('mutual_info')
    statements.append(
        Statement(
            '2', "SimCLR's and Barlow Twins' mutual information meet at the "
            'end of training.', findings, verdict))
    rising = rises('joint_entropy')
    meet, meet_verdict = meeting('joint_entropy')
    statements.append(
        Statement(
            '3',
            "The matrix joint entropy rises during training, and SimCLR's "
            "and Barlow Twins' meet at the end.", rising + meet,
            all_of([f.verdict for f in rising] + [meet_verdict])))
    small = []
    for arm in paper:
        iv = fraction(curves, arm, key['matrix_js'], key['entropy_1'], last)
        small.append(
            Finding(
                f'{labels[arm]}: matrix JS / branch entropy at epoch {last}',
                iv,
                below_verdict(iv, SMALL_JS_FRACTION),
                ratio=True))
    rising = rises('matrix_js')
    statements.append(
        Statement(
            '4', 'The matrix JS divergence between the branches is small and '
            'rises during training.', small + rising,
            all_of([f.verdict for f in small + rising])))
    findings = []
    for arm in paper:
        iv = fraction(curves, arm, key['spectrum_js'], key['matrix_js'], last)
        findings.append(
            Finding(
                f'{labels[arm]}: spectrum JS / matrix JS at epoch {last}',
                iv,
                below_verdict(iv, MUCH_SMALLER_RATIO),
                ratio=True))
    statements.append(
        Statement(
            '5', 'The JS divergence of the eigenvalue distributions is much '
            'smaller than the matrix JS divergence.', findings,
            all_of([f.verdict for f in findings])))
    statements.append(
        joint_entropy_objective(curves, arms, labels, last,
                                key['joint_entropy']))
    return statements


def joint_entropy_objective(curves: RunCurves, arms: Mapping[str, str],
                            labels: Mapping[str, str], last: int,
                            key: str) -> Statement:
    """Our hypothesis J from Theorem 2 (the paper does not state it):
    Barlow Twins and spectral contrastive end with a higher joint entropy
    than SimCLR and BYOL (every such pair, by seed)."""
    maximisers = [arms[r] for r in ('barlowtwins', 'spectral') if r in arms]
    others = [arms[r] for r in ('simclr', 'byol') if r in arms]
    findings = []
    for high in maximisers:
        for low in others:
            iv = interval_of(list(gap(curves, high, low, key, last).values()))
            findings.append(
                Finding(f'{labels[high]} - {labels[low]} at epoch {last}', iv,
                        sign_verdict(iv)))
    return Statement(
        'J', 'Our hypothesis from Theorem 2, not a claim of the paper: '
        'Barlow Twins and spectral contrastive learning, which seek maximal '
        'joint entropy, end with more of it than SimCLR and BYOL.', findings,
        all_of([f.verdict for f in findings]))


def theorem_statements(curves: RunCurves,
                       arms: Mapping[str, str],
                       labels: Mapping[str, str],
                       first: int,
                       last: int,
                       prefix: str = 'minfo_heldout',
                       kernel: str = 'cov',
                       ceiling: Optional[float] = None) -> List[Statement]:
    """The paper's Theorems 1 and 2 as they are stated: Barlow Twins and
    spectral contrastive learning *seek* maximal mutual information (T1)
    and joint entropy (T2), tested as the quantity rising from ``first``
    to ``last`` for each of them.

    Args:
        curves: The comparison's per-run curves.
        arms: Role -> arm name (``spectral`` optional).
        labels: Arm name -> its label on the page.
        first: The epoch a rise is measured from.
        last: The last epoch.
        prefix: The hook's key prefix.
        kernel: The logged kernel.
        ceiling: ``ln d``; when given, each method's value at ``last`` as
            a fraction of it is reported too (how close the seeking got).

    Returns:
        Statements T1 and T2.
    """
    seekers = [arms[r] for r in ('barlowtwins', 'spectral') if r in arms]
    statements = []
    for number, quantity, name in (('T1', 'mutual_info', 'mutual information'),
                                   ('T2', 'joint_entropy', 'joint entropy')):
        key = quantity_key(prefix, quantity, kernel)
        findings = [
            rise_finding(curves, arm, labels[arm], key, first, last)
            for arm in seekers
        ]
        verdict = all_of([f.verdict for f in findings])
        if ceiling is not None:
            for arm in seekers:
                values = [
                    v / ceiling
                    for v in values_at(curves, arm, key, last).values()
                ]
                findings.append(
                    Finding(
                        f'{labels[arm]}: {name} / ln d at epoch {last}',
                        interval_of(values),
                        'of the ceiling',
                        ratio=True))
        statements.append(
            Statement(
                number, f'Theorem {number[1]}: Barlow Twins and spectral '
                f'contrastive learning seek maximal {name} (it rises during '
                'training).', findings, verdict))
    return statements


def format_interval(interval: Optional[PairedInterval],
                    digits: int = 3,
                    ratio: bool = False) -> str:
    """``+0.123 [+0.050, +0.196] (n=5)`` (a ratio: ``0.012 [0.008,
    0.017] (n=5)``), or why there is no interval."""
    if interval is None:
        return 'no common seed'
    text = interval.text(digits)
    return text.replace('+', '') if ratio else text


def verdict_table(statements: Sequence[Statement]) -> List[str]:
    """Markdown rows: statement, finding, mean [95 % CI] (n), verdict."""
    lines = [
        '| # | statement | measured | mean [95 % CI] (n) | finding | '
        'verdict |', '|---|---|---|---|---|---|'
    ]
    for st in statements:
        for i, f in enumerate(st.findings):
            lines.append(f'| {st.number if i == 0 else ""} | '
                         f'{st.text if i == 0 else ""} | {f.subject} | '
                         f'{format_interval(f.interval, ratio=f.ratio)} | '
                         f'{f.verdict_text()} | '
                         f'{"**" + st.verdict + "**" if i == 0 else ""} |')
    return lines
