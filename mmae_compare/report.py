"""The comparison's report: each arm against the reference, paired by seed.

Reads only ``runs.json`` (:mod:`.records`), so a comparison can be
reported while it runs, after its checkpoints are gone, or elsewhere.
Every difference is ``arm - reference`` on the seeds both have, with the
two-sided 95 % Student-t interval of :mod:`.intervals` ("n=1, no
interval" for one seed), and every cell says its n. Figures: one colour
and marker per arm in every figure, legends outside the axes.
"""
import datetime
import math
import os
import os.path as osp
import re
import textwrap
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .intervals import PairedInterval, format_mean_std, paired_interval
from .records import progress, read_runs
from .spec import POOLINGS, Arm, Comparison

#: Keys of a record that are not metrics.
BOOKKEEPING = {
    'arm', 'seed', 'epoch', 'checkpoint', 'train_images', 'test_images'
}
#: The effective rank an accuracy is plotted against, first found first.
SCATTER_RANKS = ('repr/erank_gram', 'repr/erank_cov', 'repr/rankme_raw')
VERDICT_WORDS = {
    'better': 'higher than {ref}',
    'worse': 'lower than {ref}',
    'no sig. difference': 'not distinguishable from {ref}',
    'n/a': ''
}
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*', '<', '>', 'h', 'p', '8')


# ----------------------------------------------------------------------------
# Metrics and values
# ----------------------------------------------------------------------------
def metric_label(key: str) -> str:
    """Table and axis name of a metric (a pooling prefix is dropped)."""
    head, sep, rest = key.partition('/')
    if sep and head in POOLINGS:
        key = rest
    if key == 'linear_top1':
        return 'linear probe top-1 (%)'
    if key == 'knn_top1':
        return 'kNN top-1 (%)'
    shots = re.fullmatch(r'lowshot(\d+)_top1', key)
    if shots:
        return f'{shots.group(1)}-shot/class linear top-1 (%)'
    if key in MOSAIC_LABELS:
        return MOSAIC_LABELS[key]
    shots = re.fullmatch(r'cell_lowshot(\d+)_top1', key)
    if shots:
        return f'per-cell {shots.group(1)}-shot/class linear top-1 (%)'
    return key.split('/')[-1] if key.startswith('repr/') else key


#: Table names of the mosaic evaluation's headline metrics
#: (:mod:`mmae_plugin.evaluation.mosaic`).
MOSAIC_LABELS = {
    'cell_linear_top1': 'per-cell linear probe top-1 (%)',
    'presence_balanced_top1': 'presence balanced accuracy (%)',
}


def kernel_label(key: str) -> str:
    """A representation statistic named with its kernel."""
    name = key.split('/')[-1]
    if 'gram' in name:
        kernel = 'uncentred Gram kernel of the l2-normalised features'
    elif 'cov' in name:
        kernel = ('centred kernel: batch-standardised covariance, i.e. the '
                  'correlation matrix')
    elif name.startswith('rankme'):
        kernel = 'singular values of the raw features'
    else:
        kernel = 'see mmae_plugin.evaluation.statistics'
    return f'{name} ({kernel})'


def poolings_of(rows: List[dict], spec: Comparison) -> List[str]:
    """The protocol's poolings that the records carry."""
    return [
        p for p in spec.protocol.poolings if any(
            k.startswith(p + '/') for r in rows for k in r)
    ]


def accuracy_keys(rows: List[dict], pooling: str) -> List[str]:
    """Linear, kNN top-1, then low-shot top-1 by shots, as recorded."""
    keys = {
        k[len(pooling) + 1:]
        for r in rows for k in r if k.startswith(pooling + '/')
    }
    lowshot = sorted((k for k in keys if re.fullmatch(r'lowshot\d+_top1', k)),
                     key=lambda k: int(re.sub(r'\D', '', k)))
    cell_lowshot = sorted(
        (k for k in keys if re.fullmatch(r'cell_lowshot\d+_top1', k)),
        key=lambda k: int(re.sub(r'\D', '', k)))
    headline = ('linear_top1', 'knn_top1', 'cell_linear_top1')
    return ([k for k in headline if k in keys] + lowshot + cell_lowshot +
            [k for k in ('presence_balanced_top1', ) if k in keys])


def rank_keys(rows: List[dict], pooling: str) -> List[str]:
    """The effective-rank statistics the records carry (``repr/...``)."""
    prefix = f'{pooling}/repr/'
    keys = sorted({
        k[len(pooling) + 1:]
        for r in rows for k in r if k.startswith(prefix)
    })
    return [k for k in keys if 'erank' in k or 'rankme' in k]


def other_keys(rows: List[dict], spec: Comparison) -> List[str]:
    """Metrics outside the frozen evaluation: test configs and the like."""
    pooled = tuple(f'{p}/' for p in spec.protocol.poolings)
    return sorted({
        k
        for r in rows for k in r if k not in BOOKKEEPING
        and not k.startswith(pooled) and not k.startswith('time/')
    })


def values(rows: List[dict], arm: Arm, epoch: int,
           key: str) -> Dict[int, float]:
    """Seed -> value at ``epoch`` (a random-init arm's only epoch is 0)."""
    at = epoch if arm.trains else 0
    return {
        r['seed']: r[key]
        for r in rows if r['arm'] == arm.name and r['epoch'] == at and key in r
    }


def difference(rows: List[dict], spec: Comparison, arm: Arm, epoch: int,
               key: str) -> Optional[PairedInterval]:
    """``arm - reference`` paired by seed (``None``: the reference itself,
    or no common seed)."""
    if arm.name == spec.reference:
        return None
    return paired_interval(
        values(rows, arm, epoch, key),
        values(rows, spec.arm(spec.reference), epoch, key))


def final_epoch(rows: List[dict], spec: Comparison) -> int:
    """The newest evaluation epoch the reference has, else the last."""
    reference = spec.arm(spec.reference)
    done = [
        e for e in spec.eval_epochs
        if any(r['arm'] == reference.name and r['epoch'] == (
            e if reference.trains else 0) for r in rows)
    ]
    return done[-1] if done else spec.epochs


# ----------------------------------------------------------------------------
# Tables and text
# ----------------------------------------------------------------------------
def results_table(rows: List[dict],
                  spec: Comparison,
                  epoch: int,
                  keys: Sequence[str],
                  label: Callable[[str], str] = metric_label) -> List[str]:
    """Mean ± std, n and the paired difference of every arm, per key.

    Args:
        rows: The records.
        spec: The comparison.
        epoch: The epoch compared.
        keys: Full record keys (``'cls/linear_top1'``, ``'test/acc'``).
        label: Column title of a key.

    Returns:
        The markdown table's lines.
    """
    ref = spec.arm(spec.reference).label
    header = '| arm | ' + ' | '.join(f'{label(k)} | n | Δ vs {ref} [95 % CI]'
                                     for k in keys) + ' |'
    lines = [header, '|---|' + '---|---|---|' * len(keys)]
    for arm in spec.arms:
        cells = []
        for key in keys:
            ours = values(rows, arm, epoch, key)
            diff = difference(rows, spec, arm, epoch, key)
            cells += [
                format_mean_std(list(ours.values())),
                str(len(ours)), '–' if diff is None else diff.text()
            ]
        lines.append(f'| {arm.label} | ' + ' | '.join(cells) + ' |')
    return lines


def curve_table(rows: List[dict], spec: Comparison, key: str) -> List[str]:
    """One metric over the evaluation epochs (mean ± std, n)."""
    lines = [
        '| arm | ' + ' | '.join(f'epoch {e}' for e in spec.eval_epochs) + ' |',
        '|---|' + '---|' * len(spec.eval_epochs)
    ]
    for arm in spec.arms:
        cells = []
        for epoch in spec.eval_epochs:
            got = list(values(rows, arm, epoch, key).values())
            cells.append(
                f'{format_mean_std(got)} (n={len(got)})' if got else '–')
        lines.append(f'| {arm.label} | ' + ' | '.join(cells) + ' |')
    return lines


def summary_lines(rows: List[dict], spec: Comparison, epoch: int) -> List[str]:
    """Each arm against the reference in words, per pooling.

    A difference is called higher or lower only when its 95 % interval
    excludes 0; the last line says how many such calls chance alone makes.
    """
    ref = spec.arm(spec.reference).label
    lines, count = [], 0
    for arm in spec.arms:
        for pooling in poolings_of(rows, spec):
            parts = []
            for key in accuracy_keys(rows, pooling):
                diff = difference(rows, spec, arm, epoch, f'{pooling}/{key}')
                if diff is None:
                    continue
                count += 1
                words = VERDICT_WORDS[diff.verdict()].format(ref=ref)
                parts.append(f'{metric_label(key).split(" (")[0]} '
                             f'{diff.text()}' +
                             (f': {words}' if words else ''))
            if parts:
                lines.append(f'* **{arm.label}, {pooling}**: ' +
                             '; '.join(parts) + '.')
    lines.append(f'* {count} comparisons with {ref} at 95 % each: about '
                 f'{0.05 * count:.1f} would look significant by chance '
                 'alone; an interval that nearly touches 0 is weak evidence.')
    return lines


def options_text(arm: Arm) -> str:
    if not arm.trains:
        return ('no training: the evaluation encoder\'s own initialisation '
                'under the seed')
    options = options_line(arm.options)
    return f'`{arm.config}`' + (f' with `{options}`' if options else '')


def first_images(count: Optional[int], everything: str) -> str:
    """``'the first 7,680'`` or ``everything`` (``None``: all of them)."""
    return everything if count is None else f'the first {count:,}'


def options_line(options) -> str:
    return ' '.join(f'{key}={value}' for key, value in options)


def setup_lines(spec: Comparison) -> List[str]:
    """What was compared and how, one bullet each."""
    protocol = spec.protocol
    config_images = "the config's"
    common = (f'; for every arm `{options_line(spec.cfg_options)}`'
              if spec.cfg_options else '')
    lines = [
        '* Arms: ' + '; '.join(f'**{a.label}**: {options_text(a)}'
                               for a in spec.arms) + '.',
        f'* Every trained arm: {spec.epochs} epochs (the schedule ends '
        f'there), {first_images(spec.images, config_images)} '
        f'training images; seeds {", ".join(map(str, spec.seeds))}'
        f'{common}.'
    ]
    if protocol.eval_config is not None:
        sets = (f'{first_images(protocol.bank_images, "all")} training and '
                f'{first_images(protocol.test_images, "all")} test images')
        shots = (' and low-shot probes on '
                 f'{" and ".join(map(str, protocol.shots))} labels per class '
                 '(a fixed subset per seed, the same for every arm)'
                 if protocol.shots else '')
        lines.append(
            f'* Evaluation of the checkpoints of epochs '
            f'{", ".join(map(str, spec.eval_epochs))} on frozen features '
            f'({", ".join(protocol.poolings)} pooling) of '
            f'`{protocol.eval_config}`: weighted kNN (the config\'s k and '
            'temperature, float64 similarities), a linear probe '
            '(standardised, l2-regularised logistic regression, weight decay '
            f'{protocol.weight_decay:g}, L-BFGS){shots}; {sets}.')
    for name, config in protocol.test_configs:
        lines.append(f'* `{name}/*`: the metrics of `tools/test.py '
                     f'{config}` on each checkpoint.')
    ref = spec.arm(spec.reference).label
    lines.append(f'* Δ: arm − {ref} paired by seed over the seeds both have, '
                 'mean with a two-sided 95 % Student-t interval; "n=1, no '
                 'interval" when only one seed is paired; n is the number of '
                 'seeds of each cell.')
    return lines


# ----------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    plt.rcParams.update({
        'xtick.labelsize': 9,
        'ytick.labelsize': 9,
        'axes.labelsize': 9,
        'axes.titlesize': 10,
        'legend.fontsize': 8
    })
    return plt


def arm_style(spec: Comparison, arm: Arm) -> dict:
    """The arm's colour and marker, the same in every figure."""
    import matplotlib
    index = [a.name for a in spec.arms].index(arm.name)
    colours = matplotlib.colormaps['tab10' if len(spec.arms
                                                  ) <= 10 else 'tab20']
    return {
        'color': colours(index % colours.N),
        'marker': MARKERS[index % len(MARKERS)]
    }


def legend_outside(fig, axes) -> None:
    """One legend for the figure, right of the axes."""
    handles, labels = {}, []
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    if labels:
        fig.legend([handles[label] for label in labels],
                   labels,
                   loc='center left',
                   bbox_to_anchor=(1.0, 0.5))


def save(fig, path: str) -> str:
    os.makedirs(osp.dirname(path), exist_ok=True)
    fig.savefig(
        path, dpi=110, bbox_inches='tight', metadata={'Software': None})
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def error_bar(diff: PairedInterval) -> Tuple[float, float]:
    return (0.0, 0.0) if not diff.has_interval else \
        (diff.mean - diff.low, diff.high - diff.mean)


def n_text(ns: Sequence[int]) -> str:
    ns = sorted(set(ns))
    return f'n={ns[0]}' if len(ns) == 1 else f'n={ns[0]}-{ns[-1]}'


def plot_paired_differences(rows: List[dict], spec: Comparison, epoch: int,
                            path: str) -> str:
    """Per pooling, each arm's paired difference with its interval."""
    plt = _pyplot()
    poolings = poolings_of(rows, spec)
    others = [a for a in spec.arms if a.name != spec.reference]
    fig, axes = plt.subplots(
        1, len(poolings), squeeze=False, figsize=(5.5 * len(poolings), 4.2))
    width = 0.8 / max(1, len(others))
    for ax, pooling in zip(axes[0], poolings):
        keys = accuracy_keys(rows, pooling)
        for i, arm in enumerate(others):
            points = [
                (j, d) for j, key in enumerate(keys)
                if (d := difference(rows, spec, arm, epoch, f'{pooling}/{key}')
                    ) is not None
            ]
            if not points:
                continue
            bars = np.array([error_bar(d) for _, d in points]).T
            ax.errorbar([j - 0.4 + width * (i + 0.5) for j, _ in points],
                        [d.mean for _, d in points],
                        yerr=bars,
                        capsize=4,
                        ls='none',
                        **arm_style(spec, arm),
                        label=f'{arm.label} '
                        f'({n_text([d.n for _, d in points])})')
        ax.axhline(0, color='k', lw=1)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([textwrap.fill(metric_label(k), 16) for k in keys])
        ax.set_ylabel(f'arm − {spec.arm(spec.reference).label}, paired by '
                      'seed (points)')
        ax.set_title(f'{pooling} features, epoch {epoch}')
        ax.grid(alpha=0.3)
    legend_outside(fig, axes)
    fig.suptitle('Paired difference (mean over seeds, 95 % Student-t '
                 'interval; none for n=1)')
    fig.tight_layout()
    return save(fig, path)


def plot_curves(rows: List[dict], spec: Comparison, keys: Sequence[str],
                path: str, label: Callable[[str], str]) -> str:
    """Mean ± std over seeds of each key over the evaluation epochs;
    ``keys`` are full keys, one panel each."""
    plt = _pyplot()
    columns = min(4, len(keys))
    lines = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(
        lines, columns, squeeze=False, figsize=(4.2 * columns, 3.6 * lines))
    for ax, key in zip(axes.flat, keys):
        for arm in spec.arms:
            points = [(e, list(values(rows, arm, e, key).values()))
                      for e in spec.eval_epochs]
            points = [(e, v) for e, v in points if v]
            if not points:
                continue
            ax.errorbar([e for e, _ in points],
                        [float(np.mean(v)) for _, v in points],
                        yerr=[
                            float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
                            for _, v in points
                        ],
                        capsize=3,
                        ls='-' if arm.trains else '--',
                        **arm_style(spec, arm),
                        label=f'{arm.label} '
                        f'({n_text([len(v) for _, v in points])})')
        ax.set_xlabel('training epoch')
        ax.set_ylabel(textwrap.fill(label(key.split('/', 1)[1]), 36))
        ax.set_title(key.split('/')[0])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis('off')
    legend_outside(fig, axes)
    fig.suptitle('Mean ± std over seeds')
    fig.tight_layout()
    return save(fig, path)


def plot_rank_scatter(rows: List[dict], spec: Comparison, pooling: str,
                      rank: str, epoch: int, path: str) -> str:
    """Every run's accuracies against one effective rank."""
    plt = _pyplot()
    keys = accuracy_keys(rows, pooling)
    fig, axes = plt.subplots(
        1, len(keys), squeeze=False, figsize=(4.2 * len(keys), 3.8))
    for ax, key in zip(axes[0], keys):
        for arm in spec.arms:
            xs = values(rows, arm, epoch, f'{pooling}/{rank}')
            ys = values(rows, arm, epoch, f'{pooling}/{key}')
            seeds = sorted(set(xs) & set(ys))
            if seeds:
                style = arm_style(spec, arm)
                ax.scatter([xs[s] for s in seeds], [ys[s] for s in seeds],
                           marker=style['marker'],
                           color=style['color'],
                           alpha=0.75,
                           label=f'{arm.label} (n={len(seeds)})')
        ax.set_xlabel(textwrap.fill(kernel_label(rank), 40))
        ax.set_ylabel(metric_label(key))
        ax.grid(alpha=0.3)
    legend_outside(fig, axes)
    fig.suptitle(f'Every run at epoch {epoch}, {pooling} features: accuracy '
                 'against effective rank')
    fig.tight_layout()
    return save(fig, path)


def correlation(
    rows: List[dict],
    spec: Comparison,
    epoch: int,
    x_key: str,
    y_key: str,
    trained_only: bool = False
) -> Tuple[Optional[float], Optional[float], int]:
    """Pearson correlation over the runs at ``epoch``, its two-sided
    p-value (scipy's) and n.

    Args:
        rows: The evaluation records.
        spec: The comparison.
        epoch: The epoch (a random-init arm's runs count at epoch 0).
        x_key: The first quantity.
        y_key: The second.
        trained_only: Leave the random-init arms out.

    Returns:
        ``(r, p, n)``; ``r`` and ``p`` are ``None`` below 3 runs or for a
        constant quantity.
    """
    from scipy import stats
    pairs = []
    for arm in spec.arms:
        if trained_only and not arm.trains:
            continue
        xs, ys = values(rows, arm, epoch,
                        x_key), values(rows, arm, epoch, y_key)
        pairs += [(xs[s], ys[s]) for s in sorted(set(xs) & set(ys))]
    if len(pairs) < 3:
        return None, None, len(pairs)
    x, y = np.array(pairs).T
    if x.std() == 0 or y.std() == 0:
        return None, None, len(pairs)
    result = stats.pearsonr(x, y)
    return float(result.statistic), float(result.pvalue), len(pairs)


def correlation_line(rows: List[dict], spec: Comparison, epoch: int,
                     x_key: str, y_key: str, what: str) -> str:
    """A markdown bullet: the correlation over the trained runs, and, when
    the comparison has random-init runs, with them as well (they sit at
    the bottom-left and make almost any correlation look strong)."""
    r, p, n = correlation(rows, spec, epoch, x_key, y_key, trained_only=True)
    text = (f'* Pearson correlation of {what} over the {n} trained runs at '
            f'epoch {epoch}: ' +
            ('n/a' if r is None else f'{r:+.2f} (p = {p:.2g})'))
    if any(not arm.trains for arm in spec.arms):
        r_all, _, n_all = correlation(rows, spec, epoch, x_key, y_key)
        text += (f'; with the {n_all - n} random-init runs as well: ' +
                 ('n/a' if r_all is None else f'{r_all:+.2f}'))
    return text + '.'


def option_sweeps(spec: Comparison) -> Dict[str, List[List[Arm]]]:
    """Option -> groups of >= 3 arms with one config that differ in that
    numeric option only (each group sorted by it)."""
    groups = {}
    for arm in spec.arms:
        numeric = [
            k for k, v in arm.options
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        for key in numeric:
            rest = tuple(
                sorted((k, repr(v)) for k, v in arm.options if k != key))
            groups.setdefault((key, arm.config, rest), []).append(arm)
    sweeps = {}
    for (key, _, _), arms in groups.items():
        if len(arms) >= 3:
            sweeps.setdefault(key, []).append(
                sorted(arms, key=lambda a: dict(a.options)[key]))
    return sweeps


def plot_sweep(rows: List[dict], spec: Comparison, epoch: int, pooling: str,
               option: str, groups: List[List[Arm]], path: str) -> str:
    """Paired difference against one option's value (log axis); each
    group's arms joined by a thin line."""
    plt = _pyplot()
    keys = accuracy_keys(rows, pooling)
    fig, axes = plt.subplots(
        1, len(keys), squeeze=False, figsize=(4.2 * len(keys), 3.8))
    for ax, key in zip(axes[0], keys):
        for arms in groups:
            points = [
                (dict(arm.options)[option], arm, d) for arm in arms
                if (d := difference(rows, spec, arm, epoch, f'{pooling}/{key}')
                    ) is not None
            ]
            ax.plot([x for x, _, _ in points], [d.mean for _, _, d in points],
                    color='0.6',
                    lw=1,
                    zorder=1)
            for x, arm, diff in points:
                ax.errorbar([x], [diff.mean],
                            yerr=np.array(error_bar(diff))[:, None],
                            capsize=4,
                            **arm_style(spec, arm),
                            label=f'{arm.label} (n={diff.n})')
        ax.axhline(0, color='k', lw=1)
        ax.set_xscale('log')
        ax.set_xlabel(option)
        ax.set_ylabel(
            textwrap.fill(
                f'Δ {metric_label(key)} vs {spec.arm(spec.reference).label}',
                36))
        ax.grid(alpha=0.3)
    legend_outside(fig, axes)
    fig.suptitle(f'{option}: paired difference, {pooling} features, epoch '
                 f'{epoch} (95 % interval)')
    fig.tight_layout()
    return save(fig, path)


# ----------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------
def figure_sections(rows: List[dict], spec: Comparison, epoch: int,
                    fig_dir: str, link: Callable[[str], str]) -> List[str]:
    """Learning curves, effective ranks, option sweeps and the rank
    scatter, each with its tables and figure."""
    lines = []
    poolings = poolings_of(rows, spec)
    if len(spec.eval_epochs) > 1 and poolings:
        lines += ['## Learning curves', '']
        keys = []
        for pooling in poolings:
            key = f'{pooling}/{accuracy_keys(rows, pooling)[0]}'
            keys += [f'{pooling}/{k}' for k in accuracy_keys(rows, pooling)]
            lines += [
                f'### {metric_label(key.split("/", 1)[1])}, {pooling}', '',
                *curve_table(rows, spec, key), ''
            ]
        path = plot_curves(rows, spec, keys,
                           osp.join(fig_dir, 'learning_curves.png'),
                           metric_label)
        lines += [f'![learning curves]({link(path)})', '']
    ranks = rank_keys(rows, poolings[0]) if poolings else []
    if ranks:
        pooling = poolings[0]
        lines += [
            f'## Effective rank ({pooling}, test features)', '',
            f'### at epoch {epoch}, paired', '', *results_table(
                rows, spec, epoch, [f'{pooling}/{k}' for k in ranks]), ''
        ]
        if len(spec.eval_epochs) > 1:
            for key in ranks:
                lines += [
                    f'### {kernel_label(key)}', '',
                    *curve_table(rows, spec, f'{pooling}/{key}'), ''
                ]
            path = plot_curves(rows, spec, [f'{pooling}/{k}' for k in ranks],
                               osp.join(fig_dir, 'rank_curves.png'),
                               kernel_label)
            lines += [f'![rank curves]({link(path)})', '']
        rank = next((k for k in SCATTER_RANKS if k in ranks), ranks[0])
        lines += [f'## Accuracy against effective rank (`{rank[5:]}`)', '']
        for key in accuracy_keys(rows, pooling):
            lines.append(
                correlation_line(rows, spec, epoch, f'{pooling}/{rank}',
                                 f'{pooling}/{key}',
                                 f'{metric_label(key)} with `{rank[5:]}`'))
        path = plot_rank_scatter(rows, spec, pooling, rank, epoch,
                                 osp.join(fig_dir, 'accuracy_vs_rank.png'))
        lines += ['', f'![accuracy against effective rank]({link(path)})', '']
    sweeps = option_sweeps(spec) if poolings else {}
    for option, groups in sweeps.items():
        name = re.sub(r'[^A-Za-z0-9]+', '_', option).strip('_')
        path = plot_sweep(rows, spec, epoch, poolings[0], option, groups,
                          osp.join(fig_dir, f'sweep_{name}.png'))
        lines += [
            f'## Sweep of `{option}`', '', *[
                f'* {", ".join(a.label for a in arms)}: one config, '
                f'only `{option}` differs.' for arms in groups
            ], '', f'![sweep of {option}]({link(path)})', ''
        ]
    return lines


def write_page(report: str,
               lines: List[str],
               notes: Optional[str] = None) -> str:
    """Write a markdown page: its lines, then the notes file as it is.

    Returns:
        The page's path.
    """
    if notes:
        with open(notes) as f:
            lines = lines + [f.read().rstrip('\n'), '']
    os.makedirs(osp.dirname(report), exist_ok=True)
    with open(report, 'w') as f:
        f.write('\n'.join(lines))
    return report


def write_report(out_dir: str,
                 report: Optional[str] = None,
                 command: str = '',
                 title: Optional[str] = None,
                 notes: Optional[str] = None) -> str:
    """Write the markdown report and its figures from ``runs.json``.

    Args:
        out_dir: The comparison's folder (``runs.json``; the figures go to
            its ``figures/``).
        report: Markdown path (default ``<out-dir>/report.md``).
        command: The command line the page names.
        title: The page title (default: the arms against the reference).
        notes: A markdown file appended to the page as it is.

    Returns:
        The report path.
    """
    spec, rows = read_runs(out_dir)
    report = osp.abspath(report or osp.join(out_dir, 'report.md'))
    fig_dir = osp.join(osp.abspath(out_dir), 'figures')
    link = lambda path: osp.relpath(path, osp.dirname(report))  # noqa: E731
    epoch = final_epoch(rows, spec)
    ref = spec.arm(spec.reference).label
    state = progress(spec, rows)
    title = title or (', '.join(a.label
                                for a in spec.arms if a.name != spec.reference)
                      + f' against {ref}')
    runs_json = link(osp.join(osp.abspath(out_dir), 'runs.json'))
    lines = [
        f'# {title}', '', f'Generated by `{command}` on '
        f'{datetime.date.today().isoformat()} from {len(rows)} '
        f'evaluations (`{runs_json}`); every number is computed from '
        'that file.', ''
    ]
    if state['missing']:
        lines += [
            f'**Not finished**: {state["done"]} of {state["wanted"]} '
            f'evaluations. Missing: {"; ".join(state["missing"])}. '
            'Every cell says over how many seeds it is taken (n).', ''
        ]
    lines += [
        '## Setup', '', *setup_lines(spec), '',
        f'## Summary in plain words (epoch {epoch})', '',
        *summary_lines(rows, spec, epoch), ''
    ]
    for pooling in poolings_of(rows, spec):
        keys = [f'{pooling}/{k}' for k in accuracy_keys(rows, pooling)]
        lines += [
            f'## Results at epoch {epoch}, {pooling} features', '',
            *results_table(rows, spec, epoch, keys), ''
        ]
    if poolings_of(rows, spec):
        path = plot_paired_differences(
            rows, spec, epoch, osp.join(fig_dir, 'paired_differences.png'))
        lines += [f'![paired differences]({link(path)})', '']
    others = other_keys(rows, spec)
    if others:
        lines += [
            f'## Other metrics at epoch {epoch}', '',
            *results_table(rows, spec, epoch, others, str), ''
        ]
    lines += figure_sections(rows, spec, epoch, fig_dir, link)
    return write_page(report, lines, notes)
