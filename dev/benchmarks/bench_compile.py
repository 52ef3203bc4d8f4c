"""Compiled against eager loss + backward of a shrunk recipe, side by side.

Builds two identical models from a pretraining config (by default the
Fashion-MNIST M-MAE recipe: mmpretrain's MAE ViT shrunk to 4 layers, 128
wide, 28 x 28 images), compiles one's ``loss`` as ``CompileHook`` does
(``torch.compile``, inductor unless ``--backend``), after one eager step,
and times ``loss`` + ``backward`` of both on the same batch in interleaved
rounds, so drift of the machine affects both alike. Prints the compile
time, the median step times and their ratio (eager / compiled: above 1,
compiling pays). ``--vit-base`` shrinks ``configs/mmae_vit-base_200e.py``
to ViT-tiny at 32 x 32 instead (as ``dev/gpu_check.sh`` does).

Example::

    OMP_NUM_THREADS=1 python dev/benchmarks/bench_compile.py --rounds 10
"""
import argparse
import os.path as osp
import runpy
import statistics
import time
from typing import Callable, Dict, List

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401

FMNIST = 'configs/fashion_mnist/mmae_fmnist.py'
VIT_BASE = 'configs/mmae_vit-base_200e.py'
#: configs/mmae_vit-base_200e.py shrunk to ViT-tiny at 32 x 32, as the CUDA
#: tests and dev/gpu_check.sh shrink it.
SHRINK = runpy.run_path(
    osp.join(osp.dirname(__file__), '..', '..', 'tests',
             'shrunk_vit.py'))['SHRINK']


def build_model(args) -> torch.nn.Module:
    """The recipe's model (float32, train mode), seeded."""
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(VIT_BASE if args.vit_base else FMNIST)
    if args.vit_base:
        cfg.merge_from_dict(SHRINK)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.train()


def images(args) -> torch.Tensor:
    """A normalised batch of the recipe's image shape."""
    shape = (3, 32, 32) if args.vit_base else (1, 28, 28)
    return torch.randn(args.batch, *shape)


def step(loss_fn: Callable, inputs: torch.Tensor) -> float:
    """Seconds of one loss + backward."""
    start = time.perf_counter()
    losses = loss_fn(inputs, [])
    sum(v for k, v in losses.items() if k.startswith('loss')).backward()
    return time.perf_counter() - start


def bench(args) -> Dict[str, List[float]]:
    """Per-round step times of the eager and the compiled model."""
    eager, compiled = build_model(args), build_model(args)
    inputs = images(args)
    step(compiled.loss, inputs)  # eager first step, as CompileHook
    loss_fn = torch.compile(compiled.loss, backend=args.backend)
    start = time.perf_counter()
    step(loss_fn, inputs)
    print(f'first compiled step (compilation): '
          f'{time.perf_counter() - start:.1f} s')
    runs = {'eager': eager.loss, 'compiled': loss_fn}
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for round_ in range(args.warmup + args.rounds):
        for name, fn in runs.items():
            seconds = step(fn, inputs)
            if round_ >= args.warmup:
                times[name].append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--batch', type=int, default=64)
    parser.add_argument('--backend', default='inductor')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument(
        '--vit-base',
        action='store_true',
        help='the ViT-B recipe shrunk to ViT-tiny at 32 x 32')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    times = bench(args)
    eager = statistics.median(times['eager'])
    compiled = statistics.median(times['compiled'])
    recipe = 'ViT-B recipe shrunk' if args.vit_base else 'Fashion-MNIST M-MAE'
    print(f'{recipe}, batch {args.batch}, {args.threads} thread(s), '
          f'backend {args.backend}, {args.rounds} rounds (median):')
    print(f'  eager    {eager * 1e3:8.1f} ms')
    print(f'  compiled {compiled * 1e3:8.1f} ms')
    print(f'  eager / compiled = {eager / compiled:.2f}')


if __name__ == '__main__':
    main()
