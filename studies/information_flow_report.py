"""The information-flow page of a comparison: figures 1-3 and verdicts.

Reads ``runs.json`` (the per-epoch curves ``MatrixInfoHook`` logged, see
:mod:`mmae_compare.curves`) and draws the paper's figures as it draws them,
one curve per method over training epochs, here the mean over seeds with
the range of the seeds shaded; then decides the paper's statements
(:mod:`.information_flow`) and writes a markdown page. Arms keep the
colour and marker of the comparison report
(:func:`mmae_compare.report.arm_style`).
"""
import datetime
import math
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from mmae_compare.records import read_curves, read_runs
from mmae_compare.report import (_pyplot, arm_style, legend_outside, save,
                                 write_page)
from mmae_compare.spec import Comparison
from . import information_flow as flow
from .information_flow import RunCurves

#: The figures: file stem -> (title, [(quantity, panel title)]).
FIGURES = {
    'figure1_mutual_information':
    ('Figure 1: matrix mutual information between the branches',
     [('mutual_info', 'mutual information (nats)')]),
    'figure2_joint_entropy': ('Figure 2: matrix joint entropy of the branches',
                              [('joint_entropy', 'joint entropy (nats)')]),
    'figure3_js_divergence':
    ('Figure 3: JS divergence between the branches (log scale)',
     [('matrix_js', '(a) matrix JS divergence (nats)'),
      ('spectrum_js', '(b) JS divergence of the eigenvalues (nats)')]),
}
#: Quantities bounded by ln d: their panels draw the ceiling.
BOUNDED_BY_LN_D = ('mutual_info', 'joint_entropy')
#: Quantities drawn on a log scale: BYOL's early JS divergence is 10-100
#: times the others', which hides every other curve on a linear axis.
LOG_SCALE = ('matrix_js', 'spectrum_js')
#: The figure stem's suffix per hook prefix (held-out figures keep the
#: paper's names).
FIGURE_SUFFIX = {'minfo_heldout': '', 'minfo': '_training'}


def seed_curves(curves: RunCurves, arm: str,
                key: str) -> Dict[int, List[float]]:
    """Epoch -> the values of every seed of ``arm`` that logged it."""
    by_epoch: Dict[int, List[float]] = {}
    for (name, _), run in sorted(curves.items()):
        if name == arm:
            for epoch, value in run.get(key, {}).items():
                by_epoch.setdefault(epoch, []).append(value)
    return dict(sorted(by_epoch.items()))


def plot_quantities(curves: RunCurves,
                    spec: Comparison,
                    panels: Sequence[tuple],
                    prefix: str,
                    kernel: str,
                    title: str,
                    path: str,
                    ceiling: Optional[float] = None) -> str:
    """One panel per quantity: per arm the mean over seeds, the seeds'
    range shaded, epoch 0 the initialisation; the ceiling ``ln d`` on the
    panels of quantities bounded by it, JS divergences on a log scale."""
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(panels), squeeze=False, figsize=(4.8 * len(panels), 3.8))
    for ax, (quantity, label) in zip(axes[0], panels):
        key = flow.quantity_key(prefix, quantity, kernel)
        for arm in spec.arms:
            points = seed_curves(curves, arm.name, key)
            if not points:
                continue
            epochs = list(points)
            runs = max(len(v) for v in points.values())
            style = arm_style(spec, arm)
            ax.fill_between(
                epochs, [min(v) for v in points.values()],
                [max(v) for v in points.values()],
                color=style['color'],
                alpha=0.2,
                lw=0)
            ax.plot(
                epochs, [float(np.mean(v)) for v in points.values()],
                markevery=max(1,
                              len(epochs) // 10),
                ms=4,
                **style,
                label=f'{arm.label} (n={runs})')
        if ceiling is not None and quantity in BOUNDED_BY_LN_D:
            ax.axhline(
                ceiling,
                color='0.3',
                ls='--',
                lw=1,
                label=f'ceiling ln d = {ceiling:.2f}')
        if quantity in LOG_SCALE:
            ax.set_yscale('log')
        ax.set_xlabel('training epoch (0: initialisation)')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which='both')
    legend_outside(fig, axes)
    where = ('held-out batches' if prefix.endswith('_heldout') else
             'training batches, mean over each epoch')
    fig.suptitle(f'{title}\nmean over seeds, range of the seeds shaded '
                 f'({where}: {prefix}, {kernel} kernel)')
    fig.tight_layout()
    return save(fig, path)


def value_table(curves: RunCurves, spec: Comparison, prefix: str, kernel: str,
                epochs: Sequence[int]) -> List[str]:
    """Mean ± std over seeds of each quantity at a few epochs."""
    quantities = [
        'mutual_info', 'joint_entropy', 'matrix_js', 'spectrum_js', 'entropy_1'
    ]
    lines = [
        '| method | epoch | ' + ' | '.join(quantities) + ' |',
        '|---|---|' + '---|' * len(quantities)
    ]
    for arm in spec.arms:
        for epoch in epochs:
            cells = []
            for quantity in quantities:
                key = flow.quantity_key(prefix, quantity, kernel)
                got = list(
                    flow.values_at(curves, arm.name, key, epoch).values())
                digits = 4 if quantity.endswith('js') else 3
                spread = (f' ± {np.std(got, ddof=1):.{digits}f}'
                          if len(got) > 1 else '')
                cells.append(
                    '–' if not got else f'{np.mean(got):.{digits}f}{spread} '
                    f'(n={len(got)})')
            if any(c != '–' for c in cells):
                lines.append(f'| {arm.label} | {epoch} | ' +
                             ' | '.join(cells) + ' |')
    return lines


def write_information_flow_page(out_dir: str,
                                report: str,
                                arms: Mapping[str, str],
                                command: str = '',
                                first: int = 1,
                                mid: Optional[int] = None,
                                prefixes: Sequence[str] = ('minfo_heldout',
                                                           'minfo'),
                                kernel: str = 'cov',
                                notes: Optional[str] = None,
                                feature_dim: int = 128) -> str:
    """Figures 1-3 and the statements' verdicts of a comparison.

    Args:
        out_dir: The comparison's folder (``runs.json``; figures go to
            ``<out_dir>/figures/``).
        report: The markdown page written.
        arms: Role (``simclr``, ``byol``, ``barlowtwins``, ``spectral``)
            -> arm name.
        command: The command line the page names.
        first: Epoch a rise is measured from.
        mid: Mid-training epoch (default: half the comparison's epochs).
        prefixes: Hook key prefixes decided and drawn.
        kernel: The logged kernel.
        notes: A markdown file appended to the page as it is.
        feature_dim: The embedding width d (the figures' ceiling ln d, of
            which the critical margins of "meet" are a share).

    Returns:
        The page's path.
    """
    spec, _ = read_runs(out_dir)
    curves = read_curves(out_dir)
    missing = sorted(set(arms.values()) - {a.name for a in spec.arms})
    if missing:
        raise ValueError(f'arms {missing} are not in the comparison '
                         f'(arms: {[a.name for a in spec.arms]})')
    if not curves:
        raise ValueError(f'{out_dir}: runs.json holds no hook curves (runs '
                         'without MatrixInfoHook, or recorded before curves '
                         'were)')
    last, mid = spec.epochs, mid or spec.epochs // 2
    labels = {a.name: a.label for a in spec.arms}
    report = osp.abspath(report)
    fig_dir = osp.join(osp.abspath(out_dir), 'figures')
    link = lambda path: osp.relpath(path, osp.dirname(report))  # noqa: E731
    counts = {
        a.label: len({s
                      for (n, s) in curves if n == a.name})
        for a in spec.arms if a.trains
    }
    lines = [
        '# Information flow in Siamese methods: figures 1-3 and the '
        "paper's statements", '', f'Generated by `{command}` on '
        f'{datetime.date.today().isoformat()} from the per-epoch '
        'MatrixInfoHook curves in `' +
        link(osp.join(osp.abspath(out_dir), 'runs.json')) + '` (runs '
        'per method: ' + ', '.join(f'{k} {v}'
                                   for k, v in counts.items()) + ').', '',
        f'Rises are epoch {last} minus epoch {first}, paired by seed; '
        f'"meet at the end" compares the gap at epoch {mid} with the '
        f'gap at epoch {last}; ratios are geometric means over seeds '
        'with the interval taken on the log scale. Every interval is '
        'a two-sided 95 % Student-t interval over seeds. "Small" (4) '
        f'means below {flow.SMALL_JS_FRACTION:g} of the branch '
        f'entropy, "much smaller" (5) below {flow.MUCH_SMALLER_RATIO:g}'
        ' times the matrix JS divergence. Beside the end gap of each '
        '"meet" (2, 3) is its critical margin, in nats and as a share of '
        'ln d: the smallest margin within which the gap would be '
        'equivalent to 0 (two one-sided 5 % tests: max(|low|, |high|) of '
        'its 90 % interval), the reading of "meet" as equivalence on '
        'docs/siamese_controls.md.', ''
    ]
    for prefix in prefixes:
        statements = flow.evaluate_statements(
            curves,
            arms,
            labels,
            first,
            mid,
            last,
            prefix,
            kernel,
            ceiling=math.log(feature_dim))
        where = ('the fixed held-out batches' if prefix.endswith('_heldout')
                 else 'the training batches (mean over each epoch)')
        lines += [
            f'## Verdicts on {where} (`{prefix}/*_{kernel}`)', '',
            '| # | verdict |', '|---|---|',
            *[f'| {s.number} | {s.verdict} |'
              for s in statements], '', *flow.verdict_table(statements), ''
        ]
        for stem, (title, panels) in FIGURES.items():
            stem += FIGURE_SUFFIX.get(prefix, '_' + prefix)
            path = plot_quantities(curves, spec, panels, prefix, kernel, title,
                                   osp.join(fig_dir, stem + '.png'),
                                   math.log(feature_dim))
            lines += [f'![{title}, {where}]({link(path)})', '']
        lines += [
            f'Values (mean ± std over seeds, `{prefix}`):', '', *value_table(
                curves, spec, prefix, kernel, sorted({0, first, mid, last})),
            ''
        ]
    return write_page(report, lines, notes)
