"""Training throughput of the MMEngine runner against a plain PyTorch loop.

For each Fashion-MNIST config (MAE, U-MAE, M-MAE) the same model, data and
batch are trained two ways, each round in a fresh process, alternating
runner / plain so drift of a shared machine affects both alike:

* **runner**: ``build_runner(config)`` and ``runner.train()``, i.e. what
  ``tools/train.py`` does, with the config's dataloader, data preprocessor,
  optimizer-wrapper constructor, param schedulers and hooks (only the
  checkpoint hook is off and the training set is cut to the iterations run);
* **plain**: a bare loop that indexes the in-memory uint8 images with a random
  permutation, flips half of the batch, normalises, calls the same
  ``model.loss`` and steps ``torch.optim.AdamW`` with the config's two weight
  decay groups (decay / no decay by the config's ``custom_keys``), in a
  process with the same glibc malloc policy as the runner's (the configs'
  ``GlibcMallocHook``; ``--glibc-defaults`` takes it out of both).

Each round also prints the minor page faults per timed iteration and the
peak resident memory of both processes.

An iteration's time is the interval between the starts of consecutive
iterations, so data loading, hooks and logging are all counted. The median
over the timed iterations of a round is that round's figure; the script
prints every round and the median of the per-round ratios runner / plain
(throughput ratio plain_time / runner_time is its inverse).

``--profile`` runs one extra round of each loop under ``torch.profiler`` with
labelled phases (data, preprocessing, forward, backward, optimizer, each
hook) and prints the per-iteration milliseconds of every phase side by side,
plus the CPU time the dataloader workers spent per iteration.

The ViT-B case times ``model.train_step`` with the optimizer wrapper the
ImageNet config builds against the plain step on the same random batch, in
one process, alternating (no ImageNet here: a runner iteration adds only the
per-iteration framework cost measured on the small configs).

Example::

    python dev/benchmarks/bench_throughput.py --rounds 3 --iters 30
    python dev/benchmarks/bench_throughput.py --cases M-MAE --profile
"""
import argparse
import copy
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FMNIST_CASES = {
    'MAE': 'configs/fashion_mnist/mae_fmnist.py',
    'U-MAE': 'configs/fashion_mnist/umae_fmnist.py',
    'M-MAE': 'configs/fashion_mnist/mmae_fmnist.py',
}
VIT_B_CONFIG = 'configs/mmae_vit-base_200e.py'
BASELINE = False  # set from --baseline
GLIBC_DEFAULTS = False  # set from --glibc-defaults
PHASES = ('data', 'preprocess', 'forward', 'parse_losses', 'backward',
          'optimizer.step', 'zero_grad')


# ---------------------------------------------------------------- helpers
def apply_baseline(cfg) -> None:
    """The settings before issue 9: per-sample RandomFlip + PackInputs in
    the worker, mmpretrain's SelfSupDataPreprocessor, one optimizer group per
    tensor (mmengine's default constructor)."""
    pre = cfg.data_preprocessor
    cfg.data_preprocessor = dict(
        type='SelfSupDataPreprocessor',
        mean=pre.mean,
        std=pre.std,
        to_rgb=False)
    cfg.train_dataloader.dataset.pipeline = [
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackInputs')
    ]
    cfg.optim_wrapper.constructor = 'DefaultOptimWrapperConstructor'


def load_config(path: str,
                cfg_options: Optional[List[str]] = None,
                baseline: bool = False,
                glibc_defaults: bool = False):
    from mmengine.config import Config, DictAction
    cfg = Config.fromfile(osp.join(REPO, path))
    if baseline:
        apply_baseline(cfg)
    if glibc_defaults:
        drop_glibc_malloc_hook(cfg)
    if cfg_options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--o', *cfg_options]).o)
    return cfg


def glibc_malloc_hook(cfg) -> Optional[dict]:
    """The config's ``GlibcMallocHook`` settings, or None without one."""
    for hook in cfg.get('custom_hooks', []):
        if hook.get('type') == 'GlibcMallocHook':
            return {k: v for k, v in hook.items() if k != 'type'}
    return None


def drop_glibc_malloc_hook(cfg) -> None:
    """Run with glibc's default malloc policy (``--glibc-defaults``)."""
    cfg.custom_hooks = [
        h for h in cfg.get('custom_hooks', [])
        if h.get('type') != 'GlibcMallocHook'
    ]


class FaultCounter:
    """Minor page faults of this process between ``start`` and ``stop``,
    and its peak resident memory."""

    def start(self) -> None:
        self.first = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def stop(self, iters: int) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return dict(
            faults=(usage.ru_minflt - self.first) / iters,
            max_rss_mib=usage.ru_maxrss / 1024)


def worker_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children (dataloader
    workers), read from /proc; 0 where /proc is unavailable."""
    total = 0.0
    tick = os.sysconf('SC_CLK_TCK')
    try:
        children = open(
            f'/proc/{os.getpid()}/task/{os.getpid()}/children').read().split()
    except OSError:
        return 0.0
    for pid in children:
        try:
            fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def no_decay_keys(cfg) -> List[str]:
    """Substrings of parameter names that get no weight decay (the config's
    ``custom_keys`` with ``decay_mult=0``)."""
    custom = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    return [k for k, v in custom.items() if v.get('decay_mult', 1.0) == 0]


def plain_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW with the config's hyperparameters and two decay groups."""
    opt_cfg = copy.deepcopy(cfg.optim_wrapper.optimizer)
    assert opt_cfg.pop('type') == 'AdamW', 'the plain loop implements AdamW'
    keys = no_decay_keys(cfg)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if any(k in name for k in keys) else decay).append(param)
    return torch.optim.AdamW(
        [dict(params=decay),
         dict(params=no_decay, weight_decay=0.0)], **opt_cfg)


def fmnist_images(cfg) -> torch.Tensor:
    """All training images of the config's dataset, uint8 (N, 1, 28, 28)."""
    from mmpretrain.registry import DATASETS
    ds_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    ds_cfg.pipeline = []
    ds_cfg.pop('indices', None)
    dataset = DATASETS.build(ds_cfg)
    import numpy as np
    images = np.stack(
        [dataset.get_data_info(i)['img'] for i in range(len(dataset))])
    return torch.from_numpy(images).unsqueeze(1)


class PhaseTimer:
    """Labels code ranges for torch.profiler (no-op cost when not
    profiling: ``record_function`` is cheap)."""

    @staticmethod
    def wrap(obj, attr: str, label: str) -> None:
        original = getattr(obj, attr)

        def wrapped(*args, **kwargs):
            with torch.profiler.record_function(label):
                return original(*args, **kwargs)

        setattr(obj, attr, wrapped)


def summarize_profile(prof, labels: List[str], iters: int) -> Dict[str, float]:
    """Per-iteration CPU milliseconds of each labelled range."""
    table = {e.key: e for e in prof.key_averages()}
    out = {}
    for label in labels:
        event = table.get(label)
        out[label] = (event.cpu_time_total / 1e3 / iters) if event else 0.0
    return out


# ---------------------------------------------------------------- plain
def run_plain(config: str,
              iters: int,
              warmup: int,
              profile: bool,
              cfg_options: Optional[List[str]] = None) -> dict:
    from mmpretrain.registry import MODELS

    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.engine.hooks.glibc_malloc_hook import \
        set_glibc_malloc_thresholds
    cfg = load_config(config, cfg_options, glibc_defaults=GLIBC_DEFAULTS)
    malloc_policy = glibc_malloc_hook(cfg)
    if malloc_policy is not None:  # the same process setup as the runner's
        set_glibc_malloc_thresholds(**malloc_policy)
    images = fmnist_images(cfg)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    optimizer = plain_optimizer(model, cfg)
    pre = cfg.data_preprocessor
    mean = torch.tensor(pre.mean).view(1, -1, 1, 1)
    std = torch.tensor(pre.std).view(1, -1, 1, 1)
    batch = cfg.train_dataloader.batch_size
    perm = torch.randperm(len(images))
    total = warmup + iters + 1
    assert total * batch <= len(images)
    stamps, phases = [], {}
    prof = None
    faults = FaultCounter()
    for it in range(total):
        if profile and it == warmup:
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        if it == warmup:
            faults.start()
        stamps.append(time.perf_counter())
        if it == total - 1:
            memory = faults.stop(iters)
            break
        rf = torch.profiler.record_function
        with rf('data'):
            x = images[perm[it * batch:(it + 1) * batch]]
            flip = torch.rand(batch) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        with rf('preprocess'):
            x = (x.float() - mean) / std
        with rf('forward'):
            losses = model.loss(x, [])
        with rf('parse_losses'):
            loss = sum(losses.values())
        with rf('backward'):
            loss.backward()
        with rf('optimizer.step'):
            optimizer.step()
        with rf('zero_grad'):
            optimizer.zero_grad(set_to_none=True)
    if prof is not None:
        prof.__exit__(None, None, None)
        phases = summarize_profile(prof, list(PHASES), iters)
    times = [b - a for a, b in zip(stamps[warmup:-1], stamps[warmup + 1:])]
    return dict(
        times=times,
        phases=phases,
        worker_cpu=0.0,
        groups=len(optimizer.param_groups),
        **memory)


# ---------------------------------------------------------------- runner
def instrument_runner(runner, labels: List[str]) -> None:
    """Label the runner's phases and every hook's iteration methods."""
    from mmengine.hooks import Hook
    model = runner.model
    pre = model.data_preprocessor
    PhaseTimer.wrap(pre, 'forward', 'preprocess')
    PhaseTimer.wrap(model, 'loss', 'forward')
    PhaseTimer.wrap(model, 'parse_losses', 'parse_losses')
    wrapper = runner.optim_wrapper
    PhaseTimer.wrap(wrapper, 'backward', 'backward')
    PhaseTimer.wrap(wrapper, 'step', 'optimizer.step')
    PhaseTimer.wrap(wrapper, 'zero_grad', 'zero_grad')
    for hook in runner.hooks:
        for fn in ('before_train_iter', 'after_train_iter'):
            if getattr(type(hook), fn) is getattr(Hook, fn):
                continue  # not overridden: the base method does nothing
            label = f'hook {type(hook).__name__}.{fn}'
            PhaseTimer.wrap(hook, fn, label)
            labels.append(label)


def run_runner(config: str,
               iters: int,
               warmup: int,
               profile: bool,
               cfg_options: Optional[List[str]] = None) -> dict:
    from mmengine.hooks import Hook

    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.engine.runners.build import build_runner
    cfg = load_config(config, cfg_options, BASELINE, GLIBC_DEFAULTS)
    total = warmup + iters + 1
    cfg.work_dir = tempfile.mkdtemp(prefix='bench_throughput_')
    cfg.train_dataloader.dataset.indices = total * \
        cfg.train_dataloader.batch_size
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.checkpoint = None
    cfg.log_level = 'WARNING'
    runner = build_runner(cfg)
    stamps: List[float] = []
    state = dict(prof=None, cpu0=0.0, cpu1=0.0, memory={})
    faults = FaultCounter()

    class StampHook(Hook):
        priority = 'HIGHEST'

        def before_train(self, runner):
            if profile:  # the optimizer wrapper exists from here on
                instrument_runner(runner, labels)

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if profile and batch_idx == warmup:
                state['prof'] = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU])
                state['prof'].__enter__()
            if batch_idx == warmup:
                state['cpu0'] = worker_cpu_seconds()
                faults.start()
            stamps.append(time.perf_counter())
            if batch_idx == warmup + iters:  # the timed iterations are over
                self.stop()

        def after_train_epoch(self, runner):
            stamps.append(time.perf_counter())

        @staticmethod
        def stop():
            state['cpu1'] = worker_cpu_seconds()
            state['memory'] = faults.stop(iters)
            if state['prof'] is not None:
                state['prof'].__exit__(None, None, None)

    loader_labels = [
        f'enumerate(DataLoader)#_{kind}DataLoaderIter.__next__'
        for kind in ('MultiProcessing', 'SingleProcess')
    ]  # torch's own profiler labels of the dataloader
    labels = list(PHASES)
    runner.register_hook(StampHook())
    runner.train()
    phases = {}
    if state['prof'] is not None:
        phases = summarize_profile(state['prof'], labels + loader_labels,
                                   iters)
        phases['data'] = sum(phases.pop(k) for k in loader_labels)
    times = [b - a for a, b in zip(stamps[warmup:-1], stamps[warmup + 1:])]
    # the last stamp is after_train_epoch: drop the unfinished interval
    times = times[:iters]
    groups = len(runner.optim_wrapper.optimizer.param_groups)
    return dict(
        times=times,
        phases=phases,
        worker_cpu=(state['cpu1'] - state['cpu0']) / iters,
        groups=groups,
        **state['memory'])


# ---------------------------------------------------------------- driver
def single(args) -> None:
    fn = run_runner if args.single == 'runner' else run_plain
    result = fn(args.config, args.iters, args.warmup, args.profile,
                args.cfg_options)
    print('SINGLE_RUN ' + json.dumps(result))


def fresh_process(mode: str, config: str, args) -> dict:
    command = [
        sys.executable,
        osp.abspath(__file__), '--single', mode, '--config', config, '--iters',
        str(args.iters), '--warmup',
        str(args.warmup)
    ]
    if args.profile_round:
        command.append('--profile')
    if args.baseline:
        command.append('--baseline')
    if args.glibc_defaults:
        command.append('--glibc-defaults')
    if args.cfg_options:
        command += ['--cfg-options', *args.cfg_options]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f'{mode} run of {config} failed:\n'
                           f'{proc.stderr[-4000:]}')
    line = [
        x for x in proc.stdout.splitlines() if x.startswith('SINGLE_RUN ')
    ][-1]
    return json.loads(line[len('SINGLE_RUN '):])


def print_phases(runner: dict, plain: dict, runner_med: float,
                 plain_med: float) -> None:
    names = list(PHASES) + sorted(k
                                  for k in runner['phases'] if k not in PHASES)
    print(f'    {"phase (CPU ms / iteration, profiled)":44s} {"runner":>8s} '
          f'{"plain":>8s} {"gap":>8s}')
    rsum = psum = 0.0
    for name in names:
        r = runner['phases'].get(name, 0.0)
        p = plain['phases'].get(name, 0.0)
        if name.startswith('hook'):
            rsum += r
        elif name in PHASES:
            rsum += r
            psum += p
        print(f'    {name:44s} {r:8.2f} {p:8.2f} {r - p:8.2f}')
    r_rest = statistics.median(runner['times']) * 1e3 - rsum
    p_rest = statistics.median(plain['times']) * 1e3 - psum
    print(f'    {"unlabelled (loop, message hub, logging)":44s} {r_rest:8.2f} '
          f'{p_rest:8.2f} {r_rest - p_rest:8.2f}')
    print(f'    {"iteration (median wall, profiled round)":44s} '
          f'{statistics.median(runner["times"]) * 1e3:8.2f} '
          f'{statistics.median(plain["times"]) * 1e3:8.2f}')
    print(f'    dataloader worker CPU per iteration: '
          f'{runner["worker_cpu"] * 1e3:.1f} ms (competes with the 2 cores)')


def bench_fmnist(name: str, args) -> float:
    config = FMNIST_CASES[name]
    rounds = dict(runner=[], plain=[])
    for _ in range(args.rounds):
        for mode in ('runner', 'plain'):
            rounds[mode].append(fresh_process(mode, config, args))
    runner_t, plain_t = ([
        statistics.median(result['times']) for result in rounds[mode]
    ] for mode in ('runner', 'plain'))
    ratio = statistics.median(p / r for r, p in zip(runner_t, plain_t))
    print(f'\n{name} ({config}), batch 256, {args.iters} timed iterations '
          f'after {args.warmup} per round, {args.rounds} alternating rounds')
    print('  runner s/iter: ' + ', '.join(f'{t:.4f}' for t in runner_t))
    print('  plain  s/iter: ' + ', '.join(f'{t:.4f}' for t in plain_t))
    for mode in ('runner', 'plain'):
        print(f'  {mode:6s} minor page faults/iter: ' +
              ', '.join(f'{m["faults"]:.0f}' for m in rounds[mode]) +
              '; peak RSS MiB: ' + ', '.join(f'{m["max_rss_mib"]:.0f}'
                                             for m in rounds[mode]))
    print(f'  throughput runner/plain (plain time / runner time, median of '
          f'rounds) = {ratio:.3f}')
    if args.profile:
        args.profile_round = True
        runner = fresh_process('runner', config, args)
        plain = fresh_process('plain', config, args)
        args.profile_round = False
        print(f'  profiled round (torch.profiler, labelled ranges); '
              f'optimizer param groups: runner {runner["groups"]}, plain '
              f'{plain["groups"]}')
        print_phases(runner, plain, 0, 0)
    return ratio


def bench_vit_b(args) -> float:
    """train_step with the config's wrapper vs a plain step, ViT-B/16."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    import mmae_plugin.registration  # noqa: F401
    init_default_scope('mmpretrain')  # the config names plugin components
    cfg = load_config(VIT_B_CONFIG)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    plain_model = copy.deepcopy(model)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.type = 'OptimWrapper'  # fp32 on the CPU
    optim_cfg.pop('loss_scale', None)
    wrapper = build_optim_wrapper(model, optim_cfg)
    optimizer = plain_optimizer(plain_model, cfg)
    pre = cfg.model.get('data_preprocessor') or cfg.data_preprocessor
    mean = torch.tensor(pre.mean).view(1, -1, 1, 1)
    std = torch.tensor(pre.std).view(1, -1, 1, 1)
    images = torch.randint(
        0, 256, (args.vit_batch, 3, 224, 224), dtype=torch.uint8)
    data = dict(inputs=images, data_samples=[])

    def runner_step():
        model.train_step(data, wrapper)

    def plain_step():
        x = (images.float() - mean) / std
        loss = sum(plain_model.loss(x, []).values())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = {'runner': [], 'plain': []}
    for i in range(args.vit_warmup + args.vit_iters):
        for key, step in (('runner', runner_step), ('plain', plain_step)):
            torch.manual_seed(i)
            start = time.perf_counter()
            step()
            if i >= args.vit_warmup:
                times[key].append(time.perf_counter() - start)
    ratios = [p / r for r, p in zip(times['runner'], times['plain'])]
    ratio = statistics.median(ratios)
    print(f'\nViT-B/16 M-MAE ({VIT_B_CONFIG}), batch {args.vit_batch}, '
          f'{args.vit_iters} alternating steps, fp32 CPU; optimizer groups '
          f'{len(wrapper.optimizer.param_groups)} (plain 2)')
    print('  train_step s: ' + ', '.join(f'{t:.3f}' for t in times['runner']))
    print('  plain step s: ' + ', '.join(f'{t:.3f}' for t in times['plain']))
    print(f'  throughput runner/plain = {ratio:.3f}')
    return ratio


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--cases',
        nargs='+',
        default=list(FMNIST_CASES) + ['ViT-B'],
        choices=list(FMNIST_CASES) + ['ViT-B'])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument(
        '--profile',
        action='store_true',
        help='add one profiled round per case')
    parser.add_argument('--vit-batch', type=int, default=8)
    parser.add_argument('--vit-iters', type=int, default=3)
    parser.add_argument('--vit-warmup', type=int, default=1)
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=None,
        help='overrides applied to the Fashion-MNIST configs '
        '(both loops), e.g. to reproduce an older setup')
    parser.add_argument(
        '--baseline',
        action='store_true',
        help='runner with the settings before issue 9 (per-sample flip, '
        'SelfSupDataPreprocessor, one optimizer group per tensor)')
    parser.add_argument(
        '--glibc-defaults',
        action='store_true',
        help="both loops with glibc's default malloc policy (without the "
        "configs' GlibcMallocHook)")
    parser.add_argument(
        '--single', choices=['runner', 'plain'], help=argparse.SUPPRESS)
    parser.add_argument('--config', help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.profile_round = False
    return args


def main() -> None:
    args = parse_args()
    global BASELINE, GLIBC_DEFAULTS
    BASELINE = args.baseline
    GLIBC_DEFAULTS = args.glibc_defaults
    if args.single:
        single(args)
        return
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, '
          f'load average {os.getloadavg()[0]:.2f}')
    results = {}
    for name in args.cases:
        results[name] = bench_vit_b(args) if name == 'ViT-B' else \
            bench_fmnist(name, args)
    print('\nsummary (throughput runner/plain): ' +
          ', '.join(f'{k} {v:.3f}' for k, v in results.items()))


if __name__ == '__main__':
    main()
