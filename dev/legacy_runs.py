"""Convert the two shipped studies' runs.json to the comparison tool's format.

docs/study/runs.json (written by the former ``run_study.py``) and
docs/results/runs.json (the former ``run_evidence.py`` sweep) were plain
lists of records; ``tools/compare.py report`` reads ``{"format": 1,
"comparison": <spec>, "runs": [...]}``. This script writes that file with
the spec each study was run with and every record's numbers unchanged
(keys renamed only: the sweep's CLS metrics ``knn/top1`` become
``cls/knn_top1``, timings go under ``time/``, checkpoint paths under
``runs/``). Run once per legacy file; a converted file is left as it is.

Usage: python dev/legacy_runs.py docs/study/runs.json docs/results/runs.json
"""
import json
import sys

from mmae_compare.records import FORMAT
from mmae_compare.spec import Arm, Comparison, Protocol

FMNIST = 'configs/fashion_mnist/'


def mmae(name: str, lam: float, mu: float) -> Arm:
    return Arm(name, FMNIST + 'mmae_fmnist.py',
               (('model.regularizer.loss_weight', lam),
                ('model.regularizer.mu', mu)), f'M-MAE λ={lam:g} μ={mu:g}')


def study_spec() -> Comparison:
    """The long study: 60,000 images, 20 epochs, 5 seeds, two controls."""
    arms = (Arm('random_init', 'random', label='random init (control)'),
            Arm('mae', FMNIST + 'mae_fmnist.py',
                label='MAE'), mmae('mmae_lam0.01_mu1', 0.01, 1.0),
            mmae('mmae_lam0.00125_mu1', 0.00125, 1.0),
            Arm('supervised',
                FMNIST + 'supervised_fmnist.py',
                label='supervised (control)'))
    return Comparison(
        arms,
        'mae', (0, 1, 2, 3, 4),
        20, (5, 10, 15, 20),
        Protocol(FMNIST + 'knn_fmnist_clsmean.py', ('cls', 'cls+mean'),
                 (10, 100)),
        cfg_options=(('default_hooks.logger.interval', 50), ))


def sweep_spec() -> Comparison:
    """The lambda / mu sweep: 7,680 images, 3 epochs, 3 seeds, CLS."""
    lambdas = (0.001, 0.00125, 0.01, 0.1)
    arms = [Arm('mae', FMNIST + 'mae_fmnist.py', label='MAE')]
    arms += [
        Arm(f'umae_lam{lam:g}', FMNIST + 'umae_fmnist.py',
            (('model.regularizer.loss_weight', lam), ), f'U-MAE λ={lam:g}')
        for lam in lambdas
    ]
    arms += [mmae(f'mmae_lam{lam:g}_mu1', lam, 1.0) for lam in lambdas]
    arms += [
        mmae(f'mmae_lam0.01_mu{mu:g}', 0.01, mu)
        for mu in (0.1, 0.3, 3.0, 10.0)
    ]
    return Comparison(
        tuple(arms),
        'mae', (0, 1, 2),
        3, (3, ),
        Protocol(FMNIST + 'knn_fmnist.py', ('cls', ), (), bank_images=10000),
        images=7680,
        cfg_options=(('default_hooks.logger.interval', 10), ))


def study_row(row: dict) -> dict:
    row = {('time/eval_s' if k == 'eval_s' else k): v for k, v in row.items()}
    row['checkpoint'] = 'runs/' + row['checkpoint']
    return row


SWEEP_KEYS = {
    'cell': 'arm',
    'pretrain_s': 'time/train_s',
    'eval_s': 'time/eval_s',
    'knn/top1': 'cls/knn_top1',
    'knn/top5': 'cls/knn_top5',
    'linear/top1': 'cls/linear_top1',
    'linear/train_top1': 'cls/linear_train_top1'
}


def sweep_row(row: dict) -> dict:
    new = {}
    for key, value in row.items():
        if key.startswith('repr/'):
            key = 'cls/' + key
        new[SWEEP_KEYS.get(key, key)] = value
    new['epoch'] = 3
    new['checkpoint'] = 'runs/' + row['checkpoint']
    return new


def convert(path: str) -> None:
    with open(path) as f:
        rows = json.load(f)
    if isinstance(rows, dict):
        print(f'{path}: already converted')
        return
    sweep = 'cell' in rows[0]
    spec = sweep_spec() if sweep else study_spec()
    rows = [sweep_row(r) if sweep else study_row(r) for r in rows]
    order = [a.name for a in spec.arms]
    rows.sort(key=lambda r: (order.index(r['arm']), r['seed'], r['epoch']))
    with open(path, 'w') as f:
        json.dump(
            {
                'format': FORMAT,
                'comparison': spec.as_dict(),
                'runs': rows
            },
            f,
            indent=1,
            ensure_ascii=False)
    print(f'{path}: {len(rows)} records converted')


if __name__ == '__main__':
    for path in sys.argv[1:]:
        convert(path)
