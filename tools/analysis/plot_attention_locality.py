# Copyright (c) mmae-plugin contributors.
"""Plot AttentionLocalityHook logs per layer, for one or more runs.

Reads the ``attn_locality/*`` records that
:class:`mmae_plugin.engine.hooks.AttentionLocalityHook` writes into
``vis_data/scalars.json`` and draws, per layer, the head-averaged mean
attention distance (pixels), query-key NMI (low = attention collapse) and
attention entropy, with the individual heads as dots. One line per run, the
probe before training dashed.

Example::

    python tools/analysis/plot_attention_locality.py \\
        work_dirs/mae_fmnist_attention work_dirs/mocov3_vit_fmnist \\
        --labels MAE MoCo-v3 --out work_dirs/attention_locality.png
"""
import argparse
import glob
import json
import os.path as osp
import re
from typing import Dict, List, Optional

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

PREFIX = 'attn_locality/'
STATS = (('distance', 'mean attention distance (px)'),
         ('nmi', 'query-key NMI (low = collapse)'),
         ('entropy', 'attention entropy (nats)'))
LAYER_KEY = re.compile(r'^attn_locality/(\w+?)_l(\d+)$')
HEAD_KEY = re.compile(r'^attn_locality/(\w+?)_l(\d+)_h(\d+)$')


def parse_args() -> argparse.Namespace:
    """Parse command-line arguments."""
    parser = argparse.ArgumentParser(
        description='Plot attention distance / collapse per layer')
    parser.add_argument(
        'runs', nargs='+', help='work dirs, run dirs or scalars.json files')
    parser.add_argument('--labels', nargs='+', help='one label per run')
    parser.add_argument(
        '--epoch',
        type=int,
        default=None,
        help='probe epoch to plot (default: the last)')
    parser.add_argument(
        '--out',
        default='attention_locality.png',
        help='output figure (.png/.pdf; both are written)')
    parser.add_argument(
        '--json',
        default=None,
        help='also write the plotted numbers to this file')
    return parser.parse_args()


def find_scalars(path: str) -> str:
    """Resolve a work dir / run dir / file to the newest scalars.json."""
    if osp.isfile(path):
        return path
    candidates = sorted(
        glob.glob(osp.join(path, 'vis_data', 'scalars.json')) +
        glob.glob(osp.join(path, '*', 'vis_data', 'scalars.json')))
    if not candidates:
        raise FileNotFoundError(
            f'run={path!r} is invalid: no vis_data/scalars.json under it.')
    return candidates[-1]  # run dirs are timestamps: last is newest


def load_probes(scalars_file: str) -> List[Dict]:
    """All records of a scalars.json that hold attention-locality values."""
    with open(scalars_file) as f:
        records = [json.loads(line) for line in f if line.strip()]
    probes = [r for r in records if any(k.startswith(PREFIX) for k in r)]
    if not probes:
        raise ValueError(f'{scalars_file} has no {PREFIX}* records: was '
                         'AttentionLocalityHook enabled?')
    return probes


def select(probes: List[Dict], epoch: Optional[int]) -> Dict:
    """The probe at ``epoch`` (the last when None)."""
    if epoch is None:
        return probes[-1]
    for probe in probes:
        if probe.get('epoch') == epoch:
            return probe
    found = [p.get('epoch') for p in probes]
    raise ValueError(f'--epoch={epoch} is invalid: probes exist for '
                     f'epochs {found}.')


def per_layer(probe: Dict) -> Dict[str, Dict[str, List[float]]]:
    """Reshape a probe record into ``{stat: {'mean': [...], 'heads': ...}}``.

    Returns:
        dict: For every statistic, ``mean`` (one value per layer) and
        ``heads`` (list of per-head lists, one per layer).
    """
    out: Dict[str, Dict[str, list]] = {}
    for key, value in probe.items():
        layer_match = LAYER_KEY.match(key)
        head_match = HEAD_KEY.match(key)
        if head_match:
            stat, layer, head = head_match.group(1), int(
                head_match.group(2)), int(head_match.group(3))
            heads = out.setdefault(stat, {}).setdefault('heads_map', {})
            heads.setdefault(layer, {})[head] = value
        elif layer_match:
            stat, layer = layer_match.group(1), int(layer_match.group(2))
            out.setdefault(stat, {}).setdefault('mean_map', {})[layer] = value
    result = {}
    for stat, maps in out.items():
        layers = sorted(maps['mean_map'])
        result[stat] = dict(
            mean=[maps['mean_map'][i] for i in layers],
            heads=[[
                maps['heads_map'][i][h] for h in sorted(maps['heads_map'][i])
            ] for i in layers])
    return result


def main() -> None:
    """Load the runs and draw the figure."""
    args = parse_args()
    labels = args.labels or [osp.basename(osp.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f'--labels has {len(labels)} entries, expected one '
                         f'per run ({len(args.runs)}).')
    fig, axes = plt.subplots(1, len(STATS), figsize=(4.2 * len(STATS), 3.4))
    summary = {}
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for index, (run, label) in enumerate(zip(args.runs, labels)):
        probes = load_probes(find_scalars(run))
        final, first = select(probes, args.epoch), probes[0]
        final_stats, first_stats = per_layer(final), per_layer(first)
        summary[label] = dict(
            epoch=final.get('epoch'),
            final=final_stats,
            init_epoch=first.get('epoch'),
            init=first_stats)
        color = colors[index % len(colors)]
        for ax, (stat, title) in zip(axes, STATS):
            means = final_stats[stat]['mean']
            layers = list(range(len(means)))
            ax.plot(
                layers,
                means,
                '-o',
                color=color,
                label=f"{label} (epoch {final.get('epoch')})")
            for layer, heads in enumerate(final_stats[stat]['heads']):
                ax.scatter(
                    [layer] * len(heads), heads, s=8, color=color, alpha=0.4)
            if first is not final:
                ax.plot(
                    layers,
                    first_stats[stat]['mean'],
                    '--',
                    color=color,
                    alpha=0.5)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel('layer')
            ax.set_xticks(layers)
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    stem = osp.splitext(args.out)[0]
    fig.savefig(stem + '.png', dpi=150)
    fig.savefig(stem + '.pdf')
    plt.close(fig)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(summary, f, indent=1)
    for label, entry in summary.items():
        print(f"{label} (epoch {entry['epoch']}; init probe epoch "
              f"{entry['init_epoch']}):")
        for stat, _ in STATS:
            final = ' '.join(f'{v:.3f}' for v in entry['final'][stat]['mean'])
            init = ' '.join(f'{v:.3f}' for v in entry['init'][stat]['mean'])
            print(f'  {stat:<9} per layer: {final}   (init: {init})')
    print(f'wrote {stem}.png and {stem}.pdf')


if __name__ == '__main__':
    main()
