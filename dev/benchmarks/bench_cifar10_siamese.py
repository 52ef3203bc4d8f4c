"""Training-step time of the CIFAR-10 Siamese configs, for planning.

Builds each method of ``configs/cifar10/`` (SyncBN reverted to BN, as the
runner does on one device), feeds it random 32 x 32 views at the recipe's
batch and times full training steps (preprocessing, forward, backward,
LARS update) after a warm-up. Data loading is not included (CIFAR-10 is
not on this machine). Prints wall and process-CPU seconds per step, and
what they make of one epoch (50,000 images) and of the 200-epoch recipe;
``dev/cifar10_campaign.sh`` quotes the figures.

Example::

    python dev/benchmarks/bench_cifar10_siamese.py --steps 3       # CPU
    python dev/benchmarks/bench_cifar10_siamese.py --device cuda --steps 50
"""
import argparse
import os.path as osp
import sys
import time

import torch
from mmengine.logging import MMLogger
from mmengine.model import revert_sync_batchnorm

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from bench_step_time import build_trainable  # noqa: E402

METHODS = ('simclr', 'byol', 'barlowtwins', 'spectral')
TRAIN_IMAGES = 50_000


def time_steps(method: str, device: str, batch: int, warmup: int,
               steps: int) -> tuple:
    """Mean wall and CPU seconds of ``steps`` training steps."""
    model, optim = build_trainable(f'configs/cifar10/{method}_cifar10.py')
    model = revert_sync_batchnorm(model).to(device)
    views = [
        torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
        for _ in range(2)
    ]
    data = dict(inputs=views, data_samples=None)
    for _ in range(warmup):
        model.train_step(data, optim)
    if device == 'cuda':
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        model.train_step(data, optim)
    if device == 'cuda':
        torch.cuda.synchronize()
    return ((time.perf_counter() - wall) / steps,
            (time.process_time() - cpu) / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--epochs', type=int, default=200)
    parser.add_argument(
        '--methods', nargs='+', default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    # Built models and optimizers log every parameter at INFO.
    MMLogger.get_instance('mmengine', log_level='WARNING')
    steps_per_epoch = TRAIN_IMAGES // args.batch
    print(f'device {args.device}, batch {args.batch}, torch threads '
          f'{torch.get_num_threads()}, {steps_per_epoch} steps per epoch')
    print('| method | wall s/step | CPU s/step | min/epoch (wall) | '
          f'h for {args.epochs} epochs |')
    print('|---|---|---|---|---|')
    for method in args.methods:
        wall, cpu = time_steps(method, args.device, args.batch, args.warmup,
                               args.steps)
        epoch_min = wall * steps_per_epoch / 60
        print(
            f'| {method} | {wall:.3f} | {cpu:.3f} | {epoch_min:.1f} | '
            f'{epoch_min * args.epochs / 60:.1f} |',
            flush=True)


if __name__ == '__main__':
    main()
