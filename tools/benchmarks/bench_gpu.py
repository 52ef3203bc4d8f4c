"""ViT-B/16 M-MAE vs MAE pretraining steps on a GPU, and a 1-GPU launch.

Part 1 builds the ImageNet configs' models (``configs/mae_vit-base_200e.py``,
``configs/mmae_vit-base_200e.py``) with the configs' own optimizer wrapper
(``AmpOptimWrapper``, dynamic loss scale, merged parameter groups) and times
full ``train_step`` calls (uint8 images on the host -> preprocessor ->
forward -> backward -> AdamW) at the configs' per-GPU batch 128, alternating
the two models step by step. It reports images/s, peak GPU memory, the
M-MAE/MAE step-time ratio and the regulariser's share of the MAE step
(the TCR loss alone, forward + backward, on features of the encoder's
shape).

Part 2 launches ``tools/dist_train.sh`` with one process (NCCL on a GPU,
gloo on the CPU) for a few iterations of the Fashion-MNIST M-MAE config —
the one dataset at hand — and records whether it finished and its time per
iteration, i.e. it checks the distributed launch path end to end.

Everything is written to a JSON file. On a CPU-only machine
``--device cpu --iters 2`` runs the same code at batch 2 in fp32 (the
test-suite's smoke test)::

    python tools/benchmarks/bench_gpu.py --out work_dirs/bench_gpu.json
    python tools/benchmarks/bench_gpu.py --device cpu --iters 2
"""
import argparse
import copy
import glob
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = {
    'MAE': 'configs/mae_vit-base_200e.py',
    'M-MAE': 'configs/mmae_vit-base_200e.py',
}
DIST_CONFIG = 'configs/fashion_mnist/mmae_fmnist.py'


def parse_args() -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--batch', type=int, default=None,
                        help='per-GPU batch (default: the configs\' 128 on '
                        'cuda, 2 on cpu)')
    parser.add_argument('--iters', type=int, default=20,
                        help='timed steps per model')
    parser.add_argument('--warmup', type=int, default=None,
                        help='untimed steps per model (default 5 on cuda, '
                        '1 on cpu)')
    parser.add_argument('--no-amp', action='store_true',
                        help='fp32 on cuda (AMP is always off on cpu)')
    parser.add_argument('--dist-iters', type=int, default=None,
                        help='iterations of the dist_train.sh run (default '
                        '20 on cuda, 2 on cpu)')
    parser.add_argument('--skip-dist', action='store_true')
    parser.add_argument('--image-size', type=int, default=224)
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, default={},
        help='overrides of both ViT-B configs (the smoke test shrinks the '
        'model with them)')
    parser.add_argument('--out', default=None,
                        help='JSON output (default work_dirs/bench_gpu_'
                        '<device>.json)')
    args = parser.parse_args()
    cuda = args.device == 'cuda'
    if cuda and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is visible; use '
                     '--device cpu for the smoke run')
    args.batch = args.batch or (128 if cuda else 2)
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda
                                                                else 1)
    args.dist_iters = args.dist_iters or (20 if cuda else 2)
    args.amp = cuda and not args.no_amp
    args.out = args.out or osp.join(REPO, 'work_dirs',
                                    f'bench_gpu_{args.device}.json')
    return args


def build(config: str, device: str, amp: bool, cfg_options: dict):
    """Model and optimizer wrapper as the runner builds them."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(osp.join(REPO, config))
    cfg.merge_from_dict(cfg_options)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.to(device)
    model.train()
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    if not amp:
        optim_cfg.type = 'OptimWrapper'
        # AmpOptimWrapper's own arguments; OptimWrapper refuses them.
        for key in ('loss_scale', 'dtype'):
            optim_cfg.pop(key, None)
    return model, build_optim_wrapper(model, optim_cfg)


def sync(device: str) -> None:
    if device == 'cuda':
        torch.cuda.synchronize()


def regulariser_seconds(model, batch: int, device: str, reps: int) -> float:
    """Forward + backward of the regulariser alone on encoder-shaped
    features (float32, as the encoder's CLS token under AMP's autocast
    leaves it for a float64 loss)."""
    dim = model.backbone.embed_dims
    features = torch.randn(batch, dim, device=device, requires_grad=True)
    for _ in range(3):
        model.regularizer(features).backward()
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        model.regularizer(features).backward()
    sync(device)
    return (time.perf_counter() - start) / reps


def bench_steps(args) -> Dict:
    runs = {
        k: build(v, args.device, args.amp, args.cfg_options)
        for k, v in CONFIGS.items()
    }
    size = args.image_size
    images = torch.randint(0, 256, (args.batch, 3, size, size),
                           dtype=torch.uint8)
    if args.device == 'cuda':
        images = images.pin_memory()
    data = dict(inputs=images, data_samples=[])
    times: Dict[str, List[float]] = {k: [] for k in runs}
    peak: Dict[str, float] = {}
    for key, (model, wrapper) in runs.items():  # warm-up and peak memory
        if args.device == 'cuda':
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.warmup):
            model.train_step(data, wrapper)
        sync(args.device)
        if args.device == 'cuda':
            peak[key] = torch.cuda.max_memory_allocated() / 2**30
    for step in range(args.iters):
        for key, (model, wrapper) in runs.items():
            torch.manual_seed(step)  # same masks for both models
            sync(args.device)
            start = time.perf_counter()
            model.train_step(data, wrapper)
            sync(args.device)
            times[key].append(time.perf_counter() - start)
    result = dict(models={})
    for key, (model, wrapper) in runs.items():
        med = statistics.median(times[key])
        result['models'][key] = dict(
            config=CONFIGS[key],
            median_step_s=med,
            images_per_s=args.batch / med,
            peak_memory_gib=peak.get(key),
            param_groups=len(wrapper.optimizer.param_groups),
            optim_wrapper=type(wrapper).__name__)
    per_step = [m / b for m, b in zip(times['M-MAE'], times['MAE'])]
    result['mmae_over_mae_step_time'] = statistics.median(per_step)
    mmae_model = runs['M-MAE'][0]
    reg = regulariser_seconds(mmae_model, args.batch, args.device,
                              reps=max(5, args.iters))
    result['regulariser_s'] = reg
    result['regulariser_share_of_mae_step'] = \
        reg / result['models']['MAE']['median_step_s']
    del runs
    if args.device == 'cuda':
        torch.cuda.empty_cache()
    return result


def bench_dist(args) -> Dict:
    """tools/dist_train.sh CONFIG 1 for a few iterations."""
    work_dir = tempfile.mkdtemp(prefix='bench_gpu_dist_')
    batch = args.batch if args.device == 'cuda' else 2
    command = [
        'bash', osp.join(REPO, 'tools', 'dist_train.sh'), DIST_CONFIG, '1',
        '--work-dir', work_dir, '--cfg-options',
        f'train_dataloader.batch_size={batch}',
        f'train_dataloader.dataset.indices={batch * args.dist_iters}',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'train_cfg.max_epochs=1', 'default_hooks.checkpoint=None',
        'default_hooks.logger.interval=1'
    ]
    env = dict(os.environ, PYTHON=sys.executable,
               PORT=str(29500 + os.getpid() % 1000))
    if args.device == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    scalars = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    iter_times = []
    if scalars:
        for line in open(scalars[0]):
            entry = json.loads(line)
            if 'time' in entry:
                iter_times.append(entry['time'])
    log = proc.stdout + proc.stderr
    backend = 'nccl' if args.device == 'cuda' else 'gloo'
    return dict(
        command=' '.join(command[1:]),
        returncode=proc.returncode,
        finished=proc.returncode == 0 and len(iter_times) == args.dist_iters,
        backend=backend,
        iterations=len(iter_times),
        median_iter_s=statistics.median(iter_times) if iter_times else None,
        wall_s=wall,
        log_tail=log[-2000:] if proc.returncode else '')


def environment(args) -> Dict:
    info = dict(torch=torch.__version__, device=args.device,
                batch=args.batch, amp=args.amp, iters=args.iters,
                image_size=args.image_size, cfg_options=args.cfg_options,
                warmup=args.warmup, threads=torch.get_num_threads(),
                load_average=os.getloadavg()[0])
    if args.device == 'cuda':
        info['gpu'] = torch.cuda.get_device_name()
        info['cuda'] = torch.version.cuda
    return info


def main() -> None:
    args = parse_args()
    sys.path.insert(0, REPO)
    import mmae_plugin  # noqa: F401
    result = dict(environment=environment(args), steps=bench_steps(args))
    if not args.skip_dist:
        result['dist_train'] = bench_dist(args)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=2)
    steps = result['steps']
    for key, m in steps['models'].items():
        mem = f'{m["peak_memory_gib"]:.2f} GiB' \
            if m['peak_memory_gib'] is not None else 'n/a'
        print(f'{key:6s} {m["images_per_s"]:8.1f} images/s, median step '
              f'{m["median_step_s"] * 1e3:.1f} ms, peak memory {mem}, '
              f'{m["param_groups"]} param groups')
    print(f'M-MAE / MAE step time: {steps["mmae_over_mae_step_time"]:.3f}; '
          f'regulariser {steps["regulariser_s"] * 1e3:.2f} ms = '
          f'{steps["regulariser_share_of_mae_step"]:.2%} of the MAE step')
    if 'dist_train' in result:
        d = result['dist_train']
        print(f'dist_train.sh ({d["backend"]}, 1 process): finished='
              f'{d["finished"]}, {d["iterations"]} iterations, median '
              f'{d["median_iter_s"]} s/iter')
    print(f'written {args.out}')


if __name__ == '__main__':
    main()
