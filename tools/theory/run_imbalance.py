# Copyright (c) mmae-plugin contributors.
"""Sweep the feature imbalance and compare MAE with contrastive learning.

Trains the zero-initialised one-layer softmax ViT of
:mod:`mmae_plugin.theory` with gradient descent on the MAE and on the InfoNCE
objective, for every local-area exponent and seed, and writes to
``--out-dir``:

* ``imbalance_results.json``: settings, full histories and a summary of
  own-area attention at init and at the end (global area and mean of the
  local areas), reconstruction error and feature coefficients;
* ``attention_curves.{png,pdf}``: own-area attention over training, one panel
  per exponent, MAE vs CL, global vs local areas;
* ``phase_diagram.{png,pdf}``: final own-area attention against the
  imbalance for both area types and both objectives.

Example::

    python tools/theory/run_imbalance.py --out-dir work_dirs/theory
"""
import argparse
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401
import torch  # noqa: E402
from mmengine.utils import ProgressBar  # noqa: E402,I001

# The framework-free mmae_plugin.theory before mmengine: imported after it,
# mmae_plugin would register every component, importing mmpretrain.models
# (and so mmcv-lite's MultiScaleDeformableAttention warning) for nothing.
from mmae_plugin.theory import FeatureImbalanceData  # noqa
from mmae_plugin.theory import (GLOBAL_AREA, ImbalanceSetting, TrainSetting,
                                own_area_attention_ceiling,
                                query_key_normalized_mutual_information, train)

OBJECTIVE_LABELS = {'mae': 'MAE', 'cl': 'CL (InfoNCE)'}
OBJECTIVE_COLORS = {'mae': 'tab:blue', 'cl': 'tab:red'}


def parse_args() -> argparse.Namespace:
    """Parse command-line arguments."""
    parser = argparse.ArgumentParser(
        description='MAE vs CL on one-layer ViTs under feature imbalance')
    parser.add_argument(
        '--out-dir',
        default='work_dirs/theory_imbalance',
        help='directory for the JSON and the figures')
    parser.add_argument(
        '--exponents',
        type=float,
        nargs='+',
        default=[0.2, 0.35, 0.5, 0.6, 0.65],
        help='local-area exponents kappa (local area size '
        '= round(P ** kappa)); smaller = more imbalanced')
    parser.add_argument(
        '--chosen-exponent',
        type=float,
        default=0.5,
        help='exponent at which the claim is checked')
    parser.add_argument(
        '--objectives',
        nargs='+',
        default=['mae', 'cl'],
        choices=['mae', 'cl'])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--num-patches', type=int, default=64)
    parser.add_argument('--num-local-areas', type=int, default=3)
    parser.add_argument('--feature-dim', type=int, default=16)
    parser.add_argument('--noise-std', type=float, default=0.0)
    parser.add_argument('--steps', type=int, default=1500)
    parser.add_argument('--lr', type=float, default=20.0)
    parser.add_argument(
        '--cl-lr',
        type=float,
        default=None,
        help='step size of the CL runs (default: --lr); '
        'InfoNCE gradients scale like 1 / temperature, so '
        'a larger --temperature may want a larger step')
    parser.add_argument(
        '--batch-size',
        type=int,
        default=32,
        help='CL uses batch-size - 1 negatives per anchor')
    parser.add_argument('--mask-ratio', type=float, default=0.75)
    parser.add_argument(
        '--temperature',
        type=float,
        default=0.1,
        help='InfoNCE temperature; 0.1 is the '
        'discriminative regime in which CL spreads '
        'attention over the areas, 10 (with --cl-lr 200) '
        'the near-linear regime in which it concentrates '
        'on the global area (docs/theory.md)')
    parser.add_argument('--eval-interval', type=int, default=50)
    parser.add_argument(
        '--threads', type=int, default=2, help='torch CPU threads')
    parser.add_argument(
        '--from-json',
        default=None,
        help='skip training: recompute summaries and '
        'figures from the histories of an earlier '
        'imbalance_results.json (its sweep arguments are '
        'used)')
    return parser.parse_args()


def local_mean(values: List[float]) -> float:
    """Mean over the local areas (all areas but the global one)."""
    local = [v for k, v in enumerate(values) if k != GLOBAL_AREA]
    return sum(local) / len(local)


def mean_std(values: List[float]) -> Dict[str, Optional[float]]:
    """Mean, (population) standard deviation and count of a list.

    One value has no spread: ``std`` is then None (null in the JSON), so
    that no table or error bar shows a 0 that was never measured.
    """
    mean = sum(values) / len(values)
    if len(values) == 1:
        return dict(mean=mean, std=None, n=1)
    var = sum((v - mean)**2 for v in values) / len(values)
    return dict(mean=mean, std=math.sqrt(var), n=len(values))


def format_stat(stats: Dict[str, Optional[float]]) -> str:
    """``mean +/- std`` over seeds, or the bare value of a single seed."""
    if stats.get('std') is None:
        return f"{stats['mean']:.3f}"
    return f"{stats['mean']:.3f} +/- {stats['std']:.3f}"


CLAIM_PARTS = (('mae_global_rises', 'MAE, global area'), ('mae_local_rises',
                                                          'MAE, local areas'),
               ('cl_global_rises', 'CL, global area'), ('cl_local_rises',
                                                        'CL, local areas'))


def format_claim(claim: Dict[str, object], exponent: float) -> List[str]:
    """The claim check as lines a reader can follow.

    Args:
        claim: :func:`check_claim`'s result.
        exponent: The local-area exponent it was checked at.

    Returns:
        Lines: the verdict, what rose and what did not, the criterion.
    """
    verdict = 'HOLDS' if claim['claim_holds'] else 'DOES NOT HOLD'
    lines = [
        f'claim at kappa={exponent} (MAE\'s own-area attention rises on '
        'the global and the local areas, CL\'s does not rise on the '
        f'local areas): {verdict}'
    ]
    for key, label in CLAIM_PARTS:
        lines.append(f"  {label + ':':<18} "
                     f"{'rises' if claim[key] else 'does not rise'}")
    lines.append(f"  criterion: {claim['criterion']}")
    return lines


def area_nmi(mass: List[List[float]]) -> float:
    """Query-key NMI of the area-level attention matrix.

    Rows (query areas) weighted equally: 0 when every area's masked patches
    attend the areas in the same proportions (query-independent, "collapsed"
    attention), high when each area attends its own.
    """
    return float(query_key_normalized_mutual_information(torch.tensor(mass)))


def summarise(histories: List[Dict]) -> Dict[str, Dict[str, float]]:
    """Init and final values over seeds for one (exponent, objective)."""
    rows = {
        'area_nmi_init':
        [area_nmi(h['area_attention_mass'][0]) for h in histories],
        'area_nmi_final':
        [area_nmi(h['area_attention_mass'][-1]) for h in histories],
        'own_global_init':
        [h['own_area_attention'][0][GLOBAL_AREA] for h in histories],
        'own_global_final':
        [h['own_area_attention'][-1][GLOBAL_AREA] for h in histories],
        'own_local_init':
        [local_mean(h['own_area_attention'][0]) for h in histories],
        'own_local_final':
        [local_mean(h['own_area_attention'][-1]) for h in histories],
        'feature_global_final':
        [h['feature_coefficient'][-1][GLOBAL_AREA] for h in histories],
        'feature_local_final':
        [local_mean(h['feature_coefficient'][-1]) for h in histories],
        'reconstruction_error_init':
        [h['reconstruction_error'][0] for h in histories],
        'reconstruction_error_final':
        [h['reconstruction_error'][-1] for h in histories],
        'train_loss_final': [h['train_loss'][-1] for h in histories],
    }
    return {key: mean_std(values) for key, values in rows.items()}


def closes_half_gap(init: float, final: float, ceiling: float) -> bool:
    """Whether attention rose by at least half of its headroom.

    The headroom is ``ceiling - init``, with ``ceiling`` the largest
    achievable expected own-area attention
    (:func:`mmae_plugin.theory.own_area_attention_ceiling`). This is the
    report's operational reading of "rises well above its value at
    initialisation"; the JSON keeps the raw numbers for other readings.
    """
    return final - init >= 0.5 * (ceiling - init)


def ceilings(setting: ImbalanceSetting, mask_ratio: float) -> Dict:
    """Own-area attention ceilings of the global and of a local area."""
    num_masked = min(
        round(setting.num_patches * mask_ratio), setting.num_patches - 1)
    visible = setting.num_patches - num_masked
    sizes = setting.area_sizes
    return dict(
        global_=own_area_attention_ceiling(sizes[GLOBAL_AREA],
                                           setting.num_patches, visible),
        local=own_area_attention_ceiling(sizes[1], setting.num_patches,
                                         visible))


def check_claim(summary: Dict[str, Dict],
                ceiling: Dict[str, float]) -> Dict[str, object]:
    """Evaluate the paper's claim on the summary at one exponent."""
    mae, cl = summary['mae'], summary['cl']

    def rises(stats: Dict, area: str) -> bool:
        top = ceiling['global_' if area == 'global' else 'local']
        return closes_half_gap(stats[f'own_{area}_init']['mean'],
                               stats[f'own_{area}_final']['mean'], top)

    result = dict(
        criterion='final - init >= 0.5 * (ceiling - init) (own-area '
        'attention, mean over seeds; local = mean over local areas)',
        mae_global_rises=rises(mae, 'global'),
        mae_local_rises=rises(mae, 'local'),
        cl_global_rises=rises(cl, 'global'),
        cl_local_rises=rises(cl, 'local'))
    result['claim_holds'] = bool(result['mae_global_rises']
                                 and result['mae_local_rises']
                                 and not result['cl_local_rises'])
    return result


def plot_curves(results: Dict, exponents: List[float], out_dir: str) -> None:
    """Own-area attention over training, one panel per exponent."""
    fig, axes = plt.subplots(
        1,
        len(exponents),
        figsize=(3.6 * len(exponents), 3.3),
        squeeze=False,
        sharey=True)
    for ax, exponent in zip(axes[0], exponents):
        entry = results[str(exponent)]
        for objective, histories in entry['histories'].items():
            steps = histories[0]['step']
            for area, style in (('global', '-'), ('local', '--')):
                curves = torch.tensor([[
                    row[GLOBAL_AREA] if area == 'global' else local_mean(row)
                    for row in h['own_area_attention']
                ] for h in histories])
                ax.plot(
                    steps,
                    curves.mean(0).tolist(),
                    style,
                    color=OBJECTIVE_COLORS[objective],
                    label=f'{OBJECTIVE_LABELS[objective]}, {area}')
        sizes = entry['area_sizes']
        ax.set_title(
            f'kappa={exponent}: global {sizes[0]}, '
            f'local {sizes[1]} patches',
            fontsize=9)
        ax.set_xlabel('GD step')
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('own-area attention of masked patches')
    axes[0][0].legend(fontsize=7, loc='center right')
    fig.tight_layout()
    save(fig, osp.join(out_dir, 'attention_curves'))


def plot_phase_diagram(results: Dict, exponents: List[float],
                       out_dir: str) -> None:
    """Final own-area attention against the imbalance ratio."""
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    ratios = [results[str(e)]['imbalance_ratio'] for e in exponents]
    objectives = list(results[str(exponents[0])]['summary'])
    for objective in objectives:
        for area, marker, style in (('global', 'o', '-'), ('local', 's',
                                                           '--')):
            stats = [
                results[str(e)]['summary'][objective][f'own_{area}_final']
                for e in exponents
            ]
            # No error bars where a single seed gives no spread.
            spreads = [s['std'] for s in stats]
            yerr = None if None in spreads else spreads
            ax.errorbar(
                ratios, [s['mean'] for s in stats],
                yerr=yerr,
                fmt=marker + style,
                color=OBJECTIVE_COLORS[objective],
                capsize=3,
                label=f'{OBJECTIVE_LABELS[objective]}, {area}')
    for area, style in (('global', ':'), ('local', '-.')):
        init = [
            results[str(e)]['summary'][objectives[0]][f'own_{area}_init']
            ['mean'] for e in exponents
        ]
        ax.plot(ratios, init, style, color='grey', label=f'init, {area}')
    ax.plot(
        ratios,
        [results[str(e)]['own_area_ceiling']['local_area'] for e in exponents],
        '-',
        color='black',
        lw=0.8,
        label='ceiling, local')
    ax.set_xscale('log')
    ax.set_xticks(ratios, [f'{r:.3g}' for r in ratios])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel('imbalance |global area| / |local area|')
    ax.set_ylabel('final own-area attention')
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, osp.join(out_dir, 'phase_diagram'))


def save(fig: plt.Figure, stem: str) -> None:
    """Save a figure as PNG and PDF and close it."""
    fig.savefig(stem + '.png', dpi=150)
    fig.savefig(stem + '.pdf')
    plt.close(fig)


def setting_for(args: argparse.Namespace, exponent: float) -> ImbalanceSetting:
    """Data setting of one sweep point."""
    return ImbalanceSetting(
        num_patches=args.num_patches,
        num_local_areas=args.num_local_areas,
        local_exponent=exponent,
        feature_dim=args.feature_dim,
        noise_std=args.noise_std)


def step_size(args: argparse.Namespace, objective: str) -> float:
    """The step size of one objective's runs (``--cl-lr`` for CL)."""
    cl_lr = getattr(args, 'cl_lr', None)  # absent in older JSON args
    if objective == 'cl' and cl_lr is not None:
        if cl_lr <= 0:
            raise ValueError(f'--cl-lr={cl_lr} is invalid: expected > 0.')
        return cl_lr
    return args.lr


def train_all(args: argparse.Namespace) -> Dict[str, Dict[str, List]]:
    """Train every (exponent, objective, seed); histories per exponent."""
    torch.set_num_threads(args.threads)
    # Attention probabilities underflow into subnormals, which are ~10x
    # slower on CPUs; flushing them to zero changes nothing measurable.
    torch.set_flush_denormal(True)
    runs = len(args.exponents) * len(args.objectives) * len(args.seeds)
    progress = ProgressBar(runs)
    histories: Dict[str, Dict[str, List]] = {}
    for exponent in args.exponents:
        setting = setting_for(args, exponent)
        histories[str(exponent)] = {}
        for objective in args.objectives:
            runs_of_objective = []
            for seed in args.seeds:
                data = FeatureImbalanceData(setting, seed=seed)
                runs_of_objective.append(
                    train(
                        data,
                        TrainSetting(
                            objective=objective,
                            steps=args.steps,
                            lr=step_size(args, objective),
                            batch_size=args.batch_size,
                            mask_ratio=args.mask_ratio,
                            temperature=args.temperature,
                            eval_interval=args.eval_interval,
                            seed=seed)))
                progress.update()
            histories[str(exponent)][objective] = runs_of_objective
    return histories


def analyse(args: argparse.Namespace,
            histories: Dict[str, Dict[str, List]]) -> Dict[str, Dict]:
    """Summaries, ceilings and the claim check for every exponent."""
    results: Dict[str, Dict] = {}
    for exponent in args.exponents:
        setting = setting_for(args, exponent)
        ceiling = ceilings(setting, args.mask_ratio)
        entry = dict(
            area_sizes=setting.area_sizes,
            imbalance_ratio=setting.imbalance_ratio,
            own_area_ceiling=dict(
                global_area=ceiling['global_'], local_area=ceiling['local']),
            histories=histories[str(exponent)],
            summary={})
        for objective, runs in entry['histories'].items():
            entry['summary'][objective] = summarise(runs)
        if {'mae', 'cl'} <= set(entry['histories']):
            entry['claim'] = check_claim(entry['summary'], ceiling)
        results[str(exponent)] = entry
    return results


def load_histories(path: str, args: argparse.Namespace) -> Dict:
    """Histories and sweep arguments of an earlier run's JSON.

    The sweep arguments of the file replace those of the command line
    (except ``--out-dir`` and ``--chosen-exponent``), so that summaries are
    recomputed for exactly the runs that produced the histories.
    """
    with open(path) as f:
        payload = json.load(f)
    for key, value in payload['args'].items():
        if key not in ('out_dir', 'chosen_exponent', 'from_json'):
            setattr(args, key, value)
    return {
        exponent: entry['histories']
        for exponent, entry in payload['results'].items()
    }


def main() -> None:
    """Run (or reload) the sweep and write results and figures."""
    args = parse_args()
    if args.from_json:
        histories = load_histories(args.from_json, args)
    if args.chosen_exponent not in args.exponents:
        raise ValueError(f'--chosen-exponent={args.chosen_exponent} is '
                         f'invalid: expected one of --exponents '
                         f'{args.exponents}.')
    step_size(args, 'cl')  # refuse a bad --cl-lr before any training
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.from_json:
        histories = train_all(args)
    results = analyse(args, histories)

    payload = dict(args=vars(args), results=results)
    if 'claim' in results[str(args.chosen_exponent)]:
        payload['claim_at_chosen_exponent'] = results[str(
            args.chosen_exponent)]['claim']
    with open(osp.join(args.out_dir, 'imbalance_results.json'), 'w') as f:
        json.dump(payload, f, indent=1)
    plot_curves(results, args.exponents, args.out_dir)
    plot_phase_diagram(results, args.exponents, args.out_dir)
    print_table(results, args)


def print_table(results: Dict, args: argparse.Namespace) -> None:
    """Print init -> final own-area attention per exponent and objective.

    Final values are mean +/- std over the seeds; with one seed, the bare
    value (there is no spread to show).
    """
    seeds = len(args.seeds)
    spread = (f'mean +/- std over {seeds} seeds' if seeds > 1 else 'one seed')
    print(f'\nown-area attention of masked patches, init -> final '
          f'({spread})')
    print(f"{'kappa':<6} {'global/local':<13} {'objective':<10} "
          f"{'global area':<26} {'local areas':<26} {'area NMI':<15} "
          'rec. error')
    for exponent in args.exponents:
        entry = results[str(exponent)]
        for objective, stats in entry['summary'].items():
            sizes = f"{entry['area_sizes'][0]}/{entry['area_sizes'][1]}"
            own_global = (f"{stats['own_global_init']['mean']:.3f} -> "
                          f"{format_stat(stats['own_global_final'])}")
            own_local = (f"{stats['own_local_init']['mean']:.3f} -> "
                         f"{format_stat(stats['own_local_final'])}")
            nmi = (f"{stats['area_nmi_init']['mean']:.3f} -> "
                   f"{stats['area_nmi_final']['mean']:.3f}")
            print(f'{exponent:<6} {sizes:<13} {objective:<10} '
                  f'{own_global:<26} {own_local:<26} {nmi:<15} '
                  f"{stats['reconstruction_error_final']['mean']:.4f}")
        ceiling = entry['own_area_ceiling']
        print(f"{'':<6} ceilings: global {ceiling['global_area']:.3f}, "
              f"local {ceiling['local_area']:.3f}")
        if 'claim' in entry:
            verdict = 'holds' if entry['claim']['claim_holds'] else \
                'does not hold'
            print(f"{'':<6} claim: {verdict}")
    chosen = results[str(args.chosen_exponent)]
    if 'claim' in chosen:
        print()
        print('\n'.join(format_claim(chosen['claim'], args.chosen_exponent)))
    print(f'\nwrote {args.out_dir}')


if __name__ == '__main__':
    main()
