"""The quick start over seeds: M-MAE against MAE at its budget.

Runs ``tools/quickstart.sh`` (4 epochs on the 60,000 Fashion-MNIST images,
cached probe and kNN on CLS + mean patch tokens) for each config and seed,
one after another, each in its own work dir; a run whose ``metrics.json``
exists is skipped, so an interrupted sweep resumes where it stopped. Then
prints and writes mean, standard deviation and the paired difference
M-MAE - MAE by seed with a 95 % t-interval.

Example::

    python tools/benchmarks/quickstart_seeds.py --seeds 0 1 2 \\
        --out docs/results/quickstart_seeds.json
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

from scipy import stats

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = {
    'MAE': 'configs/fashion_mnist/mae_fmnist.py',
    'M-MAE': 'configs/fashion_mnist/mmae_fmnist.py',
}
METRICS = ('linear/top1', 'knn/top1', 'repr/erank')


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--work-dir', default='work_dirs/quickstart_seeds')
    parser.add_argument('--out', help='write the runs and summary as JSON')
    return parser.parse_args()


def run(name: str, seed: int, work_dir: str) -> dict:
    """One quick start; its metrics and wall time (cached on disk)."""
    run_dir = osp.join(work_dir, f'{name}_seed{seed}')
    metrics_file = osp.join(run_dir, 'metrics.json')
    if not osp.exists(metrics_file):
        start = time.time()
        env = dict(os.environ, CONFIG=CONFIGS[name], SEED=str(seed))
        with open(osp.join(work_dir, f'{name}_seed{seed}.log'), 'w') as log:
            subprocess.run(['bash', 'tools/quickstart.sh', run_dir], env=env,
                           cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                           check=True)
        with open(osp.join(run_dir, 'wall_s.txt'), 'w') as f:
            f.write(f'{time.time() - start:.0f}\n')
    with open(metrics_file) as f:
        metrics = json.load(f)
    with open(osp.join(run_dir, 'wall_s.txt')) as f:
        metrics['wall_s'] = float(f.read())
    return metrics


def summarise(runs: dict, seeds: list) -> dict:
    """Mean, std and the paired M-MAE - MAE difference of each metric."""
    summary = {}
    for key in METRICS:
        row = {}
        for name in CONFIGS:
            values = [runs[name][s][key] for s in seeds]
            row[name] = {'mean': statistics.mean(values),
                         'std': statistics.stdev(values)
                         if len(values) > 1 else 0.0}
        diffs = [runs['M-MAE'][s][key] - runs['MAE'][s][key] for s in seeds]
        mean = statistics.mean(diffs)
        half = 0.0
        if len(diffs) > 1:
            half = stats.t.ppf(0.975, len(diffs) - 1) * \
                statistics.stdev(diffs) / len(diffs)**0.5
        row['M-MAE - MAE'] = {'mean': mean, 'ci95': [mean - half,
                                                     mean + half]}
        summary[key] = row
    return summary


def main() -> None:
    args = parse_args()
    work_dir = osp.join(REPO, args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    runs = {name: {} for name in CONFIGS}
    for seed in args.seeds:
        for name in CONFIGS:
            runs[name][seed] = run(name, seed, work_dir)
            print(f'{name} seed {seed}: ' + ', '.join(
                f'{k} {runs[name][seed][k]:.2f}' for k in METRICS + (
                    'wall_s', )), flush=True)
    summary = summarise(runs, args.seeds)
    for key, row in summary.items():
        diff = row['M-MAE - MAE']
        print(f'{key}: MAE {row["MAE"]["mean"]:.2f} ± '
              f'{row["MAE"]["std"]:.2f}, M-MAE {row["M-MAE"]["mean"]:.2f} '
              f'± {row["M-MAE"]["std"]:.2f}, difference {diff["mean"]:+.2f} '
              f'[{diff["ci95"][0]:+.2f}, {diff["ci95"][1]:+.2f}]')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'seeds': args.seeds, 'runs': runs,
                       'summary': summary, 'command': ' '.join(sys.argv)},
                      f, indent=1)


if __name__ == '__main__':
    main()
