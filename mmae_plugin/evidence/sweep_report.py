"""The sweep's report: tables, paired intervals, plain-words summary, plots.

Used by :mod:`mmae_plugin.evidence.sweep` (``run_evidence.py``); reads the
per-run ``results.json`` rows only, so a finished sweep can be re-analysed
with ``run_evidence.py --report-only``, and once its runs are gone, from
the ``runs.json`` the report wrote (rows of older versions read in the
current key vocabulary). Every difference to MAE is paired by
seed with the interval of :mod:`mmae_plugin.evidence.intervals` (one seed:
"n=1, no interval").
"""
import datetime
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional

import numpy as np

from .intervals import PairedInterval, mean_std, paired_interval
from .sweep import (METHOD_NAMES, METRICS, PUBLISHED_LAMBDA, ZOO_CELLS,
                    Budget, Cell, probe_check_result, run_dir_of)

#: The effective-rank statistic of the tables and the scatter plot
#: (the uncentred Gram kernel of the unit features, the paper's erank) and
#: RankMe: keys of mmae_plugin.evaluation.statistics.
ERANK_KEY = 'repr/erank_gram'
RANKME_KEY = 'repr/rankme_raw'
ERANK_AXIS = ('erank_gram of the test features (uncentred Gram kernel of '
              'the l2-normalised CLS features)')
#: Keys of rows written before the statistics named their kernel (issue
#: 16), and the key each was renamed to; the definitions are the same
#: (entropy and effective rank of the unit features' Gram kernel, RankMe of
#: the raw features, the reference-form coding rate with mu 1).
LEGACY_KEYS = {'repr/entropy': 'repr/entropy_gram',
               'repr/erank': ERANK_KEY, 'repr/rankme': RANKME_KEY,
               'repr/tcr': 'repr/tcr_reference_mu1'}
#: The full probe config's top-1 on the runs it was trained on.
PROBE_CHECK_KEY = 'probe_config/top1'

METRIC_NAMES = {'knn/top1': 'kNN top-1', 'linear/top1': 'linear top-1'}
# Published numbers (ImageNet-1K, 200-epoch pretraining), for orientation only.
PAPER_TABLE = [
    ('ViT-B', 'linear probe', 55.4, 58.5, 62.4),
    ('ViT-B', 'fine-tune', 82.9, 83.0, 83.1),
    ('ViT-L', 'linear probe', 62.2, 65.8, 66.0),
    ('ViT-L', 'fine-tune', 83.3, 83.2, 84.3),
]
PAPER_MU = [(0.1, 58.61), (0.5, 59.38), (0.75, 59.87), (1, 62.40),
            (1.25, 59.54), (1.5, 57.76), (3, 50.46)]


def by_seed(rows: List[dict], cell: Cell, key: str) -> Dict[int, float]:
    return {row['seed']: row[key] for row in rows
            if row['cell'] == cell.name and key in row}


def paired_difference(rows: List[dict], cell: Cell,
                      key: str) -> Optional[PairedInterval]:
    """Mean difference to MAE over common seeds, with its 95 % t-interval."""
    return paired_interval(by_seed(rows, cell, key),
                           by_seed(rows, Cell('mae'), key))


def verdict(diff: Optional[PairedInterval]) -> str:
    return 'n/a' if diff is None else diff.verdict()


def fmt(mean: float, std: float) -> str:
    if math.isnan(mean):
        return '–'
    return f'{mean:.2f} ± {std:.2f}' if not math.isnan(std) else f'{mean:.2f}'


def fmt_diff(diff: Optional[PairedInterval]) -> str:
    return 'n/a' if diff is None else diff.text()


def cell_table(rows: List[dict], cells: List[Cell]) -> List[str]:
    lines = ['| cell | seeds | kNN top-1 (%) | Δ kNN vs MAE [95 % CI] | '
             'linear top-1 (%) | Δ linear vs MAE [95 % CI] | '
             f'{ERANK_KEY[5:]} (uncentred Gram) | {RANKME_KEY[5:]} |',
             '|---|---|---|---|---|---|---|---|']
    for cell in cells:
        knn = list(by_seed(rows, cell, 'knn/top1').values())
        if not knn:
            lines.append(f'| {cell.label} | 0 | – | – | – | – | – | – |')
            continue
        lin = list(by_seed(rows, cell, 'linear/top1').values())
        erank = list(by_seed(rows, cell, ERANK_KEY).values())
        rme = list(by_seed(rows, cell, RANKME_KEY).values())
        diffs = [paired_difference(rows, cell, k) if cell.method != 'mae'
                 else None for k in METRICS]
        lines.append(
            f'| {cell.label} | {len(knn)} | {fmt(*mean_std(knn))} | '
            f'{fmt_diff(diffs[0]) if cell.method != "mae" else "–"} | '
            f'{fmt(*mean_std(lin))} | '
            f'{fmt_diff(diffs[1]) if cell.method != "mae" else "–"} | '
            f'{fmt(*mean_std(erank))} | {fmt(*mean_std(rme))} |')
    return lines


def summary(rows: List[dict], cells: List[Cell]) -> List[str]:
    lines = []
    others = [c for c in cells if c.method != 'mae']
    for key, name in METRIC_NAMES.items():
        groups = {'better': [], 'worse': [], 'no sig. difference': [],
                  'n/a': []}
        for cell in others:
            diff = paired_difference(rows, cell, key)
            groups[verdict(diff)].append(
                f'{cell.label} ({fmt_diff(diff)})' if diff else cell.label)
        text = f'* **{name}**: '
        if groups['better']:
            text += ('significantly better than MAE at 95 %: ' +
                     '; '.join(groups['better']) + '. ')
        else:
            text += 'no cell is significantly better than MAE. '
        if groups['worse']:
            text += ('Significantly worse: ' + '; '.join(groups['worse']) +
                     '. ')
        text += (f'{len(groups["no sig. difference"])} of {len(others)} '
                 'cells are not distinguishable from MAE.')
        lines.append(text)
    lines.append(
        f'* With {len(others)} comparisons per metric at 95 % each, about '
        f'{0.05 * len(others):.1f} "significant" cells are expected by '
        'chance alone; a lone significant cell with an interval that nearly '
        'touches 0 is weak evidence.')
    return lines


def sweep_table(rows, cells, title, vary) -> List[str]:
    lines = [f'| {title} | ' + ' | '.join(
        f'{METRIC_NAMES[k]}' for k in METRICS) + ' |',
        '|---|' + '---|' * len(METRICS)]
    for cell in cells:
        values = [list(by_seed(rows, cell, k).values()) for k in METRICS]
        if not values[0]:
            continue
        lines.append(f'| {vary(cell)} | ' + ' | '.join(
            fmt(*mean_std(v)) for v in values) + ' |')
    return lines


def plot_sweeps(rows, cells, plot_dir) -> Dict[str, str]:
    """The λ and μ sweeps as paired differences to MAE; accuracy vs erank.

    Each point is a cell's mean paired difference to MAE with its 95 %
    t-interval (none for one seed), n in the legend; the scatter of every
    run against the effective rank names its kernel and draws MAE with
    open markers on top, so cells at the same rank do not hide it.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    paths = {}

    def series(ax, chosen, x_of, key, label, marker, shift):
        pts = []
        for cell in chosen:
            diff = paired_difference(rows, cell, key)
            if diff is not None:
                pts.append((x_of(cell) * shift, diff))
        if not pts:
            return
        pts.sort(key=lambda p: p[0])
        xs = [x for x, _ in pts]
        ys = [d.mean for _, d in pts]
        err = [[0 if not d.has_interval else d.mean - d.low for _, d in pts],
               [0 if not d.has_interval else d.high - d.mean for _, d in pts]]
        ns = sorted({d.n for _, d in pts})
        n_text = '/'.join(map(str, ns)) + (', no interval' if ns == [1]
                                           else ', 95 % CI')
        ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=3,
                    label=f'{label} (n={n_text})')

    lam_cells = {m: [c for c in cells if c.method == m and (
        c.mu in (None, 1.0))] for m in ('umae', 'mmae')}
    mu_cells = [c for c in cells if c.method == 'mmae' and c.lam == 0.01]
    for name, groups, x_of, xlabel in [
            ('accuracy_vs_lambda',
             [(lam_cells['umae'], 'U-MAE', 'o', 0.95),
              (lam_cells['mmae'], 'M-MAE (μ=1)', 's', 1.05)],
             lambda c: c.lam, 'λ (regulariser weight)'),
            ('accuracy_vs_mu', [(mu_cells, 'M-MAE (λ=0.01)', 's', 1.0)],
             lambda c: c.mu, 'μ (coding-rate parameter)')]:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key in zip(axes, METRICS):
            ax.axhline(0, color='k', lw=1, label='MAE (difference 0)')
            for chosen, label, marker, shift in groups:
                series(ax, chosen, x_of, key, label, marker, shift)
            ax.set_xscale('log')
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f'Δ {METRIC_NAMES[key]} vs MAE (points)')
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        fig.suptitle('Fashion-MNIST: cell − MAE paired by seed, mean and '
                     '95 % t-interval')
        fig.tight_layout()
        paths[name] = osp.join(plot_dir, f'{name}.png')
        fig.savefig(paths[name], dpi=110)
        plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    # MAE last and hollow, so M-MAE / U-MAE at the same rank cannot hide it.
    styles = (('umae', '^', 36, 'full'), ('mmae', 's', 36, 'full'),
              ('mae', 'o', 90, 'none'))
    for ax, key in zip(axes, METRICS):
        for method, marker, size, fill in styles:
            pts = [(r[ERANK_KEY], r[key]) for r in rows
                   if r['cell'].split('_')[0] == method and ERANK_KEY in r]
            if pts:
                kwargs = dict(facecolors='none', edgecolors='k',
                              linewidths=1.5) if fill == 'none' else \
                    dict(alpha=0.7)
                ax.scatter(*zip(*pts), marker=marker, s=size,
                           label=f'{METHOD_NAMES[method]} (n={len(pts)} '
                           'runs)', **kwargs)
        ax.set_xlabel(ERANK_AXIS, fontsize=8)
        ax.set_ylabel(f'{METRIC_NAMES[key]} (%)')
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle('Every run: accuracy against effective rank')
    fig.tight_layout()
    paths['accuracy_vs_erank'] = osp.join(plot_dir, 'accuracy_vs_erank.png')
    fig.savefig(paths['accuracy_vs_erank'], dpi=110)
    plt.close(fig)
    return paths


def correlation(rows, key) -> Optional[float]:
    if len(rows) < 3:
        return None
    rows = [r for r in rows if ERANK_KEY in r]
    if len(rows) < 3:
        return None
    x = np.array([r[ERANK_KEY] for r in rows])
    y = np.array([r[key] for r in rows])
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def attach_probe_checks(rows: List[dict], budget: Budget,
                        out_dir: str) -> List[dict]:
    """Rows with the full probe config's top-1 (:data:`PROBE_CHECK_KEY`)
    on the runs it was trained on, read from their run directories; rows
    that already carry it (rebuilt from ``runs.json``) keep theirs."""
    fixed = []
    for row in rows:
        row = dict(row)
        cell = next((c for c in ZOO_CELLS.values()
                     if c.name == row.get('cell')), None)
        if cell is not None and row.get('seed') == budget.seeds[0]:
            top1 = probe_check_result(run_dir_of(out_dir, cell, row['seed']))
            if top1 is not None:
                row[PROBE_CHECK_KEY] = top1
        fixed.append(row)
    return fixed


def probe_check_lines(rows, budget: Budget) -> List[str]:
    lines = ['| encoder (seed %d) | cached-feature probe top-1 | full probe '
             'config top-1 |' % budget.seeds[0], '|---|---|---|']
    for cell in (ZOO_CELLS['mae'], ZOO_CELLS['mmae']):
        full = by_seed(rows, cell, PROBE_CHECK_KEY).get(budget.seeds[0])
        cached = by_seed(rows, cell, 'linear/top1').get(budget.seeds[0])
        lines.append(
            f'| {cell.label} | {"–" if cached is None else f"{cached:.2f}"} '
            f'| {"not run" if full is None else f"{full:.2f}"} |')
    return lines


def grid_text(cells: List[Cell]) -> str:
    def values(method, attr, **fixed):
        found = sorted({getattr(c, attr) for c in cells if c.method == method
                        and all(getattr(c, k) == v for k, v in fixed.items())})
        return '{' + ', '.join(f'{v:g}' for v in found) + '}'
    text = (f'U-MAE at λ ∈ {values("umae", "lam")}; M-MAE (μ = 1) at λ ∈ '
            f'{values("mmae", "lam", mu=1.0)}; M-MAE (λ = 0.01) at μ ∈ '
            f'{values("mmae", "mu", lam=0.01)} (the analogue of the paper\'s '
            'Table 2).')
    if any(c.lam == PUBLISHED_LAMBDA for c in cells):
        text += (f' λ = {PUBLISHED_LAMBDA:g} = 0.01 / 8 is the effective '
                 'weight of the published 8-GPU runs.')
    return text


def upgrade_rows(rows: List[dict], out_dir: str) -> List[dict]:
    """Rows in the current vocabulary: :data:`LEGACY_KEYS` renamed and
    checkpoint paths relative to ``out_dir`` (older versions stored
    absolute paths)."""
    fixed = []
    for row in rows:
        row = {LEGACY_KEYS.get(key, key): value for key, value in row.items()}
        if osp.isabs(row.get('checkpoint', '')):
            row['checkpoint'] = osp.relpath(row['checkpoint'], out_dir)
        fixed.append(row)
    return fixed


def report_data_dir(report: str) -> str:
    """Where a report's plots and ``runs.json`` live: ``results/`` next to
    it."""
    return osp.join(osp.dirname(osp.abspath(report)), 'results')


def saved_rows(report: str) -> List[dict]:
    """The rows a written report was computed from (its ``runs.json``), as
    stored (:func:`write_report` upgrades them); empty if it has none."""
    path = osp.join(report_data_dir(report), 'runs.json')
    if not osp.isfile(path):
        return []
    with open(path) as f:
        return json.load(f)


def write_report(rows: List[dict], cells: List[Cell], budget: Budget,
                 out_dir: str, report: str, command: str) -> None:
    """Write the markdown report, its plots and the raw rows as JSON."""
    rows = attach_probe_checks(upgrade_rows(rows, out_dir), budget, out_dir)
    plot_dir = report_data_dir(report)
    plots = plot_sweeps(rows, cells, plot_dir)
    with open(osp.join(plot_dir, 'runs.json'), 'w') as f:
        json.dump(rows, f, indent=1)
    seconds = [r['pretrain_s'] + r['eval_s'] for r in rows]
    lam_cells = [c for c in cells if c.method != 'mae' and c.mu in (None, 1.0)]
    mu_cells = sorted((c for c in cells if c.method == 'mmae' and
                       c.lam == 0.01), key=lambda c: c.mu)
    rel = lambda p: osp.relpath(p, osp.dirname(osp.abspath(report)))  # noqa
    bank = 'all 60,000' if budget.bank_images is None else \
        f'the first {budget.bank_images:,}'
    test = 'all 10,000' if budget.test_images is None else \
        f'the first {budget.test_images:,}'
    lines = [
        '# What the regulariser buys: MAE vs U-MAE vs M-MAE on Fashion-MNIST',
        '',
        f'Generated by `{command}` on '
        f'{datetime.date.today().isoformat()} from {len(rows)} runs '
        f'(median {np.median(seconds) if seconds else 0:.0f} s per run, '
        'pretraining and evaluation, 2 runs in parallel on 2 CPU cores). '
        'Every number below is computed from `results/runs.json`; '
        '`--report-only` rebuilds this page from it.',
        '',
        '## Summary in plain words',
        '',
        *summary(rows, cells),
        '',
        '## Setup',
        '',
        f'* **Budget per run (equal for every cell):** pretraining on the '
        f'first {budget.images:,} training images for {budget.epochs} epochs '
        f'(batch 256, {budget.images // 256 * budget.epochs} iterations), '
        'the 4-layer, 128-wide ViT with 4 x 4 patches of '
        '`configs/fashion_mnist/` (AdamW, lr 1.5e-3, cosine), seeds '
        f'{", ".join(map(str, budget.seeds))} (a seed fixes the '
        'initialisation, the masks and the flips).',
        f'* **Grid:** {grid_text(cells)} TCR in the reference-code form '
        'logdet(I + μ/d zn^T zn) on the CLS token of the masked pass, exact '
        'global gather (`gather=\'global\'`).',
        f'* **kNN:** `configs/fashion_mnist/knn_fmnist.py` (k = 20, cosine, '
        f'weights exp(cos / 0.07)); neighbours: {bank} training images; '
        f'classified: {test} test images. Frozen CLS token after the '
        'encoder\'s final LayerNorm, unmasked.',
        '* **Linear probe:** the same frozen features, cached; standardised '
        'with the training mean and variance (the affine-free BatchNorm of '
        'the probe config) and fitted by l2-regularised logistic regression '
        '(weight decay 1e-4, L-BFGS to convergence) on the same '
        'neighbour images; no augmentation. Checked against the full '
        'probe config below.',
        f'* **Statistics:** `{ERANK_KEY[5:]}` = exp(matrix entropy of the '
        'uncentred Gram kernel zn^T zn / N of the l2-normalised test '
        f'features) and `{RANKME_KEY[5:]}` (RankMe of the raw test '
        'features), from `mmae_plugin.evaluation.statistics`.',
        '* **Differences** are paired by seed: Δ = cell − MAE for the same '
        'seed, mean with a two-sided 95 % Student-t interval over seeds. '
        '"Significant" means the interval excludes 0.',
        '',
        '## All cells',
        '',
        *cell_table(rows, cells),
        '',
        '## λ sweep (U-MAE, and M-MAE at μ = 1)',
        '',
        *sweep_table(rows, lam_cells, 'cell', lambda c: c.label),
        '',
        f'![accuracy vs lambda]({rel(plots["accuracy_vs_lambda"])})',
        '',
        '## μ sweep (M-MAE at λ = 0.01)',
        '',
        *sweep_table(rows, mu_cells, 'μ', lambda c: f'{c.mu:g}'),
        '',
        f'![accuracy vs mu]({rel(plots["accuracy_vs_mu"])})',
        '',
        f'## Accuracy against effective rank (`{ERANK_KEY[5:]}`)',
        '',
    ]
    for key, name in METRIC_NAMES.items():
        r = correlation(rows, key)
        lines.append(f'* Pearson correlation of {name} with '
                     f'`{ERANK_KEY[5:]}` (uncentred Gram kernel) over all '
                     'runs: '
                     f'{"n/a" if r is None else f"{r:+.2f}"}.')
    lines += [
        '',
        f'![accuracy vs effective rank]({rel(plots["accuracy_vs_erank"])})',
        '',
        '## The cached probe against the full probe config',
        '',
        f'`configs/fashion_mnist/linear_fmnist.py` (LARS, lr 20, '
        f'{budget.probe_check_epochs} epochs, random flips) trained on the '
        'same training images and encoder:',
        '',
        *probe_check_lines(rows, budget),
        '',
        '## The paper\'s numbers (ImageNet-1K, 200 epochs; not measured here)',
        '',
        'Reported by the M-MAE paper, for orientation only: a different '
        'data set, model size and budget. An outside reproduction of U-MAE '
        'on ImageNet-100 found 55.72 (MAE) vs 56.12 (U-MAE).',
        '',
        '| model | protocol | MAE | U-MAE | M-MAE |', '|---|---|---|---|---|',
        *[f'| {m} | {p} | {a} | {b} | {c} |' for m, p, a, b, c in
          PAPER_TABLE],
        '',
        'Paper Table 2 (ViT-B linear probe vs μ): ' + ', '.join(
            f'μ={mu:g}: {acc}' for mu, acc in PAPER_MU) + '.',
        '',
    ]
    os.makedirs(osp.dirname(osp.abspath(report)), exist_ok=True)
    with open(report, 'w') as f:
        f.write('\n'.join(lines))
