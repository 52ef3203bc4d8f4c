"""Draw the information-flow paper's figures 1-3 from MatrixInfoHook logs.

Example::

    python tools/analysis/plot_matrix_info.py \
        work_dirs/simclr_fmnist work_dirs/byol_fmnist \
        work_dirs/barlowtwins_fmnist --out-dir work_dirs/figures

reads every work dir's ``<timestamp>/vis_data/scalars.json`` (the newest run
with MatrixInfoHook values) and writes ``matrix_info.{png,pdf}`` (all four
panels) plus one file per quantity: ``mutual_info`` (figure 1),
``joint_entropy`` (figure 2), ``matrix_js`` (figure 3a) and ``spectrum_js``
(figure 3b), one curve per method.
"""
import argparse
import glob
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

QUANTITIES = {
    'mutual_info': 'Matrix mutual information (nats)',
    'joint_entropy': 'Matrix joint entropy (nats)',
    'matrix_js': 'Matrix JS divergence (nats)',
    'spectrum_js': 'Eigen-spectrum JS divergence (nats)',
}
FIGURE_NAMES = {
    'mutual_info': 'figure1_mutual_info',
    'joint_entropy': 'figure2_joint_entropy',
    'matrix_js': 'figure3a_matrix_js',
    'spectrum_js': 'figure3b_spectrum_js',
}

Series = Dict[str, Tuple[List[int], List[float]]]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Plot matrix information quantities logged by '
        'MatrixInfoHook (paper figures 1-3)')
    parser.add_argument(
        'work_dirs', nargs='+', help='work dirs of training runs (or their '
        'scalars.json files)')
    parser.add_argument(
        '--labels', nargs='+', help='legend label per work dir (default: '
        'the model type from the dumped config, else the folder name)')
    parser.add_argument(
        '--keys', nargs='+', default=list(QUANTITIES),
        choices=sorted(QUANTITIES), help='quantities to draw')
    parser.add_argument(
        '--prefix', default='minfo', help='scalar prefix of MatrixInfoHook')
    parser.add_argument(
        '--out-dir', default='work_dirs/matrix_info_figures',
        help='folder for the PNG and PDF files')
    parser.add_argument(
        '--smooth', type=int, default=1,
        help='moving-average window (in logged points)')
    parser.add_argument('--title', default=None, help='figure title')
    return parser.parse_args()


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
                    steps, values = series.setdefault(
                        key[len(prefix) + 1:], ([], []))
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


def draw(ax, runs: List[Tuple[str, Series]], key: str, smooth: int) -> None:
    """One panel: ``key`` over training, one curve per method."""
    for label, series in runs:
        if key not in series:
            continue
        steps, values = series[key]
        ax.plot(steps, moving_average(values, smooth), label=label)
    ax.set_xlabel('Training iteration')
    ax.set_ylabel(QUANTITIES[key])
    ax.grid(alpha=0.3)
    ax.legend()


def save(fig, out_dir: str, name: str) -> List[str]:
    """Write ``name``.png and ``name``.pdf; return their paths."""
    paths = [osp.join(out_dir, f'{name}.{ext}') for ext in ('png', 'pdf')]
    for path in paths:
        fig.savefig(path, bbox_inches='tight', dpi=150)
    plt.close(fig)
    return paths


def plot(runs: List[Tuple[str, Series]], keys: List[str], out_dir: str,
         smooth: int = 1, title: Optional[str] = None) -> List[str]:
    """Draw the combined figure and one figure per quantity.

    Args:
        runs: ``(label, series)`` per method.
        keys: Quantities to draw.
        out_dir: Output folder (created).
        smooth: Moving-average window.
        title: Optional title of the combined figure.

    Returns:
        Paths of the written files.
    """
    os.makedirs(out_dir, exist_ok=True)
    columns = min(2, len(keys))
    rows = (len(keys) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4 * rows),
                             squeeze=False)
    for ax, key in zip(axes.flat, keys):
        draw(ax, runs, key, smooth)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    written = save(fig, out_dir, 'matrix_info')
    for key in keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax, runs, key, smooth)
        written += save(fig, out_dir, FIGURE_NAMES[key])
    return written


def main() -> None:
    args = parse_args()
    if args.labels and len(args.labels) != len(args.work_dirs):
        raise ValueError(f'--labels needs one label per work dir: got '
                         f'{len(args.labels)} for {len(args.work_dirs)}')
    runs = []
    for index, work_dir in enumerate(args.work_dirs):
        series = read_series(find_scalars(work_dir, args.prefix),
                             args.prefix)
        missing = [k for k in args.keys if k not in series]
        if missing:
            print(f'warning: {work_dir} has no {missing} (one-branch model?)')
        label = args.labels[index] if args.labels else method_label(work_dir)
        runs.append((label, series))
    for path in plot(runs, args.keys, args.out_dir, args.smooth, args.title):
        print(f'saved {path}')


if __name__ == '__main__':
    main()
