"""The study's report: tables with controls, paired intervals, figures.

Reads only the evaluation rows (``<run>/eval/epoch<e>.json``), so a
partially finished study can be reported at any time; every paired
difference is against MAE on the seeds both arms have, with the interval
of :mod:`mmae_plugin.evidence.intervals` (``n=1, no interval`` for one
seed). Outputs go under ``<out-dir>/report/`` unless a report path is given;
``runs.json`` stores checkpoint paths relative to the out dir.
"""
import datetime
import os
import os.path as osp
import textwrap
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .intervals import format_mean_std, paired_interval
from .study import (BASELINE, POOLINGS, REPO, Study, arm_by_name, load_study,
                    write_json_atomic)

#: Accuracy metrics of every pooling, in table order.
ACCURACIES = ('linear_top1', 'knn_top1', 'lowshot{}_top1')
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X')


def accuracy_keys(study: Study) -> List[str]:
    """``linear_top1``, ``knn_top1``, then ``lowshot<k>_top1`` per shot."""
    keys = ['linear_top1', 'knn_top1']
    return keys + [f'lowshot{shot}_top1' for shot in study.shots]


def metric_label(key: str) -> str:
    if key == 'linear_top1':
        return 'linear probe top-1 (%)'
    if key == 'knn_top1':
        return 'kNN top-1 (%, float64)'
    if key.startswith('lowshot'):
        return f'{key[7:].split("_")[0]}-shot/class linear top-1 (%)'
    return key


def stat_name(key: str) -> str:
    """``'cls/repr/erank_cov'`` -> ``'erank_cov'``."""
    return key.split('/')[-1]


def kernel_label(key: str) -> str:
    """Axis label of a representation statistic naming its kernel."""
    name = stat_name(key)
    if 'gram' in name:
        kernel = 'uncentred Gram kernel of the l2-normalised features'
    elif 'cov' in name:
        kernel = ('centred kernel: batch-standardised covariance, i.e. the '
                  'correlation matrix')
    elif name.startswith('rankme'):
        kernel = 'singular values of the raw features'
    else:
        kernel = 'kernel: see mmae_plugin.evaluation.statistics'
    return f'{name} ({kernel})'


def rank_keys(rows: List[dict], pooling: str) -> List[str]:
    """The effective-rank statistics the rows carry (named at runtime)."""
    prefix = f'{pooling}/repr/'
    keys = sorted({k for row in rows for k in row if k.startswith(prefix)})
    return [k for k in keys if 'erank' in k or 'rankme' in k]


def values_by_seed(rows: List[dict], arm: str, epoch: int,
                   key: str) -> Dict[int, float]:
    return {r['seed']: r[key] for r in rows
            if r['arm'] == arm and r['epoch'] == epoch and key in r}


def arm_epoch(study: Study, arm: str, epoch: int) -> int:
    """The random-init control has one evaluation, epoch 0."""
    return epoch if arm_by_name(arm).trains else 0


def results_table(rows: List[dict], study: Study, pooling: str,
                  epoch: int, keys: Optional[Sequence[str]] = None,
                  label: Callable[[str], str] = metric_label) -> List[str]:
    """Mean ± std and the paired difference to MAE of every arm.

    Args:
        rows: The evaluations.
        study: The study they belong to.
        pooling: ``'cls'`` or ``'cls+mean'``.
        epoch: The epoch compared (the random-init control's is 0).
        keys: Metrics without the pooling prefix; the accuracies by
            default.
        label: Column title of a metric.

    Returns:
        The markdown table's lines.
    """
    keys = accuracy_keys(study) if keys is None else keys
    header = '| arm | n | ' + ' | '.join(
        f'{label(k)} | Δ vs MAE [95 % CI]' for k in keys) + ' |'
    lines = [header, '|---|---|' + '---|---|' * len(keys)]
    for arm in study.arms:
        at = arm_epoch(study, arm, epoch)
        cells = []
        n = 0
        for key in keys:
            full = f'{pooling}/{key}'
            ours = values_by_seed(rows, arm, at, full)
            base = values_by_seed(rows, BASELINE, epoch, full)
            n = max(n, len(ours))
            diff = paired_interval(ours, base) if arm != BASELINE else None
            cells += [format_mean_std(list(ours.values())),
                      '–' if diff is None else diff.text()]
        lines.append(f'| {arm_by_name(arm).label} | {n} | ' +
                     ' | '.join(cells) + ' |')
    return lines


def curve_table(rows: List[dict], study: Study, pooling: str,
                key: str) -> List[str]:
    """One metric over the evaluation epochs (mean ± std, n)."""
    lines = ['| arm | ' + ' | '.join(f'epoch {e}' for e in study.eval_epochs)
             + ' |', '|---|' + '---|' * len(study.eval_epochs)]
    for arm in study.arms:
        cells = []
        for epoch in study.eval_epochs:
            values = list(values_by_seed(rows, arm, arm_epoch(study, arm,
                                                              epoch),
                                         f'{pooling}/{key}').values())
            cells.append(f'{format_mean_std(values)} (n={len(values)})'
                         if values else '–')
        lines.append(f'| {arm_by_name(arm).label} | ' + ' | '.join(cells) +
                     ' |')
    return lines


VERDICT_WORDS = {'better': ': higher than MAE', 'worse': ': lower than MAE',
                 'no sig. difference': ': not distinguishable from MAE',
                 'n/a': ''}


def summary_lines(rows: List[dict], study: Study, epoch: int) -> List[str]:
    """Each arm against MAE at ``epoch``, in words, per pooling.

    A difference is called higher or lower only when its 95 % interval
    excludes 0; the number of M-MAE comparisons says how many such calls
    chance alone would make.
    """
    keys = accuracy_keys(study)
    lines = []
    for arm in (a for a in study.arms if a != BASELINE):
        for pooling in POOLINGS:
            parts = []
            for key in keys:
                full = f'{pooling}/{key}'
                diff = paired_interval(
                    values_by_seed(rows, arm, arm_epoch(study, arm, epoch),
                                   full),
                    values_by_seed(rows, BASELINE, epoch, full))
                if diff is not None:
                    parts.append(f'{metric_label(key).split(" (")[0]} '
                                 f'{diff.text()}'
                                 f'{VERDICT_WORDS[diff.verdict()]}')
            if parts:
                lines.append(f'* **{arm_by_name(arm).label}, {pooling}**: '
                             + '; '.join(parts) + '.')
    tested = [a for a in study.arms
              if a != BASELINE and arm_by_name(a).kind == 'pretrain']
    count = len(tested) * len(keys) * len(POOLINGS)
    lines.append(
        f'* The M-MAE arms make {count} comparisons with MAE at 95 % each: '
        f'about {0.05 * count:.1f} would look significant by chance alone. '
        'The controls are not hypotheses: they say how much the '
        'architecture alone (random init) and labels (supervised) give '
        'through the same evaluation.')
    return lines


# ----------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def plot_paired_differences(rows: List[dict], study: Study, epoch: int,
                            path: str) -> str:
    """Per pooling, each arm's paired difference to MAE with its interval.

    One marker per arm and metric; the error bar is the 95 % t-interval of
    the mean paired difference (none for n=1, said in the legend).
    """
    plt = _pyplot()
    keys = accuracy_keys(study)
    others = [a for a in study.arms if a != BASELINE]
    fig, axes = plt.subplots(1, len(POOLINGS), figsize=(6 * len(POOLINGS),
                                                        4.5), squeeze=False)
    for ax, pooling in zip(axes[0], POOLINGS):
        width = 0.8 / max(1, len(others))
        for i, arm in enumerate(others):
            xs, ys, lows, highs = [], [], [], []
            ns = set()
            for j, key in enumerate(keys):
                full = f'{pooling}/{key}'
                diff = paired_interval(
                    values_by_seed(rows, arm, arm_epoch(study, arm, epoch),
                                   full),
                    values_by_seed(rows, BASELINE, epoch, full))
                if diff is None:
                    continue
                ns.add(diff.n)
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(diff.mean)
                lows.append(0 if not diff.has_interval
                            else diff.mean - diff.low)
                highs.append(0 if not diff.has_interval
                             else diff.high - diff.mean)
            if xs:
                n_text = '/'.join(map(str, sorted(ns)))
                extra = ', no interval' if ns == {1} else ', 95 % CI'
                ax.errorbar(xs, ys, yerr=[lows, highs], fmt=MARKERS[i % 7],
                            capsize=4, ls='none',
                            label=f'{arm_by_name(arm).label} (n={n_text}'
                            f'{extra})')
        ax.axhline(0, color='k', lw=1)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([metric_label(k).replace(' (%', '\n(%')
                            for k in keys], fontsize=7)
        ax.set_ylabel('arm − MAE, paired by seed (points)')
        ax.set_title(f'{pooling} features, epoch {epoch}')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle('Paired difference to MAE (mean over seeds, 95 % '
                 'Student-t interval)')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(rows: List[dict], study: Study, keys: Sequence[str],
                path: str, label_of) -> str:
    """Mean over seeds (± std) of each key over the evaluation epochs."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(POOLINGS), len(keys),
                             figsize=(4.2 * len(keys), 3.6 * len(POOLINGS)),
                             squeeze=False)
    for row_axes, pooling in zip(axes, POOLINGS):
        for ax, key in zip(row_axes, keys):
            for i, arm in enumerate(study.arms):
                pts = []
                for epoch in study.eval_epochs:
                    values = list(values_by_seed(
                        rows, arm, arm_epoch(study, arm, epoch),
                        f'{pooling}/{key}').values())
                    if values:
                        std = float(np.std(values, ddof=1)) \
                            if len(values) > 1 else 0.0
                        pts.append((epoch, float(np.mean(values)), std,
                                    len(values)))
                if not pts:
                    continue
                xs, ms, ss, ns = zip(*pts)
                n_text = f'{min(ns)}' if min(ns) == max(ns) else \
                    f'{min(ns)}-{max(ns)}'
                ax.errorbar(xs, ms, yerr=ss, marker=MARKERS[i % 7],
                            capsize=3, ls='--' if not
                            arm_by_name(arm).trains else '-',
                            label=f'{arm_by_name(arm).label} (n={n_text})')
            ax.set_xlabel('training epoch')
            ax.set_ylabel(textwrap.fill(label_of(key), 42), fontsize=7)
            ax.set_title(f'{pooling}', fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle('Learning curves: mean ± std over seeds')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------
def record_dir(fig_dir: str) -> str:
    """The record folder as a command names it: relative to the
    repository when inside it."""
    relative = osp.relpath(fig_dir, REPO)
    return fig_dir if relative.startswith('..') else relative


def runs_json_rows(rows: List[dict]) -> List[dict]:
    """The rows as stored: checkpoint paths relative to the out dir."""
    out = []
    for row in rows:
        row = dict(row)
        if osp.isabs(row.get('checkpoint', '')):
            raise ValueError(f'absolute checkpoint path in a row: '
                             f'{row["checkpoint"]}')
        out.append(row)
    return out


def write_study_report(out_dir: str, report: Optional[str] = None,
                       command: str = '') -> str:
    """Write the markdown report, its figures and ``runs.json``.

    Args:
        out_dir: The study's directory.
        report: Markdown path (default ``<out-dir>/report/study.md``); the
            figures and ``runs.json`` go next to it, in ``study/``.
        command: The command line the report names.

    Returns:
        The report path.
    """
    from .driver import (is_finished, load_evaluations, progress_text,
                         run_statuses, unfinished_text)
    study = load_study(out_dir)
    progress = run_statuses(out_dir, study)
    report = osp.abspath(report or osp.join(out_dir, 'report', 'study.md'))
    fig_dir = osp.join(osp.dirname(report), 'study')
    os.makedirs(fig_dir, exist_ok=True)
    rows = load_evaluations(out_dir, study)
    write_json_atomic(osp.join(fig_dir, 'runs.json'), runs_json_rows(rows))
    done_epochs = [e for e in study.eval_epochs
                   if values_by_seed(rows, BASELINE, e, 'cls/linear_top1')]
    final = done_epochs[-1] if done_epochs else study.epochs
    rel = lambda p: osp.relpath(p, osp.dirname(report))  # noqa: E731
    figures = {
        'diff': plot_paired_differences(
            rows, study, final, osp.join(fig_dir, 'paired_differences.png')),
        'acc': plot_curves(rows, study, accuracy_keys(study),
                           osp.join(fig_dir, 'learning_curves.png'),
                           metric_label),
    }
    # Without the pooling prefix: 'repr/erank_cov', ...
    ranks = [k.split('/', 1)[1] for k in rank_keys(rows, 'cls')]
    if ranks:
        figures['rank'] = plot_curves(
            rows, study, ranks, osp.join(fig_dir, 'rank_curves.png'),
            kernel_label)
    lines = [
        '# MAE vs M-MAE with controls on Fashion-MNIST: the long study', '',
        f'Generated by `{command}` on {datetime.date.today().isoformat()} '
        f'from {len(rows)} evaluations (`study/runs.json`).', '',
        *([] if all(map(is_finished, progress)) else [
            f'**The study is not finished**: {progress_text(progress)}. '
            f'Not finished: {unfinished_text(progress)}. Every number says '
            'over how many seeds it is taken (n); with n = 1 a difference '
            'is an observation, not an effect.', '']),
        '## Setup', '',
        f'* Every trained arm: the first {study.images:,} training images, '
        f'{study.epochs} epochs, batch 256, the 4-layer 128-wide ViT with '
        '4 x 4 patches of `configs/fashion_mnist/`; seeds '
        f'{", ".join(map(str, study.seeds))}.',
        '* Arms: ' + '; '.join(arm_by_name(a).label for a in study.arms) +
        '. Random init: the architecture\'s own initialisation under the '
        'seed, no training. Supervised: `configs/fashion_mnist/'
        'supervised_fmnist.py` (labels, same images, epochs and batch).',
        f'* Across machines: `{command} --restore {record_dir(fig_dir)}` '
        'takes the study up on a fresh machine from its record, this '
        'page\'s `study/runs.json` (every finished evaluation) and '
        '`study/state/` (the newest checkpoint of each unfinished run, '
        'kept by `--save-state`); a resumed run trains what an '
        'uninterrupted one trains.',
        '* Evaluation of each kept checkpoint (epochs '
        f'{", ".join(map(str, study.eval_epochs))}) on frozen features, '
        'CLS token and CLS + mean patch token (the plugin\'s `cls+mean` '
        f'pooling): weighted kNN (k = 20, T = 0.07, float64 similarities), '
        'a linear probe (standardised, l2-regularised logistic regression, '
        f'weight decay {study.weight_decay:g}, L-BFGS) on all training '
        'features, and low-shot probes on '
        f'{" and ".join(map(str, study.shots))} labels per class (a fixed '
        'subset per seed, the same for every arm); '
        f'{"all" if study.bank_images is None else study.bank_images} '
        'training and '
        f'{"all" if study.test_images is None else study.test_images} test '
        'images.',
        '* Δ: arm − MAE paired by seed over the seeds both have, mean with '
        'a two-sided 95 % Student-t interval; "n=1, no interval" when only '
        'one seed is paired.', '',
    ]
    lines += [f'## Summary in plain words (epoch {final})', '',
              *summary_lines(rows, study, final), '']
    for pooling in POOLINGS:
        lines += [f'## Results at epoch {final}, {pooling} features', '',
                  *results_table(rows, study, pooling, final), '']
    lines += [f'![paired differences]({rel(figures["diff"])})', '',
              '## Learning curves', '']
    for pooling in POOLINGS:
        lines += [f'### linear probe top-1, {pooling}', '',
                  *curve_table(rows, study, pooling, 'linear_top1'), '']
    lines += [f'![learning curves]({rel(figures["acc"])})', '']
    if 'rank' in figures:
        lines += ['## Effective rank over training (CLS, test features)', '',
                  f'### at epoch {final}, paired with MAE', '',
                  *results_table(rows, study, 'cls', final, ranks,
                                 stat_name), '']
        for key in ranks:
            lines += [f'### {kernel_label(key)}', '',
                      *curve_table(rows, study, 'cls', key), '']
        lines += [f'![rank curves]({rel(figures["rank"])})', '']
    with open(report, 'w') as f:
        f.write('\n'.join(lines))
    return report
