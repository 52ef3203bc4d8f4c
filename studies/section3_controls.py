"""The section-3 statements under every reading, and the controls.

The statements of :mod:`.information_flow` leave choices open that decide
some verdicts: which baseline "rises" starts from (the initialisation,
epoch 0; the first epoch; or mid-training for a late reading), whether the
curves come from the fixed held-out batches or from the training batches
(those have no epoch-0 value: the hook first logs during epoch 1), and
whether "meet at the end" means a gap that cannot be told from 0 or one
equivalent to 0 within a margin stated in advance
(:data:`.information_flow.MEET_MARGIN_FRACTION` of ``ln d``). A
:class:`Reading` fixes those choices; :func:`verdict_matrix` decides every
statement (1-5, J, and the paper's own Theorems T1 and T2) under each.

The controls ask what the failures come from. The same statements are
decided on comparisons that change one thing against the 128-wide,
30-epoch campaign: the projector width (the ceiling ``ln d`` of every
method's joint entropy) and the training length (the schedule
stretched). :func:`write_controls_page` puts them side by side with the
intervals over seeds and a figure of the two gaps "meet" is about. Beside
each "meet" it prints the critical margin
(:func:`.information_flow.critical_margin`): the smallest margin at which
the end gap would be equivalent to 0, so that a reader sees how far the
margin stated in advance is from flipping the verdict.
"""
import collections
import dataclasses
import datetime
import functools
import math
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from mmae_compare.intervals import welch_interval
from mmae_compare.records import read_curves, read_runs
from mmae_compare.report import _pyplot, legend_outside, save, write_page
from . import information_flow as flow
from .information_flow import RunCurves, Statement
from .information_flow_report import seed_curves

#: The verdict of a reading whose baseline was never logged.
NOT_MEASURED = 'not measured'
#: Short cell texts of the verdict matrices.
SHORT = {
    flow.HOLDS: 'holds',
    flow.FAILS: 'fails',
    flow.UNDECIDED: 'cannot tell',
    NOT_MEASURED: '–'
}
#: Where the curves come from, by the hook's key prefix.
SOURCES = {'minfo_heldout': 'held-out', 'minfo': 'training'}


@dataclasses.dataclass(frozen=True)
class Reading:
    """One way of reading the statements.

    Attributes:
        prefix: ``minfo_heldout`` (fixed held-out batches) or ``minfo``
            (training batches, mean over each epoch).
        first: The epoch a rise is measured from.
        equivalence: "Meet" as equivalence within the margin (else: a gap
            that cannot be told from 0).
    """
    prefix: str
    first: int
    equivalence: bool

    def label(self, mid: int) -> str:
        start = {
            0: 'from init (0)',
            1: 'from epoch 1'
        }.get(
            self.first, f'late ({mid} on)'
            if self.first == mid else f'from epoch {self.first}')
        meet = 'equivalence' if self.equivalence else 'difference'
        return f'{SOURCES.get(self.prefix, self.prefix)}, {start}, {meet}'


def readings(mid: int) -> List[Reading]:
    """Every reading: both sources, rises from 0, 1 and ``mid``, both
    meanings of "meet"."""
    return [
        Reading(prefix, first, equivalence) for prefix in SOURCES
        for first in (0, 1, mid) for equivalence in (False, True)
    ]


def roles_by_prefix(names: Sequence[str]) -> Dict[str, str]:
    """Role -> the one arm whose name starts with it (``simclr512``).

    Raises:
        ValueError: If two arms start with one role's name, or none of
            ``simclr`` and ``barlowtwins`` is found.
    """
    roles = {}
    for role in flow.ROLES:
        found = [n for n in names if n.startswith(role)]
        if len(found) > 1:
            raise ValueError(f'arms {found} all start with role {role!r}')
        if found:
            roles[role] = found[0]
    missing = {'simclr', 'barlowtwins'} - set(roles)
    if missing:
        raise ValueError(f'no arm for role(s) {sorted(missing)} among '
                         f'{list(names)}')
    return roles


def is_measured(curves: RunCurves, arms: Mapping[str, str], prefix: str,
                epoch: int) -> bool:
    """Whether any run of ``arms`` logged ``prefix`` values at ``epoch``."""
    key = flow.quantity_key(prefix, 'mutual_info')
    return any(
        epoch in run.get(key, {}) for (name, _), run in curves.items()
        if name in arms.values())


def decide(curves: RunCurves,
           arms: Mapping[str, str],
           labels: Mapping[str, str],
           reading: Reading,
           mid: int,
           last: int,
           ceiling: float,
           kernel: str = 'cov') -> List[Statement]:
    """Statements 1-5, J, T1 and T2 under one reading.

    Args:
        curves: The comparison's per-run curves.
        arms: Role -> arm name.
        labels: Arm name -> its label.
        reading: The reading.
        mid: The mid-training epoch.
        last: The last epoch.
        ceiling: ``ln d`` of the embedding width d (the equivalence
            margin is a fraction of it).
        kernel: The logged kernel.

    Returns:
        The statements, in order.
    """
    margin = (
        flow.MEET_MARGIN_FRACTION * ceiling if reading.equivalence else None)
    return (flow.evaluate_statements(
        curves,
        arms,
        labels,
        reading.first,
        mid,
        last,
        reading.prefix,
        kernel,
        meet_margin=margin,
        ceiling=ceiling) +
            flow.theorem_statements(curves, arms, labels, reading.first, last,
                                    reading.prefix, kernel, ceiling))


def verdict_matrix(curves: RunCurves, arms: Mapping[str, str],
                   labels: Mapping[str, str], mid: int, last: int,
                   ceiling: float) -> Dict[Reading, List[Statement]]:
    """Every reading of :func:`readings` -> its decided statements; a
    reading whose baseline epoch was never logged has none."""
    return {
        reading:
        (decide(curves, arms, labels, reading, mid, last, ceiling)
         if is_measured(curves, arms, reading.prefix, reading.first) else [])
        for reading in readings(mid)
    }


def statement_numbers(matrix: Mapping[Reading, List[Statement]]) -> List[str]:
    for statements in matrix.values():
        if statements:
            return [s.number for s in statements]
    return []


def verdict_of(statements: Sequence[Statement], number: str) -> str:
    for statement in statements:
        if statement.number == number:
            return statement.verdict
    return NOT_MEASURED


def matrix_cell(statements: Sequence[Statement], number: str,
                reading: Reading) -> str:
    """A statement's short verdict; under an equivalence reading, with
    the critical margin of its "meet" as a share of ``ln d``
    (``holds (0.028)``)."""
    cell = SHORT[verdict_of(statements, number)]
    critical = next((s.critical for s in statements if s.number == number),
                    None)
    if reading.equivalence and critical is not None:
        cell += f' ({critical.share:.3f})'
    return cell


def matrix_table(matrix: Mapping[Reading, List[Statement]],
                 mid: int) -> List[str]:
    """Markdown: a row per reading, a column per statement; under the
    equivalence readings each "meet" with its critical margin
    (:func:`matrix_cell`)."""
    numbers = statement_numbers(matrix)
    lines = [
        '| reading | ' + ' | '.join(numbers) + ' |',
        '|---|' + '---|' * len(numbers)
    ]
    for reading, statements in matrix.items():
        cells = [matrix_cell(statements, n, reading) for n in numbers]
        lines.append(f'| {reading.label(mid)} | ' + ' | '.join(cells) + ' |')
    return lines


def holding_summary(matrix: Mapping[Reading, List[Statement]],
                    mid: int) -> List[str]:
    """Per statement: under how many measured readings it holds, and
    which."""
    lines = []
    measured = {r: s for r, s in matrix.items() if s}
    for number in statement_numbers(matrix):
        holding = [
            r.label(mid) for r, s in measured.items()
            if verdict_of(s, number) == flow.HOLDS
        ]
        failing = sum(
            verdict_of(s, number) == flow.FAILS for s in measured.values())
        where = ('; '.join(holding) if holding else 'none')
        lines.append(f'- **{number}** holds under {len(holding)} of '
                     f'{len(measured)} readings, fails under {failing} '
                     f'(holds: {where}).')
    return lines


@dataclasses.dataclass(frozen=True)
class Control:
    """One comparison of the controls page.

    Attributes:
        name: Short name (``base``, ``width512``, ``length90``).
        title: What it changes, for the page.
        out_dir: The folder holding its ``runs.json``.
        feature_dim: The embedding width d (ceiling ``ln d``).
    """
    name: str
    title: str
    out_dir: str
    feature_dim: int


@dataclasses.dataclass
class LoadedControl:
    """A control with its recorded runs read."""
    control: Control
    curves: RunCurves
    arms: Dict[str, str]
    labels: Dict[str, str]
    last: int
    mid: int
    seeds: Dict[str, int]

    @property
    def ceiling(self) -> float:
        return math.log(self.control.feature_dim)

    @functools.cached_property
    def matrix(self) -> Dict[Reading, List[Statement]]:
        """Every reading's decided statements (:func:`verdict_matrix`),
        computed once: the page reads them for several tables."""
        return verdict_matrix(self.curves, self.arms, self.labels, self.mid,
                              self.last, self.ceiling)


def load_control(control: Control) -> LoadedControl:
    """Read a control's ``runs.json`` (spec and curves).

    Raises:
        ValueError: If it holds no hook curves.
    """
    spec, _ = read_runs(control.out_dir)
    curves = read_curves(control.out_dir)
    if not curves:
        raise ValueError(f'{control.out_dir}: runs.json holds no hook '
                         'curves')
    arms = roles_by_prefix([a.name for a in spec.arms if a.trains])
    seeds = {
        a.label: len({s
                      for (n, s) in curves if n == a.name})
        for a in spec.arms if a.trains
    }
    return LoadedControl(control, curves, arms,
                         {a.name: a.label
                          for a in spec.arms}, spec.epochs, spec.epochs // 2,
                         seeds)


def gap_values(loaded: LoadedControl,
               quantity: str,
               epoch: int,
               prefix: str = 'minfo_heldout') -> List[float]:
    """SimCLR minus Barlow Twins at ``epoch`` over seeds, in nats."""
    key = flow.quantity_key(prefix, quantity)
    return list(
        flow.gap(loaded.curves, loaded.arms['simclr'],
                 loaded.arms['barlowtwins'], key, epoch).values())


#: A control and the base on its seeds and methods (:func:`matched`).
Pair = Tuple[LoadedControl, LoadedControl]


def gap_rows(base: LoadedControl, pairs: Sequence[Pair]) -> List[str]:
    """Markdown: the end gaps "meet" is about, in nats and as a fraction
    of ``ln d``, with their critical margin
    (:func:`.information_flow.gap_critical`), for the base and each
    control, and each control's change of the fraction from the base on
    the same seeds (Welch: the seeds of two comparisons do not
    correspond)."""
    lines = [
        '| comparison | d | epochs | quantity | SimCLR - Barlow Twins '
        'at the end, nats (95 % CI) | / ln d | critical margin, nats '
        '(/ ln d) | change of / ln d from the base on the same seeds '
        '(Welch 95 % CI) |', '|---|---|---|---|---|---|---|---|'
    ]
    for item, same in [(base, base), *pairs]:
        for quantity in ('mutual_info', 'joint_entropy'):
            values = gap_values(item, quantity, item.last)
            share = (f'{np.mean(values) / item.ceiling:+.3f}'
                     if values else '–')
            critical = flow.gap_critical(values, item.ceiling)
            critical = ('–' if critical is None else
                        f'{critical.nats:.3f} ({critical.share:.3f})')
            change = '–'
            if item is not base and values:
                before = gap_values(same, quantity, same.last)
                change = welch_interval(
                    np.divide(values, item.ceiling),
                    np.divide(before, same.ceiling)).text(3)
            lines.append(f'| {item.control.name} | {item.control.feature_dim}'
                         f' | {item.last} | {quantity} | '
                         f'{flow.format_interval(flow.interval_of(values))} | '
                         f'{share} | {critical} | {change} |')
    return lines


def rise_values(item: LoadedControl,
                role: str,
                quantity: str,
                first: int = 0,
                prefix: str = 'minfo_heldout') -> List[float]:
    """The rise of ``quantity`` of a role's arm from ``first`` to the last
    epoch, per seed, in nats."""
    key, arm = flow.quantity_key(prefix, quantity), item.arms[role]
    return flow.paired(
        flow.values_at(item.curves, arm, key, item.last),
        flow.values_at(item.curves, arm, key, first), lambda a, b: a - b)


def rise_rows(pairs: Sequence[Pair]) -> List[str]:
    """Markdown: each control's held-out rises from the initialisation
    (statements 1 and 3, T1, T2), per method, beside the base's on the
    same seeds, and the change in nats (Welch: the seeds of two
    comparisons do not correspond)."""
    lines = [
        '| comparison | method | quantity | rise from the initialisation, '
        'nats (95 % CI) | the base on the same seeds | change, nats (Welch '
        '95 % CI) |', '|---|---|---|---|---|---|'
    ]
    for item, same in pairs:
        for role, arm in item.arms.items():
            for quantity in ('mutual_info', 'joint_entropy'):
                after = rise_values(item, role, quantity)
                before = rise_values(same, role, quantity)
                if not (after and before):
                    continue
                lines.append(
                    f'| {item.control.name} | {item.labels[arm]} | '
                    f'{quantity} | '
                    f'{flow.format_interval(flow.interval_of(after))} | '
                    f'{flow.format_interval(flow.interval_of(before))} | '
                    f'{welch_interval(after, before).text(3)} |')
    return lines


def ceiling_rows(loaded: Sequence[LoadedControl]) -> List[str]:
    """Markdown: each method's held-out joint entropy at the end as a
    fraction of ``ln d``."""
    lines = [
        '| comparison | method | joint entropy at the end (nats) | '
        '/ ln d |', '|---|---|---|---|'
    ]
    key = flow.quantity_key('minfo_heldout', 'joint_entropy')
    for item in loaded:
        for arm in item.arms.values():
            values = list(
                flow.values_at(item.curves, arm, key, item.last).values())
            if not values:
                continue
            lines.append(f'| {item.control.name} | {item.labels[arm]} | '
                         f'{flow.format_interval(flow.interval_of(values))} | '
                         f'{np.mean(values) / item.ceiling:.3f} |')
    return lines


def seeds_of(item: LoadedControl) -> List[int]:
    """The seeds every role's arm of ``item`` has curves for."""
    per_arm = [{s
                for (n, s) in item.curves if n == arm}
               for arm in item.arms.values()]
    return sorted(set.intersection(*per_arm)) if per_arm else []


def matched(base: LoadedControl, item: LoadedControl) -> LoadedControl:
    """``base`` restricted to the seeds and roles ``item`` has, so that a
    verdict that differs is not one of seed count or of a method the
    control did not train (``base`` itself if nothing is left out).

    Raises:
        ValueError: If ``base`` has none of ``item``'s seeds.
    """
    seeds, roles = seeds_of(item), set(item.arms)
    if seeds == seeds_of(base) and roles == set(base.arms):
        return base
    arms = {r: a for r, a in base.arms.items() if r in roles}
    curves = {
        k: v
        for k, v in base.curves.items()
        if k[1] in seeds and k[0] in arms.values()
    }
    if not curves:
        raise ValueError(f'{base.control.name} has no run with the seeds '
                         f'{seeds} of {item.control.name}: a control must '
                         'repeat some of its seeds')
    left_out = [base.labels[a] for r, a in base.arms.items() if r not in roles]
    name = (f'{base.control.name} on seeds ' + ', '.join(map(str, seeds)) +
            (f' without {", ".join(left_out)}' if left_out else ''))
    counts = {
        base.labels[arm]: len({s
                               for (n, s) in curves if n == arm})
        for arm in arms.values()
    }
    return dataclasses.replace(
        base,
        control=dataclasses.replace(base.control, name=name),
        curves=curves,
        arms=arms,
        seeds=counts)


@dataclasses.dataclass(frozen=True)
class Change:
    """A statement whose verdict differs between two comparisons under
    one reading, with the findings that moved."""
    number: str
    reading: str
    before: str
    after: str
    findings: List[str]


def verdict_changes(base: LoadedControl, item: LoadedControl) -> List[Change]:
    """The (statement, reading) pairs whose verdict differs from ``base``'s
    where both measured it. Readings pair by position (the late reading
    starts at each comparison's own mid-training epoch)."""
    changes = []
    for (_, before), (reading, after) in zip(base.matrix.items(),
                                             item.matrix.items()):
        for number in statement_numbers({reading: after}):
            old, new = verdict_of(before, number), verdict_of(after, number)
            if old == new or NOT_MEASURED in (old, new):
                continue
            old_st = next(s for s in before if s.number == number)
            new_st = next(s for s in after if s.number == number)
            changes.append(
                Change(number, reading.label(item.mid), old, new,
                       moved_findings(old_st, new_st)))
    return changes


def moved_findings(before: Statement, after: Statement) -> List[str]:
    """The parts of a statement whose finding differs, each with both
    intervals (all parts if none differs on its own; only ``after``'s if
    the two were measured on different methods)."""
    if len(before.findings) != len(after.findings):
        return [
            f'{a.subject}: {flow.format_interval(a.interval, ratio=a.ratio)}'
            f' {a.verdict_text()}' for a in after.findings
        ]
    pairs = list(zip(before.findings, after.findings))
    moved = [(b, a) for b, a in pairs if b.verdict != a.verdict] or pairs
    return [
        f'{a.subject}: {flow.format_interval(b.interval, ratio=b.ratio)} '
        f'{b.verdict_text()} -> '
        f'{flow.format_interval(a.interval, ratio=a.ratio)} '
        f'{a.verdict_text()}' for b, a in moved
    ]


def is_reversal(change: Change) -> bool:
    return {change.before, change.after} == {flow.HOLDS, flow.FAILS}


def count_text(changes: Sequence[Change]) -> str:
    """``5 verdict(s) differ, 1 of them between holds and fails (by
    statement: 3: 4, T1: 1)``."""
    by_number = collections.Counter(c.number for c in changes)
    return (f'{len(changes)} verdict(s) differ, '
            f'{sum(map(is_reversal, changes))} of them between holds and '
            'fails' +
            (' (by statement: ' + ', '.join(f'{n}: {k}'
                                            for n, k in by_number.items()) +
             ')' if changes else ''))


def change_rows(base: LoadedControl, pairs: Sequence[Pair]) -> List[str]:
    """Markdown: for each control, how many verdicts differ from the base
    comparison's on the same seeds and methods (:func:`matched`) and how
    many differ from leaving those out of the base alone; the reversals
    (holds <-> fails) named, and every difference, with the intervals
    that moved, in a collapsed list."""
    lines, details = [], []
    for item, same in pairs:
        changes = verdict_changes(same, item)
        lines.append(f'- **{item.control.name}** ({item.control.title}; seeds '
                     f'{", ".join(map(str, seeds_of(item)))}) against '
                     f'**{same.control.name}**: {count_text(changes)}.')
        lines += [
            f'  - reversed: {c.number} under "{c.reading}" '
            f'({SHORT[c.before]} -> {SHORT[c.after]})' for c in changes
            if is_reversal(c)
        ]
        if same is not base:
            lines.append(f'  - for comparison, {same.control.name} against '
                         f'{base.control.name}: '
                         f'{count_text(verdict_changes(base, same))}.')
        entries = []
        for c in changes:
            entries.append(f'- {c.number} under "{c.reading}": '
                           f'{SHORT[c.before]} -> {SHORT[c.after]}')
            entries += [f'  - {f}' for f in c.findings]
        if entries:
            details += [
                '', f'<details><summary>{item.control.name} against '
                f'{same.control.name}: every verdict that differs, with '
                'the intervals that moved</summary>', '', *entries, '',
                '</details>'
            ]
    lines += details
    return lines + [''] if lines else []


def statement_summary(base: LoadedControl, pairs: Sequence[Pair]) -> List[str]:
    """Markdown: per statement and comparison, under how many measured
    readings it holds (the base also on each control's seeds and
    methods)."""
    columns = [base]
    for _, same in pairs:
        if all(c.control.name != same.control.name for c in columns):
            columns.append(same)
    columns += [item for item, _ in pairs]
    matrices = [c.matrix for c in columns]
    lines = [
        '| statement | ' +
        ' | '.join(f'{c.control.name} (n={min(c.seeds.values())})'
                   for c in columns) + ' |', '|---|' + '---|' * len(columns)
    ]
    for number in statement_numbers(matrices[0]):
        cells = []
        for matrix in matrices:
            measured = [s for s in matrix.values() if s]
            held = sum(verdict_of(s, number) == flow.HOLDS for s in measured)
            cells.append(f'{held} of {len(measured)}')
        lines.append(f'| {number} | ' + ' | '.join(cells) + ' |')
    return lines


def plot_gaps(loaded: Sequence[LoadedControl], path: str) -> str:
    """The SimCLR - Barlow Twins gaps over training, as a fraction of
    ``ln d``, one curve per control against the training progress (epoch
    / last epoch), with the equivalence margin shaded."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, squeeze=False, figsize=(10, 3.8))
    margin = flow.MEET_MARGIN_FRACTION
    for ax, quantity in zip(axes[0], ('mutual_info', 'joint_entropy')):
        ax.axhspan(
            -margin,
            margin,
            color='0.85',
            lw=0,
            label=f'equivalence margin (+-{margin:g} ln d)')
        ax.axhline(0, color='0.5', lw=0.8)
        for item in loaded:
            key = flow.quantity_key('minfo_heldout', quantity)
            epochs = sorted({
                e
                for (n, _), run in item.curves.items()
                if n == item.arms['simclr'] for e in run.get(key, {})
            })
            points = [(e / item.last,
                       np.array(gap_values(item, quantity, e)) / item.ceiling)
                      for e in epochs]
            points = [(x, v) for x, v in points if v.size]
            if not points:
                continue
            xs = [x for x, _ in points]
            line, = ax.plot(
                xs, [v.mean() for _, v in points],
                label=f'{item.control.name} (d='
                f'{item.control.feature_dim}, {item.last} ep., '
                f'n={max(v.size for _, v in points)})')
            ax.fill_between(
                xs, [v.min() for _, v in points], [v.max() for _, v in points],
                color=line.get_color(),
                alpha=0.2,
                lw=0)
        ax.set_xlabel('training progress (epoch / last epoch)')
        ax.set_ylabel(f'SimCLR - Barlow Twins {quantity} / ln d')
        ax.grid(alpha=0.3)
    legend_outside(fig, axes)
    fig.suptitle('Held-out gaps between SimCLR and Barlow Twins over '
                 'training\nmean over seeds, range of the seeds shaded')
    fig.tight_layout()
    return save(fig, path)


def plot_curves(loaded: Sequence[LoadedControl], path: str) -> str:
    """Each method's held-out mutual information and joint entropy over
    training as a fraction of ``ln d`` (the rises of statements 1 and 3
    and of the theorems), a column per comparison, the mean over seeds
    with their range shaded."""
    plt = _pyplot()
    fig, axes = plt.subplots(
        2,
        len(loaded),
        squeeze=False,
        sharey='row',
        figsize=(3.6 * len(loaded) + 1, 6))
    colors = dict(
        zip(flow.ROLES, plt.rcParams['axes.prop_cycle'].by_key()['color']))
    base = loaded[0]
    # One legend entry per method: the base's labels, not "SimCLR (512)".
    names = {role: base.labels[arm] for role, arm in base.arms.items()}
    for column, item in enumerate(loaded):
        for row, quantity in enumerate(('mutual_info', 'joint_entropy')):
            ax = axes[row][column]
            key = flow.quantity_key('minfo_heldout', quantity)
            for role, arm in item.arms.items():
                points = seed_curves(item.curves, arm, key)
                epochs = list(points)
                values = [np.array(v) / item.ceiling for v in points.values()]
                ax.plot(
                    epochs, [v.mean() for v in values],
                    marker='.' if len(epochs) <= 40 else None,
                    color=colors[role],
                    label=names.get(role, role))
                ax.fill_between(
                    epochs, [v.min() for v in values],
                    [v.max() for v in values],
                    color=colors[role],
                    alpha=0.2,
                    lw=0)
            if quantity == 'joint_entropy':
                ax.axhline(1, color='0.3', ls='--', lw=0.8, label='ln d')
                ax.set_xlabel('epoch')
            else:
                ax.set_title(f'{item.control.name} (d='
                             f'{item.control.feature_dim}, {item.last} ep.)')
            if column == 0:
                ax.set_ylabel(f'{quantity} / ln d')
            ax.grid(alpha=0.3)
    legend_outside(fig, axes)
    fig.suptitle('Held-out mutual information and joint entropy per method '
                 '(mean over seeds, range shaded; epoch 0 is the '
                 'initialisation)')
    fig.tight_layout()
    return save(fig, path)


def findings_details(item: LoadedControl) -> List[str]:
    """Collapsible findings tables of every measured reading."""
    lines = []
    for reading, statements in item.matrix.items():
        if statements:
            lines += [
                f'<details><summary>{item.control.name}: '
                f'{reading.label(item.mid)}</summary>', '',
                *flow.verdict_table(statements), '', '</details>', ''
            ]
    return lines


def write_controls_page(controls: Sequence[Control],
                        report: str,
                        command: str = '',
                        notes: Optional[str] = None) -> str:
    """The readings and controls page.

    Args:
        controls: The base comparison first, then the controls.
        report: The markdown page written (the figure goes to
            ``figures/`` beside it).
        command: The command line the page names.
        notes: A markdown file appended as it is.

    Returns:
        The page's path.
    """
    loaded = [load_control(c) for c in controls]
    base = loaded[0]
    pairs = [(item, matched(base, item)) for item in loaded[1:]]
    report = osp.abspath(report)
    fig_path = osp.join(
        osp.dirname(report), 'siamese_controls', 'figures',
        'gaps_over_training.png')
    curves_path = osp.join(osp.dirname(fig_path), 'curves_by_control.png')
    link = lambda path: osp.relpath(path, osp.dirname(report))  # noqa: E731
    margin = flow.MEET_MARGIN_FRACTION
    lines = [
        '# The section-3 statements: readings and controls', '',
        f'Generated by `{command}` on '
        f'{datetime.date.today().isoformat()} from the runs.json of '
        'each comparison: ' +
        '; '.join(f'{item.control.name} (`{link(item.control.out_dir)}`: '
                  f'{item.control.title}; runs per method: ' +
                  ', '.join(f'{k} {v}' for k, v in item.seeds.items()) + ')'
                  for item in loaded) + '.', '',
        'Readings: curves from the fixed held-out batches or the '
        'training batches (mean over each epoch; no value before '
        'training, so no epoch-0 baseline: "–"); rises measured from '
        'the initialisation (epoch 0), from epoch 1, or over the '
        'second half of training ("late"); "meet at the end" as a gap '
        'that cannot be told from 0 at 95 % ("difference", the reading '
        'of docs/siamese_information_flow.md) or as a gap equivalent '
        f'to 0 within +-{margin:g} ln d (two one-sided 5 % tests: the '
        '90 % interval inside the margin; "equivalence"). The margin '
        'was fixed before the width and length controls ran. Beside '
        'each "meet" finding is its critical margin, in nats and as a '
        'share of ln d: the smallest margin within which the end gap '
        'would be equivalent to 0, max(|low|, |high|) of its 90 % '
        'interval; "meet" read as equivalence holds exactly when the '
        'margin exceeds it. In the equivalence rows of the matrices, '
        'the number beside 2 and 3 is that critical margin as a share '
        f'of ln d (the margin is {margin:g}); 3 also needs its rises. '
        'T1 and '
        "T2 are the paper's Theorems 1 and 2 as stated (Barlow Twins "
        'and spectral contrastive learning seek maximal mutual '
        'information and joint entropy: tested as their rise); J is '
        'our hypothesis from Theorem 2, which the paper does not '
        'state. Every interval is a Student-t interval over seeds.', ''
    ]
    for item in loaded:
        matrix = item.matrix
        lines += [
            f'## {item.control.name}: {item.control.title}', '',
            f'd = {item.control.feature_dim} (ln d = '
            f'{item.ceiling:.3f}, margin +-{margin * item.ceiling:.3f}'
            f' nats), {item.last} epochs, mid-training epoch '
            f'{item.mid}.', '', *matrix_table(matrix, item.mid), '',
            *holding_summary(matrix, item.mid), ''
        ]
    lines += [
        '## What the controls change', '',
        'Readings under which each statement holds, of those measured '
        '(each control also against the base on its own seeds and '
        'methods, so that a difference is not one of seed count):', '',
        *statement_summary(base, pairs), '', *gap_rows(base, pairs), '',
        'Held-out rises from the initialisation (statements 1 and 3, T1, '
        'T2), each control against the base on its seeds and methods, in '
        'nats (Welch: the seeds of two comparisons do not correspond):', '',
        *rise_rows(pairs), '', *ceiling_rows(loaded), '',
        f'![The SimCLR - Barlow Twins gaps over training]'
        f'({link(plot_gaps(loaded, fig_path))})', '',
        f'![Each method\'s mutual information and joint entropy over '
        f'training]({link(plot_curves(loaded, curves_path))})', '',
        *change_rows(base, pairs), '## Findings of every reading', ''
    ]
    for item in loaded:
        lines += findings_details(item)
    return write_page(report, lines, notes)


def parse_control(text: str) -> Control:
    """A :class:`Control` from ``NAME=DIR:D:TITLE``.

    Raises:
        ValueError: For another shape or a width below 2.
    """
    name, sep, rest = text.partition('=')
    parts = rest.split(':', 2)
    if not sep or not name or len(parts) != 3 or not parts[1].isdigit():
        raise ValueError(f'a control is NAME=DIR:D:TITLE (D the embedding '
                         f'width), got {text!r}')
    if int(parts[1]) < 2:
        raise ValueError(f'the embedding width D of {name!r} must be >= 2, '
                         f'got {parts[1]}')
    return Control(name, parts[2], parts[0], int(parts[1]))
