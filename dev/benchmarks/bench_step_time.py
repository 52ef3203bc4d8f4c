"""M-MAE (and U-MAE) training-step time over MAE's, measured side by side.

Builds each pair of models from the shipped configs with identical weights,
feeds them the same batch and times full training steps (data
preprocessing, forward, backward, optimizer update) in interleaved rounds,
so drift of the machine affects both alike. Prints the median ratios.

Example::

    python dev/benchmarks/bench_step_time.py --rounds 20
"""
import argparse
import copy
import statistics
import time
from typing import Dict, List

import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401

CASES = {
    # name: (baseline config, regularised configs, image shape, batch)
    'fmnist-vit-tiny': ('configs/fashion_mnist/mae_fmnist.py', {
        'M-MAE': 'configs/fashion_mnist/mmae_fmnist.py',
        'U-MAE': 'configs/fashion_mnist/umae_fmnist.py'
    }, (1, 28, 28), 256),
    'vit-base': ('configs/mae_vit-base_200e.py', {
        'M-MAE': 'configs/mmae_vit-base_200e.py',
        'U-MAE': 'configs/umae_vit-base_200e.py'
    }, (3, 224, 224), 32),
}


def build_trainable(config_path: str, seed: int = 0):
    init_default_scope('mmpretrain')  # the configs name mmpretrain types
    cfg = Config.fromfile(config_path)
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.type = 'OptimWrapper'  # fp32 on the CPU
    optim_cfg.pop('loss_scale', None)
    return model, build_optim_wrapper(model, optim_cfg)


def time_step(model, optim_wrapper, data: dict) -> float:
    start = time.perf_counter()
    model.train_step(data, optim_wrapper)
    return time.perf_counter() - start


def regularizer_cost(model, batch: int, reps: int = 50) -> float:
    """Seconds of one forward + backward of the model's regulariser alone.

    Measured on features of the shape the encoder produces; far less noisy
    than a difference of two step times on a shared machine.
    """
    dim = model.backbone.embed_dims
    features = torch.randn(batch, dim, requires_grad=True)
    for _ in range(3):
        model.regularizer(features).backward()
    start = time.perf_counter()
    for _ in range(reps):
        model.regularizer(features).backward()
    return (time.perf_counter() - start) / reps


def bench_case(name: str, rounds: int, warmup: int) -> Dict[str, float]:
    baseline_cfg, variants, shape, batch = CASES[name]
    runs = {'MAE': build_trainable(baseline_cfg)}
    runs.update({k: build_trainable(v) for k, v in variants.items()})
    images = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8)
    data = dict(inputs=images, data_samples=[])  # as default_collate gives
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for i in range(warmup + rounds):
        for key, (model, optim_wrapper) in runs.items():
            torch.manual_seed(i)  # same masks for every model in a round
            elapsed = time_step(model, optim_wrapper, data)
            if i >= warmup:
                times[key].append(elapsed)
    base = statistics.median(times['MAE'])
    print(f'\n{name}: batch {batch}, image {shape}, {rounds} rounds, '
          f'{torch.get_num_threads()} threads')
    print(f'  MAE   median step {base * 1e3:8.1f} ms')
    ratios = {}
    for key in variants:
        med = statistics.median(times[key])
        per_round = [t / b for t, b in zip(times[key], times['MAE'])]
        ratios[key] = statistics.median(per_round)
        print(f'  {key} median step {med * 1e3:8.1f} ms   step-time ratio '
              f'{key}/MAE = {ratios[key]:.3f} (median of per-round ratios)')
        reg = regularizer_cost(runs[key][0], batch)
        print(f'  {key} regulariser alone (fwd+bwd) {reg * 1e3:.2f} ms = '
              f'{reg / base:.2%} of the MAE step, i.e. ratio bound '
              f'{1 + reg / base:.4f}')
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--cases', nargs='+', default=list(CASES), choices=list(CASES))
    parser.add_argument('--rounds', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=3)
    args = parser.parse_args()
    for name in args.cases:
        bench_case(name, args.rounds, args.warmup)


if __name__ == '__main__':
    main()
