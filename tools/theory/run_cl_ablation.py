# Copyright (c) mmae-plugin contributors.
"""Which modelling choice makes CL leave or concentrate on the global area.

Trains the one-layer ViT of :mod:`mmae_plugin.theory` with InfoNCE under the
variants of :data:`studies.cl_ablation.CL_VARIANTS` (each changes
one choice of the lab's default CL setting: similarity, pooling, views,
temperature, data model) for every seed, and writes to ``--out-dir``:

* ``cl_ablation.json``: arguments, every variant's settings, histories and
  summary (init and final own-area attention of the global area and of the
  local areas, local-to-global mass, FP correlations; mean, std, min, max);
* ``cl_ablation_curves.{png,pdf}``: own-area attention over training, one
  panel per variant;
* ``cl_ablation_final.{png,pdf}``: final own-area attention per variant.

Example::

    python tools/theory/run_cl_ablation.py --out-dir work_dirs/cl_ablation
"""
import argparse
import json
import os
import os.path as osp
import sys
import textwrap
from typing import Dict, List

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from mmae_plugin.theory import ImbalanceSetting, TrainSetting  # noqa: E402

# The ablation is this repository's study (studies/), not the plugin's: run
# from a checkout, with its root importable wherever the script starts.
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from studies import cl_ablation  # noqa: E402

DEFAULT_VARIANTS = list(cl_ablation.CL_VARIANTS)


def parse_args() -> argparse.Namespace:
    """Parse command-line arguments."""
    parser = argparse.ArgumentParser(
        description='One-factor-at-a-time study of the lab\'s CL setting')
    parser.add_argument('--out-dir', default='work_dirs/theory_cl_ablation')
    parser.add_argument(
        '--variants',
        nargs='+',
        default=DEFAULT_VARIANTS,
        help=f'names from {DEFAULT_VARIANTS}')
    parser.add_argument(
        '--exponent',
        type=float,
        default=0.5,
        help='local-area exponent kappa')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--steps', type=int, default=800)
    parser.add_argument(
        '--lr',
        type=float,
        default=20.0,
        help='base step size (a variant may scale it)')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--mask-ratio', type=float, default=0.75)
    parser.add_argument('--eval-interval', type=int, default=50)
    parser.add_argument(
        '--threads', type=int, default=1, help='torch CPU threads')
    return parser.parse_args()


def base_settings(args: argparse.Namespace) -> tuple:
    """The lab's default data and CL settings at the chosen exponent."""
    data = ImbalanceSetting(local_exponent=args.exponent)
    train = TrainSetting(
        objective='cl',
        steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        mask_ratio=args.mask_ratio,
        eval_interval=args.eval_interval)
    return data, train


def run_all(args: argparse.Namespace) -> Dict[str, Dict]:
    """Train every variant for every seed; settings, histories, summary."""
    torch.set_num_threads(args.threads)
    # Subnormal attention probabilities are ~10x slower on CPUs.
    torch.set_flush_denormal(True)
    variants = cl_ablation.check_variant_names(args.variants)
    base_data, base_train = base_settings(args)
    results = {}
    for variant in variants:
        data_setting, train_setting = cl_ablation.variant_settings(
            variant, base_data, base_train)
        histories = cl_ablation.run_variant(variant, base_data, base_train,
                                            args.seeds)
        results[variant.name] = dict(
            description=variant.description,
            data_setting=vars(data_setting),
            train_setting=vars(train_setting),
            histories=histories,
            summary=cl_ablation.summarise_variant(histories))
        print_row(variant.name, results[variant.name]['summary'])
    return results


def print_row(name: str, summary: Dict) -> None:
    """One line: own-area attention init -> final (mean +/- std)."""
    cells = []
    for quantity in ('own_global', 'own_local', 'local_to_global'):
        init, final = summary[quantity]['init'], summary[quantity]['final']
        spread = '' if final['std'] is None else f" +/- {final['std']:.3f}"
        cells.append(f"{quantity} {init['mean']:.3f} -> "
                     f"{final['mean']:.3f}{spread}")
    print(f'{name:<14} ' + ' | '.join(cells), flush=True)


def band(histories: List[Dict], quantity: str) -> tuple:
    """Mean, min and max over seeds of a quantity's curve."""
    curves = torch.tensor(
        [cl_ablation.curve_values(h, quantity) for h in histories])
    return (curves.mean(0).tolist(), curves.min(0).values.tolist(),
            curves.max(0).values.tolist())


def plot_curves(results: Dict, args: argparse.Namespace) -> None:
    """Own-area attention over training, one panel per variant."""
    names = list(results)
    columns = min(4, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(3.4 * columns, 2.9 * rows),
        squeeze=False,
        sharey=True)
    seeds = len(args.seeds)
    for ax, name in zip(axes.flat, names):
        histories = results[name]['histories']
        steps = histories[0]['step']
        for quantity, label, style, color in (('own_global', 'global own-area',
                                               'o-', 'tab:red'),
                                              ('own_local', 'local own-area',
                                               's--', 'tab:orange'),
                                              ('local_to_global',
                                               'local -> global', '^:',
                                               'tab:purple')):
            mean, low, high = band(histories, quantity)
            ax.plot(
                steps,
                mean,
                style,
                color=color,
                markersize=3,
                markevery=max(1,
                              len(steps) // 8),
                label=f'{label} (n={seeds} seeds)')
            ax.fill_between(steps, low, high, color=color, alpha=0.15)
        ax.set_title(
            textwrap.fill(f"{name}: {results[name]['description']}", 48),
            fontsize=7)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(names):]:
        ax.axis('off')
    for ax in axes[-1]:
        ax.set_xlabel('GD step')
    for row in axes:
        row[0].set_ylabel('attention mass of masked queries')
    axes.flat[0].legend(fontsize=6, loc='upper right')
    fig.suptitle(
        f'CL variants at kappa={args.exponent} (mean over seeds '
        f'{args.seeds}, band = min..max)',
        fontsize=9)
    fig.tight_layout()
    save(fig, osp.join(args.out_dir, 'cl_ablation_curves'))


def plot_final(results: Dict, args: argparse.Namespace) -> None:
    """Final own-area attention of every variant, with init for reference."""
    names = list(results)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(names), 3.6))
    positions = list(range(len(names)))
    seeds = len(args.seeds)
    for quantity, marker, color, shift, label in (('own_global', 'o',
                                                   'tab:red', -0.12,
                                                   'global own-area'),
                                                  ('own_local', 's',
                                                   'tab:orange', 0.12,
                                                   'local own-area')):
        finals = [results[n]['summary'][quantity]['final'] for n in names]
        spreads = [f['std'] for f in finals]
        ax.errorbar([p + shift for p in positions],
                    [f['mean'] for f in finals],
                    yerr=None if None in spreads else spreads,
                    fmt=marker,
                    color=color,
                    capsize=3,
                    label=f'{label}, final (n={seeds} seeds)')
        init = results[names[0]]['summary'][quantity]['init']['mean']
        ax.axhline(init, color=color, ls=':', lw=0.8, label=f'{label}, init')
    ax.set_xticks(positions, names, rotation=30, ha='right', fontsize=8)
    ax.set_ylabel('own-area attention of masked queries')
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(
        f'CL after {args.steps} GD steps, kappa={args.exponent}', fontsize=9)
    fig.tight_layout()
    save(fig, osp.join(args.out_dir, 'cl_ablation_final'))


def save(fig: plt.Figure, stem: str) -> None:
    """Save a figure as PNG and PDF and close it."""
    fig.savefig(stem + '.png', dpi=150)
    fig.savefig(stem + '.pdf')
    plt.close(fig)


def main() -> None:
    """Run the variants and write JSON and figures."""
    args = parse_args()
    cl_ablation.check_variant_names(args.variants)
    os.makedirs(args.out_dir, exist_ok=True)
    results = run_all(args)
    with open(osp.join(args.out_dir, 'cl_ablation.json'), 'w') as f:
        json.dump(dict(args=vars(args), results=results), f, indent=1)
    plot_curves(results, args)
    plot_final(results, args)
    print(f'wrote {args.out_dir}')


if __name__ == '__main__':
    main()
