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
intervals over seeds and a figure of the two gaps "meet" is about.
"""
import dataclasses
import datetime
import math
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from mmae_compare.records import read_curves, read_runs
from mmae_compare.report import _pyplot, legend_outside, save, write_page
from . import information_flow as flow
from .information_flow import RunCurves, Statement

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
        meet_margin=margin) +
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


def matrix_table(matrix: Mapping[Reading, List[Statement]],
                 mid: int) -> List[str]:
    """Markdown: a row per reading, a column per statement."""
    numbers = statement_numbers(matrix)
    lines = [
        '| reading | ' + ' | '.join(numbers) + ' |',
        '|---|' + '---|' * len(numbers)
    ]
    for reading, statements in matrix.items():
        cells = [SHORT[verdict_of(statements, n)] for n in numbers]
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


def gap_rows(loaded: Sequence[LoadedControl]) -> List[str]:
    """Markdown: the end gaps "meet" is about, in nats and as a fraction
    of ``ln d``, per control."""
    lines = [
        '| comparison | d | epochs | quantity | SimCLR - Barlow Twins '
        'at the end, nats (95 % CI) | / ln d |', '|---|---|---|---|---|---|'
    ]
    for item in loaded:
        for quantity in ('mutual_info', 'joint_entropy'):
            values = gap_values(item, quantity, item.last)
            iv = flow.interval_of(values)
            share = (f'{np.mean(values) / item.ceiling:+.3f}'
                     if values else '–')
            lines.append(f'| {item.control.name} | {item.control.feature_dim}'
                         f' | {item.last} | {quantity} | '
                         f'{flow.format_interval(iv)} | {share} |')
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


def change_rows(base: LoadedControl,
                controls: Sequence[LoadedControl]) -> List[str]:
    """Markdown: for each control, the statements and readings whose
    verdict differs from the base comparison's."""
    base_matrix = verdict_matrix(base.curves, base.arms, base.labels, base.mid,
                                 base.last, base.ceiling)
    lines = []
    for item in controls:
        matrix = verdict_matrix(item.curves, item.arms, item.labels, item.mid,
                                item.last, item.ceiling)
        changes = []
        for (b_reading, b_st), (reading, st) in zip(base_matrix.items(),
                                                    matrix.items()):
            for number in statement_numbers(matrix):
                old, new = verdict_of(b_st, number), verdict_of(st, number)
                if old != new and NOT_MEASURED not in (old, new):
                    changes.append(f'{number} under '
                                   f'"{reading.label(item.mid)}": '
                                   f'{SHORT[old]} -> {SHORT[new]}')
        lines.append(f'- **{item.control.name}** ({item.control.title}): ' + (
            '; '.join(changes) if changes else 'no verdict changes.'))
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


def findings_details(item: LoadedControl) -> List[str]:
    """Collapsible findings tables of every measured reading."""
    lines = []
    matrix = verdict_matrix(item.curves, item.arms, item.labels, item.mid,
                            item.last, item.ceiling)
    for reading, statements in matrix.items():
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
    report = osp.abspath(report)
    fig_path = osp.join(
        osp.dirname(report), 'siamese_controls', 'figures',
        'gaps_over_training.png')
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
        'was fixed before the width and length controls ran. T1 and '
        "T2 are the paper's Theorems 1 and 2 as stated (Barlow Twins "
        'and spectral contrastive learning seek maximal mutual '
        'information and joint entropy: tested as their rise); J is '
        'our hypothesis from Theorem 2, which the paper does not '
        'state. Every interval is a Student-t interval over seeds.', ''
    ]
    for item in loaded:
        matrix = verdict_matrix(item.curves, item.arms, item.labels, item.mid,
                                item.last, item.ceiling)
        lines += [
            f'## {item.control.name}: {item.control.title}', '',
            f'd = {item.control.feature_dim} (ln d = '
            f'{item.ceiling:.3f}, margin +-{margin * item.ceiling:.3f}'
            f' nats), {item.last} epochs, mid-training epoch '
            f'{item.mid}.', '', *matrix_table(matrix, item.mid), '',
            *holding_summary(matrix, item.mid), ''
        ]
    lines += [
        '## What the controls change', '', *change_rows(loaded[0], loaded[1:]),
        '', *gap_rows(loaded), '', *ceiling_rows(loaded), '',
        f'![The SimCLR - Barlow Twins gaps over training]'
        f'({link(plot_gaps(loaded, fig_path))})', '',
        '## Findings of every reading', ''
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
