"""What the regulariser buys: MAE, U-MAE and M-MAE at equal budget, with seeds.

The library behind ``tools/benchmarks/run_evidence.py``. One command
pretrains every cell of the grid on Fashion-MNIST over several seeds,
evaluates each checkpoint on frozen features (weighted kNN, a linear probe
fitted on cached features, matrix-information statistics), and writes a
report (``<out-dir>/report/results.md`` unless ``--report`` names another
path) with plots: the difference to MAE paired by seed with its 95 %
t-interval (:mod:`mmae_plugin.evidence.intervals`).

* Every run lives in ``<out-dir>/<cell>/seed<k>/``; a run with
  ``results.json`` is skipped, an interrupted one resumes from its last
  checkpoint, so the sweep survives being killed.
* The pretraining configs are frozen into ``<out-dir>/configs/`` at the first
  start, so a resumed sweep trains exactly what it started with.
* Runs go in parallel (``--jobs``), each with ``cores / jobs`` threads.

Examples::

    python tools/benchmarks/run_evidence.py                  # the full sweep
    python tools/benchmarks/run_evidence.py --quick --out-dir /tmp/ev
                                                 # ~1 minute, /tmp/ev/report/
    python tools/benchmarks/run_evidence.py --report-only \\
        --report docs/results.md                 # re-analyse into the docs
"""
import argparse
import dataclasses
import json
import os
import os.path as osp
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence

from .study import REPO

#: The child processes run this module (from the checkout's root).
CHILD_MODULE = 'mmae_plugin.evidence.sweep'
PRETRAIN_CONFIGS = {
    'mae': 'configs/fashion_mnist/mae_fmnist.py',
    'umae': 'configs/fashion_mnist/umae_fmnist.py',
    'mmae': 'configs/fashion_mnist/mmae_fmnist.py',
}
KNN_CONFIG = 'configs/fashion_mnist/knn_fmnist.py'
PROBE_CONFIG = 'configs/fashion_mnist/linear_fmnist.py'
METHOD_NAMES = {'mae': 'MAE', 'umae': 'U-MAE', 'mmae': 'M-MAE'}
METRICS = ('knn/top1', 'linear/top1')
#: Published effective weight of the 8-GPU reference runs (0.01 / 8).
PUBLISHED_LAMBDA = 0.00125


@dataclasses.dataclass(frozen=True)
class Cell:
    """One point of the grid: a method and its regulariser's settings."""
    method: str
    lam: Optional[float] = None
    mu: Optional[float] = None

    @property
    def name(self) -> str:
        parts = [self.method]
        if self.lam is not None:
            parts.append(f'lam{self.lam:g}')
        if self.mu is not None:
            parts.append(f'mu{self.mu:g}')
        return '_'.join(parts)

    @property
    def label(self) -> str:
        text = METHOD_NAMES[self.method]
        if self.lam is not None:
            text += f' λ={self.lam:g}'
        if self.mu is not None:
            text += f' μ={self.mu:g}'
        return text

    def cfg_options(self) -> Dict[str, float]:
        options = {}
        if self.lam is not None:
            options['model.regularizer.loss_weight'] = self.lam
        if self.mu is not None:
            options['model.regularizer.mu'] = self.mu
        return options


@dataclasses.dataclass(frozen=True)
class Budget:
    """Size of every run (identical for all cells)."""
    images: int  # pretraining images (the first N of the training set)
    epochs: int
    seeds: Sequence[int]
    bank_images: Optional[int]  # kNN neighbours / probe training images
    test_images: Optional[int]  # None: the whole test set
    probe_check_epochs: int


FULL = Budget(images=7680, epochs=3, seeds=(0, 1, 2), bank_images=10000,
              test_images=None, probe_check_epochs=5)
QUICK = Budget(images=256, epochs=2, seeds=(0, 1), bank_images=500,
               test_images=500, probe_check_epochs=1)


def full_grid() -> List[Cell]:
    """MAE; U-MAE and M-MAE over lambda; M-MAE over mu (Table 2 analogue)."""
    lambdas = (0.001, PUBLISHED_LAMBDA, 0.01, 0.1)
    cells = [Cell('mae')]
    cells += [Cell('umae', lam) for lam in lambdas]
    cells += [Cell('mmae', lam, 1.0) for lam in lambdas]
    cells += [Cell('mmae', 0.01, mu) for mu in (0.1, 0.3, 3.0, 10.0)]
    return cells


def quick_grid() -> List[Cell]:
    return [Cell('mae'), Cell('mmae', 0.01, 1.0)]


#: Cells whose seed-0 checkpoints become the Fashion-MNIST model zoo.
ZOO_CELLS = {'mae': Cell('mae'), 'umae': Cell('umae', 0.01),
             'mmae': Cell('mmae', 0.01, 1.0)}


def cell_from_name(name: str) -> Cell:
    method, *parts = name.split('_')
    values = {part[:3] if part.startswith('lam') else part[:2]:
              float(part[3:] if part.startswith('lam') else part[2:])
              for part in parts}
    return Cell(method, values.get('lam'), values.get('mu'))


# ----------------------------------------------------------------------------
# One run (executed in a child process: fresh mmengine global state)
# ----------------------------------------------------------------------------
def pretrain(cell: Cell, seed: int, budget: Budget, run_dir: str,
             config_dir: str) -> str:
    """Pretrain (or resume) one cell and return its last checkpoint."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    final = osp.join(run_dir, f'epoch_{budget.epochs}.pth')
    if osp.isfile(final):
        return final
    cfg = Config.fromfile(osp.join(config_dir, f'{cell.method}.py'))
    cfg.merge_from_dict({
        'train_dataloader.dataset.indices': budget.images,
        'train_cfg.max_epochs': budget.epochs,
        'param_scheduler.1.T_max': budget.epochs - 1,
        'param_scheduler.1.end': budget.epochs,
        'randomness.seed': seed,
        'default_hooks.checkpoint.max_keep_ckpts': 1,
        'default_hooks.logger.interval': 10,
        **cell.cfg_options(),
    })
    cfg.work_dir = run_dir
    cfg.resume = True  # picks up last_checkpoint if the run was interrupted
    cfg.load_from = None
    Runner.from_cfg(cfg).train()
    return final


def evaluation_config(budget: Budget):
    """The kNN config restricted to the budget's bank and test images."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, KNN_CONFIG))
    options = {'model.prototype.num_workers': 0,
               'test_dataloader.num_workers': 0,
               'test_dataloader.persistent_workers': False}
    if budget.bank_images is not None:
        options['model.prototype.dataset.indices'] = budget.bank_images
    if budget.test_images is not None:
        options['test_dataloader.dataset.indices'] = budget.test_images
    cfg.merge_from_dict(options)
    return cfg


def run_one(cell: Cell, seed: int, budget: Budget, run_dir: str,
            config_dir: str) -> Dict[str, float]:
    """Pretrain, evaluate and write ``results.json`` for one run."""
    import torch
    from mmengine.registry import init_default_scope
    from mmae_plugin.evaluation import (evaluate_frozen_encoder,
                                        linear_probe_state_dict)

    start = time.time()
    checkpoint = pretrain(cell, seed, budget, run_dir, config_dir)
    trained = time.time()
    init_default_scope('mmpretrain')
    metrics, probe, encoder = evaluate_frozen_encoder(
        evaluation_config(budget), checkpoint)
    torch.save({'state_dict': linear_probe_state_dict(probe, encoder)},
               osp.join(run_dir, 'linear_probe.pth'))
    # Relative to the out dir: runs.json stays valid when the dir moves.
    out_dir = osp.dirname(osp.dirname(osp.abspath(run_dir)))
    metrics.update(cell=cell.name, seed=seed,
                   checkpoint=osp.relpath(checkpoint, out_dir),
                   pretrain_s=trained - start, eval_s=time.time() - trained)
    with open(osp.join(run_dir, 'results.json.tmp'), 'w') as f:
        json.dump(metrics, f, indent=1)
    os.replace(osp.join(run_dir, 'results.json.tmp'),
               osp.join(run_dir, 'results.json'))
    return metrics


def probe_check(cell: Cell, budget: Budget, run_dir: str) -> None:
    """Train the full linear-probe config on the cell's seed-0 encoder."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    epochs = budget.probe_check_epochs
    cfg = Config.fromfile(osp.join(REPO, PROBE_CONFIG))
    scheduler = [dict(type='LinearLR', start_factor=1e-4, by_epoch=True,
                      begin=0, end=1, convert_to_iter_based=True)]
    if epochs > 1:
        scheduler.append(dict(type='CosineAnnealingLR', T_max=epochs - 1,
                              by_epoch=True, begin=1, end=epochs,
                              eta_min=0.0, convert_to_iter_based=True))
    cfg.param_scheduler = scheduler
    options = {
        'model.backbone.init_cfg.checkpoint':
        osp.join(run_dir, f'epoch_{budget.epochs}.pth'),
        'train_cfg.max_epochs': epochs, 'train_cfg.val_interval': epochs,
        'default_hooks.checkpoint.interval': epochs,
    }
    if budget.bank_images is not None:
        options['train_dataloader.dataset.indices'] = budget.bank_images
    if budget.test_images is not None:
        options['val_dataloader.dataset.indices'] = budget.test_images
        options['test_dataloader.dataset.indices'] = budget.test_images
    cfg.merge_from_dict(options)
    cfg.work_dir = osp.join(run_dir, 'probe_config')
    Runner.from_cfg(cfg).train()


# ----------------------------------------------------------------------------
# The sweep (parent process)
# ----------------------------------------------------------------------------
def freeze_configs(out_dir: str) -> str:
    """Dump the pretraining configs once; later starts reuse the dumps."""
    config_dir = osp.join(out_dir, 'configs')
    if all(osp.isfile(osp.join(config_dir, f'{m}.py'))
           for m in PRETRAIN_CONFIGS):
        return config_dir
    import mmae_plugin.registration  # noqa: F401
    from mmengine.config import Config
    os.makedirs(config_dir, exist_ok=True)
    for method, path in PRETRAIN_CONFIGS.items():
        Config.fromfile(osp.join(REPO, path)).dump(
            osp.join(config_dir, f'{method}.py'))
    return config_dir


def run_dir_of(out_dir: str, cell: Cell, seed: int) -> str:
    return osp.join(out_dir, cell.name, f'seed{seed}')


def load_results(out_dir: str) -> List[dict]:
    rows = []
    if not osp.isdir(out_dir):
        return rows
    for cell_name in sorted(os.listdir(out_dir)):
        cell_dir = osp.join(out_dir, cell_name)
        if not osp.isdir(cell_dir) or cell_name == 'configs':
            continue
        for seed_dir in sorted(os.listdir(cell_dir)):
            path = osp.join(cell_dir, seed_dir, 'results.json')
            if osp.isfile(path):
                with open(path) as f:
                    rows.append(json.load(f))
    return rows


def child_command(args, cell: Cell, seed: int, threads: int) -> List[str]:
    return [sys.executable, '-m', CHILD_MODULE, '--child', cell.name,
            str(seed), '--out-dir', args.out_dir, '--threads', str(threads)
            ] + (['--quick'] if args.quick else []) + [
                f'--{key}={value}' for key in ('images', 'epochs')
                if (value := getattr(args, key)) is not None]


def run_sweep(args, cells: List[Cell], budget: Budget) -> None:
    from mmengine.utils import ProgressBar
    freeze_configs(args.out_dir)
    todo = [(cell, seed) for cell in cells for seed in budget.seeds
            if not osp.isfile(osp.join(run_dir_of(args.out_dir, cell, seed),
                                       'results.json'))]
    total = len(cells) * len(budget.seeds)
    print(f'[evidence] {total - len(todo)} of {total} runs already done; '
          f'{len(todo)} to go, {args.jobs} at a time')
    if not todo:
        return
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    progress = ProgressBar(len(todo))
    failures = []

    def launch(cell: Cell, seed: int) -> None:
        run_dir = run_dir_of(args.out_dir, cell, seed)
        os.makedirs(run_dir, exist_ok=True)
        with open(osp.join(run_dir, 'run.log'), 'a') as log:
            proc = subprocess.run(child_command(args, cell, seed, threads),
                                  cwd=REPO, stdout=log, stderr=log)
        if proc.returncode != 0:
            failures.append(f'{cell.name} seed {seed}: see '
                            f'{osp.join(run_dir, "run.log")}')

    with ThreadPoolExecutor(args.jobs) as pool:
        for future in as_completed(
                [pool.submit(launch, cell, seed) for cell, seed in todo]):
            future.result()
            progress.update()
    print()
    if failures:
        raise SystemExit('[evidence] failed runs:\n  ' + '\n  '.join(failures))


def budget_of(args) -> Budget:
    """The --quick or full budget, with --images / --epochs applied."""
    budget = QUICK if args.quick else FULL
    sizes = {key: value for key, value in
             (('images', args.images), ('epochs', args.epochs))
             if value is not None}
    return dataclasses.replace(budget, **sizes) if sizes else budget


def main_child(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    import mmae_plugin.registration  # noqa: F401
    budget = budget_of(args)
    cell = cell_from_name(args.child[0])
    seed = int(args.child[1])
    run_dir = run_dir_of(args.out_dir, cell, seed)
    if args.probe_check:
        probe_check(cell, budget, run_dir)
    else:
        run_one(cell, seed, budget, run_dir,
                osp.join(args.out_dir, 'configs'))


# ----------------------------------------------------------------------------
# Model zoo export (seed-0 encoders of the zoo cells, evaluated on all data)
# ----------------------------------------------------------------------------
ZOO_DIR = osp.join(REPO, 'checkpoints', 'fmnist')
ZOO_METAFILE = osp.join(REPO, 'configs', 'fashion_mnist', 'metafile.yml')


def zoo_name(cell: Cell) -> str:
    return f'{cell.method}_vit-tiny-p4_fmnist'


def training_resources() -> str:
    """What the sweep's runs trained on: this machine's GPUs or CPU cores."""
    import torch
    if torch.cuda.is_available():
        return f'{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}'
    return f'{os.cpu_count()} CPU cores'


def model_complexity(config: str) -> Dict[str, int]:
    """Metafile ``FLOPs`` and ``Parameters`` of a Fashion-MNIST config.

    Counted as mmpretrain's ``tools/analysis_tools/get_flops.py`` does
    (``extract_feat`` on one unmasked 1 x 28 x 28 image, one multiply-add
    per FLOP, every parameter of the built model), plus the two matrix
    products inside ``scaled_dot_product_attention``, which mmengine's
    counter skips.

    Args:
        config: A config path relative to the repository.

    Returns:
        ``{'FLOPs': ..., 'Parameters': ...}``.
    """
    import torch
    from mmengine.analysis import FlopAnalyzer, parameter_count
    from mmengine.analysis.jit_handles import get_shape
    from mmengine.config import Config
    from mmpretrain.registry import MODELS

    def attention_flops(inputs, outputs) -> int:
        query, key = get_shape(inputs[0]), get_shape(inputs[1])
        heads = int(torch.tensor(query[:-2]).prod())
        return 2 * heads * query[-2] * key[-2] * query[-1]

    model_cfg = Config.fromfile(osp.join(REPO, config)).model
    model_cfg.get('backbone', {}).pop('init_cfg', None)
    model = MODELS.build(model_cfg).eval()
    model.forward = model.extract_feat
    with torch.no_grad():
        counter = FlopAnalyzer(model, torch.zeros(1, 1, 28, 28))
        counter.set_op_handle('aten::scaled_dot_product_attention',
                              attention_flops)
        counter.unsupported_ops_warnings(False)
        counter.uncalled_modules_warnings(False)
        flops = counter.total()
    return {'FLOPs': int(flops), 'Parameters': int(parameter_count(model)[''])}


def export_zoo(out_dir: str, budget: Budget, quick: bool = False,
               zoo_dir: str = ZOO_DIR, metafile: str = ZOO_METAFILE) -> None:
    """Write the zoo checkpoints and the Fashion-MNIST metafile.

    Each zoo cell's seed-0 encoder is evaluated with the shipped kNN config
    (all 60,000 training images as neighbours, all 10,000 test images) and a
    linear probe fitted on the cached features of all 60,000 training images;
    the probe becomes the linear-classifier checkpoint of M-MAE. (With the
    quick budget, the quick evaluation sizes are used instead.)
    """
    import torch
    import yaml
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.datasets import GzipFashionMNIST
    from mmae_plugin.evaluation import (evaluate_frozen_encoder,
                                        linear_probe_state_dict)

    init_default_scope('mmpretrain')
    os.makedirs(zoo_dir, exist_ok=True)
    seed = budget.seeds[0]
    dataset_meta = {'classes': list(GzipFashionMNIST.METAINFO['classes'])}
    models = []
    grid = quick_grid() if quick else full_grid()
    for method, cell in ZOO_CELLS.items():
        if cell not in grid:
            continue
        run_dir = run_dir_of(out_dir, cell, seed)
        checkpoint = osp.join(run_dir, f'epoch_{budget.epochs}.pth')
        if not osp.isfile(checkpoint):
            raise SystemExit(f'[evidence] {checkpoint} is missing: run the '
                             'sweep before --export-zoo')
        name = zoo_name(cell)
        print(f'[evidence] exporting {name} (evaluating on all data)')
        eval_cfg = evaluation_config(budget) if quick else \
            Config.fromfile(osp.join(REPO, KNN_CONFIG))
        metrics, probe, encoder = evaluate_frozen_encoder(eval_cfg, checkpoint)
        provenance = dict(cell=cell.name, seed=seed, images=budget.images,
                          epochs=budget.epochs)
        state = torch.load(checkpoint, map_location='cpu',
                           weights_only=True)['state_dict']
        torch.save({'state_dict': state,
                    'meta': dict(mmae_zoo=provenance)},
                   osp.join(zoo_dir, f'{name}.pth'))
        def metadata(config: str) -> Dict:
            return {'Epochs': budget.epochs, 'Batch Size': 256,
                    **model_complexity(config),
                    'Training Resources': training_resources(),
                    'Training Data': f'Fashion-MNIST (first {budget.images} '
                    'training images)', 'Seed': seed,
                    'Results Source': 'measured by tools/benchmarks/'
                    'run_evidence.py --export-zoo'}
        weights = f'mmae-zoo://fmnist/{name}.pth'
        models += [
            {'Name': name, 'In Collection': COLLECTIONS[method],
             'Metadata': metadata(PRETRAIN_CONFIGS[method]), 'Results': None,
             'Weights': weights, 'Config': PRETRAIN_CONFIGS[method]},
            {'Name': f'{name}_knn', 'In Collection': COLLECTIONS[method],
             'Metadata': dict(metadata(KNN_CONFIG),
                              **{'kNN': 'k=20, T=0.07, 60,000 neighbours'}),
             'Results': [result(metrics['knn/top1'])],
             'Weights': weights, 'Config': KNN_CONFIG}]
        if method == 'mmae':
            linear = f'{name}_linear'
            torch.save({'state_dict': linear_probe_state_dict(probe, encoder),
                        'meta': dict(mmae_zoo=provenance,
                                     dataset_meta=dataset_meta)},
                       osp.join(zoo_dir, f'{linear}.pth'))
            models.append(
                {'Name': linear, 'In Collection': COLLECTIONS[method],
                 'Metadata': dict(metadata(PROBE_CONFIG), **{
                     'Probe': 'BatchNorm + linear fitted on cached features '
                     'of all 60,000 training images'}),
                 'Results': [result(metrics['linear/top1'])],
                 'Weights': f'mmae-zoo://fmnist/{linear}.pth',
                 'Config': PROBE_CONFIG})
    header = ('# Fashion-MNIST models, written by\n'
              '#   python tools/benchmarks/run_evidence.py --export-zoo\n'
              "# from the sweep's seed-0 runs; results measured on the "
              '10,000 test images. FLOPs and Parameters as mmpretrain\'s\n'
              '# get_flops.py counts them (extract_feat on one 1 x 28 x 28 '
              'image, attention included).\n')
    with open(metafile, 'w') as f:
        f.write(header)
        yaml.safe_dump({'Models': models}, f, sort_keys=False,
                       allow_unicode=True)
    add_to_model_index(metafile)
    print(f'[evidence] wrote {metafile} and {zoo_dir}')


def add_to_model_index(metafile: str) -> None:
    """List ``metafile`` in the repository's model-index.yml if it is inside."""
    index = osp.join(REPO, 'model-index.yml')
    relative = osp.relpath(osp.abspath(metafile), REPO)
    if relative.startswith('..'):
        return
    with open(index) as f:
        text = f.read()
    if relative not in text:
        with open(index, 'a') as f:
            f.write(f'  - {relative}\n')


COLLECTIONS = {'mae': 'MAE', 'umae': 'U-MAE', 'mmae': 'M-MAE'}


def result(top1: float) -> dict:
    return {'Task': 'Image Classification', 'Dataset': 'Fashion-MNIST',
            'Metrics': {'Top 1 Accuracy': round(top1, 2)}}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', default=osp.join(REPO, 'work_dirs',
                                                      'evidence'))
    parser.add_argument('--report',
                        help='markdown report path; its plots and runs.json '
                        'go next to it, in results/ (default '
                        '<out-dir>/report/results.md)')
    parser.add_argument('--quick', action='store_true',
                        help='tiny budget and grid (for the test suite)')
    parser.add_argument('--images', type=int,
                        help='pretraining images per run (default: the '
                        'budget\'s); use a new --out-dir for a new budget')
    parser.add_argument('--epochs', type=int,
                        help='pretraining epochs per run (>= 2)')
    parser.add_argument('--jobs', type=int, default=2,
                        help='runs in parallel (each gets cores/jobs threads)')
    parser.add_argument('--report-only', action='store_true',
                        help='only rebuild the report from finished runs')
    parser.add_argument('--no-probe-check', action='store_true',
                        help='skip training the full probe config on MAE and '
                        'M-MAE seed 0')
    parser.add_argument('--export-zoo', action='store_true',
                        help='write the Fashion-MNIST model-zoo checkpoints '
                        'and metafile from the finished sweep')
    parser.add_argument('--zoo-dir', default=ZOO_DIR,
                        help='where --export-zoo writes the checkpoints')
    parser.add_argument('--zoo-metafile', default=ZOO_METAFILE,
                        help='where --export-zoo writes the metafile')
    parser.add_argument('--child', nargs=2, metavar=('CELL', 'SEED'),
                        help=argparse.SUPPRESS)
    parser.add_argument('--probe-check', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--threads', type=int, default=1,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f'--jobs must be >= 1, got {args.jobs}')
    if args.images is not None and args.images < 256:
        parser.error(f'--images must be >= 256 (one batch), got {args.images}')
    if args.epochs is not None and args.epochs < 2:
        parser.error(f'--epochs must be >= 2 (warm-up, then cosine), got '
                     f'{args.epochs}')
    args.out_dir = osp.abspath(args.out_dir)
    if args.report is None:
        args.report = osp.join(args.out_dir, 'report', 'results.md')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return main_child(args)
    budget = budget_of(args)
    cells = quick_grid() if args.quick else full_grid()
    # The sweep's command line (a --report-only rebuild reports the same).
    command = 'python tools/benchmarks/run_evidence.py ' + ' '.join(
        arg for arg in (sys.argv[1:] if argv is None else argv)
        if arg != '--report-only')
    if args.export_zoo:
        return export_zoo(args.out_dir, budget, args.quick, args.zoo_dir,
                          args.zoo_metafile)
    if not args.report_only:
        run_sweep(args, cells, budget)
        if not args.no_probe_check:
            run_probe_checks(args, budget)
    from .sweep_report import saved_rows, write_report
    rows = load_results(args.out_dir)
    if not rows and args.report_only:
        # The runs are gone (the sweep's out dir is not kept): re-analyse
        # the rows the report was computed from.
        rows = saved_rows(args.report)
    write_report(rows, cells, budget, args.out_dir, args.report,
                 command.strip())
    print(f'[evidence] report written to {args.report}')


def run_probe_checks(args, budget: Budget) -> None:
    """Full probe config on MAE and M-MAE (seed 0) to validate the cache."""
    for cell in (ZOO_CELLS['mae'], ZOO_CELLS['mmae']):
        run_dir = run_dir_of(args.out_dir, cell, budget.seeds[0])
        if probe_check_result(run_dir) is not None:
            continue
        print(f'[evidence] full probe config on {cell.label} seed '
              f'{budget.seeds[0]}')
        threads = os.cpu_count() or 1
        with open(osp.join(run_dir, 'probe_check.log'), 'a') as log:
            subprocess.run(child_command(args, cell, budget.seeds[0], threads)
                           + ['--probe-check'], cwd=REPO, stdout=log,
                           stderr=log, check=True)


def probe_check_result(run_dir: str) -> Optional[float]:
    """Top-1 of the full probe config's last validation, if it finished."""
    work_dir = osp.join(run_dir, 'probe_config')
    if not osp.isdir(work_dir):
        return None
    top1 = None
    for entry in sorted(os.listdir(work_dir)):
        path = osp.join(work_dir, entry, 'vis_data', 'scalars.json')
        if osp.isfile(path):
            with open(path) as f:
                for line in f:
                    if 'accuracy/top1' in line:
                        top1 = json.loads(line)['accuracy/top1']
    return top1


if __name__ == '__main__':
    main()
