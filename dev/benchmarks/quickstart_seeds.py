"""The quick start over seeds: M-MAE against MAE at its budget.

Runs ``tools/quickstart.sh`` (4 epochs on the 60,000 Fashion-MNIST images,
cached probe and kNN on CLS + mean patch tokens) for each config and seed,
one after another, each in its own work dir; a run whose ``metrics.json``
exists is skipped, so an interrupted sweep resumes where it stopped. Then
prints and writes mean, standard deviation and the paired difference
M-MAE - MAE by seed with a 95 % t-interval.

Example::

    python dev/benchmarks/quickstart_seeds.py --seeds 0 1 2 \\
        --out work_dirs/quickstart_seeds/summary.json
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, Optional, Sequence

# This checkout's package first, whatever else is installed.
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO)

from mmae_compare.intervals import mean_std, paired_interval  # noqa: E402

CONFIGS = {
    'MAE': 'configs/fashion_mnist/mae_fmnist.py',
    'M-MAE': 'configs/fashion_mnist/mmae_fmnist.py',
}
#: Accuracies always summarised; the representation statistics present in
#: the runs' metrics (keys of mmae_plugin.evaluation.statistics, read from
#: the rows) follow them.
ACCURACIES = ('linear/top1', 'knn/top1')


def metric_keys(runs: dict) -> List[str]:
    """The accuracies and every ``repr/erank*`` key all runs share."""
    rows = [row for by_seed in runs.values() for row in by_seed.values()]
    shared = set.intersection(*(set(row) for row in rows)) if rows else set()
    return list(ACCURACIES) + sorted(
        k for k in shared if k.startswith('repr/erank'))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--work-dir', default='work_dirs/quickstart_seeds')
    parser.add_argument('--out', help='write the runs and summary as JSON')
    return parser.parse_args(argv)


def run(name: str, seed: int, work_dir: str) -> dict:
    """One quick start; its metrics and wall time (cached on disk)."""
    run_dir = osp.join(work_dir, f'{name}_seed{seed}')
    metrics_file = osp.join(run_dir, 'metrics.json')
    if not osp.exists(metrics_file):
        start = time.time()
        env = dict(os.environ, CONFIG=CONFIGS[name], SEED=str(seed))
        with open(osp.join(work_dir, f'{name}_seed{seed}.log'), 'w') as log:
            subprocess.run(['bash', 'tools/quickstart.sh', run_dir],
                           env=env,
                           cwd=REPO,
                           stdout=log,
                           stderr=subprocess.STDOUT,
                           check=True)
        with open(osp.join(run_dir, 'wall_s.txt'), 'w') as f:
            f.write(f'{time.time() - start:.0f}\n')
    with open(metrics_file) as f:
        metrics = json.load(f)
    with open(osp.join(run_dir, 'wall_s.txt')) as f:
        metrics['wall_s'] = float(f.read())
    return metrics


def summarise(runs: dict, seeds: list) -> dict:
    """Mean, std and the paired M-MAE - MAE difference of each metric.

    The difference is paired by seed with a 95 % t-interval
    (:func:`~mmae_compare.intervals.paired_interval`); with one
    seed, ``ci95`` is ``None`` and ``text`` says "n=1, no interval".
    """
    summary = {}
    for key in metric_keys(runs):
        row = {}
        for name in CONFIGS:
            mean, std = mean_std([runs[name][s][key] for s in seeds])
            row[name] = {'mean': mean, 'std': None if std != std else std}
        diff = paired_interval({s: runs['M-MAE'][s][key]
                                for s in seeds},
                               {s: runs['MAE'][s][key]
                                for s in seeds})
        row['M-MAE - MAE'] = {
            'mean': diff.mean,
            'n': diff.n,
            'ci95': [diff.low, diff.high] if diff.has_interval else None,
            'text': diff.text()
        }
        summary[key] = row
    return summary


def fmt_std(std: Optional[float]) -> str:
    return '' if std is None else f' ± {std:.2f}'


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    work_dir = osp.join(REPO, args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    runs = {name: {} for name in CONFIGS}
    for seed in args.seeds:
        for name in CONFIGS:
            runs[name][seed] = run(name, seed, work_dir)
            print(
                f'{name} seed {seed}: ' +
                ', '.join(f'{k} {runs[name][seed][k]:.2f}'
                          for k in list(ACCURACIES) + ['wall_s']),
                flush=True)
    summary = summarise(runs, args.seeds)
    for key, row in summary.items():
        diff = row['M-MAE - MAE']
        print(f'{key}: MAE {row["MAE"]["mean"]:.2f}'
              f'{fmt_std(row["MAE"]["std"])}, M-MAE '
              f'{row["M-MAE"]["mean"]:.2f}{fmt_std(row["M-MAE"]["std"])}, '
              f'difference {diff["text"]}')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(
                {
                    'seeds':
                    args.seeds,
                    'runs':
                    runs,
                    'summary':
                    summary,
                    'command':
                    ' '.join(sys.argv if argv is None else
                             ['quickstart_seeds.py', *argv])
                },
                f,
                indent=1)


if __name__ == '__main__':
    main()
