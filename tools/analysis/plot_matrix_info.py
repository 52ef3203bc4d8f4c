"""Draw MatrixInfoHook's logged quantities over training.

Example::

    python tools/analysis/plot_matrix_info.py \
        work_dirs/simclr_fmnist work_dirs/byol_fmnist \
        work_dirs/barlowtwins_fmnist --out-dir work_dirs/figures

reads every work dir's ``<timestamp>/vis_data/scalars.json`` (the newest run
with MatrixInfoHook values) and writes ``matrix_info.{png,pdf}`` (all panels)
plus one file per quantity, one curve per run. Without ``--keys`` it draws
every quantity the runs logged. MatrixInfoHook's keys name the matrix they
are computed on (``_cov``: the centred correlation kernel, ``_gram``: the
uncentred Gram kernel of the unit rows), and every axis label says which:

* two-branch runs (SimCLR, BYOL, Barlow Twins): ``mutual_info_<k>`` (the
  information-flow paper's figure 1), ``joint_entropy_<k>`` (figure 2),
  ``matrix_js_<k>`` (figure 3a), ``spectrum_js_<k>`` (figure 3b),
  ``entropy_1_<k>``, ``entropy_2_<k>``;
* one-branch runs (MAE, U-MAE, M-MAE): ``entropy_<k>``, ``erank_<k>``,
  ``rankme_raw`` (RankMe of the raw features),
  ``tcr_<form>[_centered]_mu<mu>``.

Keys of older logs (``erank``, ``tcr``...) are drawn too, labelled by name.
Every logged point is marked (up to 60 points per curve; a run with a single
point still shows it). Reference lines mark what the quantities cannot go
below or above:

* effective ranks and ``rankme_raw``: 1, complete collapse (all features
  along one direction); with ``--feature-dim d --batch-size B`` also
  ``min(B, d)``, a flat spectrum;
* ``tcr_reference_mu<mu>`` (``logdet(I + mu/d zn^T zn)`` on unit-norm rows,
  uncentred; ``mu`` read from the key), with ``--feature-dim`` and
  ``--batch-size``: the collapse floor ``log(1 + mu B / d)`` (rank one, the
  minimum over unit-norm batches: the trace is ``mu B / d`` whatever the
  features, and ``logdet`` is concave) and the flat-spectrum ceiling
  ``r log(1 + mu B / (d r))``, ``r = min(B, d)``.

It exits with status 1 and says why when there is nothing to draw.
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import re
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# Drawing order and axis labels of the quantities MatrixInfoHook logs, by
# base name (a logged key adds its kernel, order, form and mu).
QUANTITIES = {
    'mutual_info': 'Matrix mutual information (nats)',
    'joint_entropy': 'Matrix joint entropy (nats)',
    'matrix_js': 'Matrix JS divergence (nats)',
    'spectrum_js': 'Eigen-spectrum JS divergence (nats)',
    'entropy_1': 'Matrix entropy, branch 1 (nats)',
    'entropy_2': 'Matrix entropy, branch 2 (nats)',
    'entropy': 'Matrix entropy (nats)',
    'erank': 'Effective rank',
    'rankme': 'RankMe',
    'tcr': 'Total coding rate (nats)',
}
KERNEL_WORDS = {
    'cov': 'correlation kernel, centred',
    'gram': 'Gram of unit rows, uncentred'
}
KERNEL_KEY = re.compile(
    r'^(?P<base>mutual_info|joint_entropy|matrix_js|spectrum_js|entropy_1|'
    r'entropy_2|entropy|erank)_(?P<kernel>cov|gram)'
    r'(?:_alpha(?P<alpha>[0-9.e+-]+))?$')
TCR_KEY = re.compile(
    r'^tcr_(?P<form>reference|paper)(?P<centered>_centered)?_mu'
    r'(?P<mu>[0-9.e+-]+)$')
# The information-flow paper's figures (covariance kernel, von Neumann)
# keep their names; others are `minfo_<key>`.
FIGURE_NAMES = {
    'mutual_info_cov': 'figure1_mutual_info',
    'joint_entropy_cov': 'figure2_joint_entropy',
    'matrix_js_cov': 'figure3a_matrix_js',
    'spectrum_js_cov': 'figure3b_spectrum_js',
}

Series = Dict[str, Tuple[List[int], List[float]]]
# Curves with more logged points than this are drawn without markers.
MAX_MARKED_POINTS = 60
# (value, label, line style) per quantity.
References = Dict[str, List[Tuple[float, str, str]]]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Plot matrix information quantities logged by '
        'MatrixInfoHook (paper figures 1-3)')
    parser.add_argument(
        'work_dirs',
        nargs='+',
        help='work dirs of training runs (or their '
        'scalars.json files)')
    parser.add_argument(
        '--labels',
        nargs='+',
        help='legend label per work dir (default: '
        'the model type from the dumped config, else the folder name)')
    parser.add_argument(
        '--keys',
        nargs='+',
        default=None,
        help='logged quantities to draw, e.g. erank_cov rankme_raw '
        '(default: every one the runs logged)')
    parser.add_argument(
        '--prefix', default='minfo', help='scalar prefix of MatrixInfoHook')
    parser.add_argument(
        '--out-dir',
        default='work_dirs/matrix_info_figures',
        help='folder for the PNG and PDF files')
    parser.add_argument(
        '--smooth',
        type=int,
        default=1,
        help='moving-average window (in logged points)')
    parser.add_argument('--title', default=None, help='figure title')
    parser.add_argument(
        '--feature-dim',
        type=positive_int,
        default=None,
        metavar='D',
        help='feature dimension d the hook saw (the embedding width, e.g. '
        '128 for the Fashion-MNIST ViT): draws the full-rank and TCR lines')
    parser.add_argument(
        '--batch-size',
        type=positive_int,
        default=None,
        metavar='B',
        help='global batch B the hook sampled (all ranks): with '
        '--feature-dim, draws the full-rank and TCR lines')
    return parser.parse_args()


def base_name(key: str) -> str:
    """The quantity a logged key measures (``'erank'`` for ``erank_cov``);
    the key itself when it is not one of MatrixInfoHook's."""
    match = KERNEL_KEY.match(key)
    if match:
        return match['base']
    if TCR_KEY.match(key):
        return 'tcr'
    return 'rankme' if key == 'rankme_raw' else key


def axis_label(key: str) -> str:
    """Axis label naming the quantity and the matrix it is computed on."""
    match = KERNEL_KEY.match(key)
    if match:
        order = f', order {match["alpha"]}' if match['alpha'] else ''
        return (f'{QUANTITIES[match["base"]]}\n'
                f'({KERNEL_WORDS[match["kernel"]]}{order})')
    match = TCR_KEY.match(key)
    if match:
        centred = ', centred' if match['centered'] else ''
        return (f'{QUANTITIES["tcr"]}\n({match["form"]} form, '
                f'mu={match["mu"]}{centred})')
    if key == 'rankme_raw':
        return 'RankMe (raw features, uncentred)'
    return QUANTITIES.get(key, key)


def draw_order(key: str) -> tuple:
    """Sort key: MatrixInfoHook's quantities in QUANTITIES order first."""
    order = list(QUANTITIES)
    base = base_name(key)
    return (order.index(base) if base in order else len(order), key)


def lines_for_key(key: str, lines: References, feature_dim: Optional[int],
                  batch_size: Optional[int]) -> List[Tuple[float, str, str]]:
    """The reference lines of one logged key.

    Args:
        key: A logged quantity.
        lines: :func:`reference_lines` at mu 1 (ranks' bounds).
        feature_dim: Feature dimension d, or None.
        batch_size: Batch B, or None.

    Returns:
        ``[(value, label, linestyle), ...]``.
    """
    base = base_name(key)
    if base in ('erank', 'rankme'):
        return lines.get(base, [])
    match = TCR_KEY.match(key)
    if match and match['form'] == 'reference' and not match['centered']:
        return reference_lines(feature_dim, batch_size,
                               float(match['mu'])).get('tcr', [])
    return []


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not allowed: expected an integer >= 1')
    return value


def reference_lines(feature_dim: Optional[int],
                    batch_size: Optional[int],
                    mu: float = 1.0) -> References:
    """Bounds of erank, RankMe and TCR, as horizontal reference lines.

    Args:
        feature_dim: Feature dimension d, or None if unknown.
        batch_size: Number of features B per sample, or None if unknown.
        mu: ``mu`` of TCR's reference form ``logdet(I + mu/d zn^T zn)``.

    Returns:
        ``{quantity: [(value, label, linestyle), ...]}``; only the bounds
        that need no unknown size when d or B is missing.
    """
    lines: References = {
        'erank': [(1.0, 'collapse: 1', ':')],
        'rankme': [(1.0, 'collapse: 1', ':')],
    }
    if feature_dim is None or batch_size is None:
        return lines
    d, b = feature_dim, batch_size
    rank = min(b, d)
    for key in ('erank', 'rankme'):
        lines[key].append(
            (float(rank), f'flat spectrum: min(B, d) = {rank}', '--'))
    trace = mu * b / d
    mu_text = '' if mu == 1 else f'{mu:g}'
    lines['tcr'] = [
        (math.log1p(trace), f'collapse floor: log(1 + {mu_text}B/d) = '
         f'{math.log1p(trace):.3f}', ':'),
        (rank * math.log1p(trace / rank),
         f'flat spectrum: r log(1 + {mu_text}B/(d r)) = '
         f'{rank * math.log1p(trace / rank):.3f}', '--'),
    ]
    return lines


def find_scalars(work_dir: str, prefix: str) -> str:
    """Newest ``scalars.json`` of a work dir holding ``prefix`` scalars.

    Args:
        work_dir: A work dir, a timestamp folder or a scalars.json path.
        prefix: Scalar prefix written by the hook.

    Returns:
        Path of the scalars file.
    """
    if osp.isfile(work_dir):
        return work_dir
    candidates = sorted(
        glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')) +
        glob.glob(osp.join(work_dir, 'vis_data', 'scalars.json')),
        reverse=True)
    for path in candidates:
        with open(path) as handle:
            if f'"{prefix}/' in handle.read():
                return path
    raise FileNotFoundError(
        f'no vis_data/scalars.json with {prefix}/... scalars under '
        f'{work_dir!r}; was MatrixInfoHook in custom_hooks?')


def read_series(path: str, prefix: str) -> Series:
    """``{quantity: (steps, values)}`` from a scalars.json file."""
    series: Series = {}
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            for key, value in row.items():
                if key.startswith(f'{prefix}/'):
                    steps, values = series.setdefault(key[len(prefix) + 1:],
                                                      ([], []))
                    steps.append(int(row['step']))
                    values.append(float(value))
    return series


def method_label(work_dir: str) -> str:
    """Model type from the config mmengine dumps into the work dir."""
    root = work_dir if osp.isdir(work_dir) else osp.dirname(
        osp.dirname(osp.dirname(work_dir)))
    for config in sorted(glob.glob(osp.join(root, '*.py'))):
        try:
            from mmengine.config import Config
            return str(Config.fromfile(config).model['type'])
        except Exception:  # a foreign .py file: fall back to the name
            continue
    return osp.basename(osp.normpath(root))


def moving_average(values: List[float], window: int) -> List[float]:
    """Trailing moving average (window 1 returns the values)."""
    if window <= 1:
        return values
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def draw(ax,
         runs: List[Tuple[str, Series]],
         key: str,
         smooth: int,
         references: Optional[References] = None) -> None:
    """One panel: ``key`` over training, one curve per method.

    Args:
        ax: Matplotlib axes.
        runs: ``(label, series)`` per method.
        key: The quantity.
        smooth: Moving-average window.
        references: Horizontal reference lines per quantity.
    """
    for label, series in runs:
        if key not in series:
            continue
        steps, values = series[key]
        marker = 'o' if len(steps) <= MAX_MARKED_POINTS else None
        ax.plot(
            steps,
            moving_average(values, smooth),
            label=label,
            marker=marker,
            markersize=4)
    for value, label, style in (references or {}).get(key, []):
        ax.axhline(
            value, color='grey', linestyle=style, linewidth=1, label=label)
    ax.set_xlabel('Training iteration')
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(axis_label(key))
    ax.grid(alpha=0.3)
    ax.legend()


def save(fig, out_dir: str, name: str) -> List[str]:
    """Write ``name``.png and ``name``.pdf; return their paths."""
    paths = [osp.join(out_dir, f'{name}.{ext}') for ext in ('png', 'pdf')]
    for path in paths:
        fig.savefig(path, bbox_inches='tight', dpi=150)
    plt.close(fig)
    return paths


def plot(runs: List[Tuple[str, Series]],
         keys: List[str],
         out_dir: str,
         smooth: int = 1,
         title: Optional[str] = None,
         references: Optional[References] = None) -> List[str]:
    """Draw the combined figure and one figure per quantity.

    Args:
        runs: ``(label, series)`` per method.
        keys: Quantities to draw.
        out_dir: Output folder (created).
        smooth: Moving-average window.
        title: Optional title of the combined figure.
        references: Reference lines (:func:`reference_lines`).

    Returns:
        Paths of the written files.
    """
    os.makedirs(out_dir, exist_ok=True)
    columns = min(2, len(keys))
    rows = (len(keys) + columns - 1) // columns
    fig, axes = plt.subplots(
        rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        draw(ax, runs, key, smooth, references)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    written = save(fig, out_dir, 'matrix_info')
    for key in keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax, runs, key, smooth, references)
        written += save(fig, out_dir, FIGURE_NAMES.get(key, f'minfo_{key}'))
    return written


def keys_to_draw(runs: List[Tuple[str, Series]],
                 requested: Optional[List[str]]) -> List[str]:
    """The quantities to draw: ``requested``, else every one logged.

    Args:
        runs: ``(label, series)`` per run.
        requested: ``--keys``, or None.

    Returns:
        Keys in drawing order, each logged by at least one run.

    Raises:
        SystemExit: none of them was logged (nothing to draw).
    """
    logged = {key for _, series in runs for key in series}
    wanted = requested if requested else sorted(logged, key=draw_order)
    keys = [key for key in wanted if key in logged]
    if not keys:
        raise SystemExit(f'plot_matrix_info: nothing to draw: no run logged '
                         f'{wanted}; the runs logged {sorted(logged)}')
    for key in wanted:
        if requested and key not in logged:
            print(f'warning: no run logged {key!r}; it is left out')
    return keys


def main() -> None:
    args = parse_args()
    if args.labels and len(args.labels) != len(args.work_dirs):
        raise ValueError(f'--labels needs one label per work dir: got '
                         f'{len(args.labels)} for {len(args.work_dirs)}')
    runs = []
    for index, work_dir in enumerate(args.work_dirs):
        try:
            path = find_scalars(work_dir, args.prefix)
        except FileNotFoundError as error:
            raise SystemExit(f'plot_matrix_info: {error}') from None
        label = args.labels[index] if args.labels else method_label(work_dir)
        runs.append((label, read_series(path, args.prefix)))
    keys = keys_to_draw(runs, args.keys)
    ranks = reference_lines(args.feature_dim, args.batch_size)
    references = {
        key: lines_for_key(key, ranks, args.feature_dim, args.batch_size)
        for key in keys
    }
    if any(base_name(key) == 'tcr' for key in keys) and \
            (args.feature_dim is None or args.batch_size is None):
        print('note: pass --feature-dim and --batch-size to draw the TCR '
              'collapse floor and the flat-spectrum lines')
    for path in plot(runs, keys, args.out_dir, args.smooth, args.title,
                     references):
        print(f'saved {path}')


if __name__ == '__main__':
    main()
