"""Benchmark mmae_plugin.matrix_info and the MatrixInfoHook overhead.

Part 1 times every toolbox function (float64, the toolbox default) at
d = B = 1024 against two direct scipy implementations: the definition
(``scipy.linalg.logm`` / matrix powers, from ``tests/scipy_matrix_info_
reference.py``) and the obvious fast one (``scipy.linalg.eigvalsh``). It
prints times, ratios ``scipy / torch`` side by side and the largest
difference of the values; then ``matrix_joint_entropy`` against one
``eigvalsh`` (torch's and scipy's) of the same size, its cost floor.

Part 2 trains a Fashion-MNIST config for the same number of iterations with
and without ``MatrixInfoHook`` at its default interval (alternating, each run
in a fresh process), and prints the wall-clock ratio of the medians and the
hook's own share of the training time (measured around its
``after_train_iter``; the wall-clock ratio is noisy on a shared machine, the
share is not).

Example::

    python dev/benchmarks/bench_matrix_info.py --size 1024 --iters 100
"""
import argparse
import importlib.util
import math
import os
import os.path as osp
import tempfile
import time
from typing import Callable, Dict, Tuple

# Single-threaded BLAS/LAPACK by default: ratios are then reproducible, and
# on an oversubscribed machine multi-threaded LAPACK eigensolvers can stall
# for a second at OpenMP barriers. Export OMP_NUM_THREADS to override.
for _var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ.setdefault(_var, '1')

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402
import torch  # noqa: E402
from scipy.spatial.distance import jensenshannon  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Benchmark the matrix-information toolbox and hook')
    parser.add_argument(
        '--size', type=int, default=1024, help='d = B of the random inputs')
    parser.add_argument(
        '--repeats',
        type=int,
        default=3,
        help='timed repetitions (best is kept)')
    parser.add_argument(
        '--threads',
        type=int,
        default=1,
        help='torch intra-op threads (BLAS threads follow '
        'OMP_NUM_THREADS, default 1)')
    parser.add_argument(
        '--config',
        default=None,
        help='training config for the overhead run (default: '
        'configs/fashion_mnist/mmae_fmnist.py, else simclr_fmnist.py)')
    parser.add_argument(
        '--iters',
        type=int,
        default=100,
        help='training iterations per overhead run')
    parser.add_argument(
        '--interval',
        type=int,
        default=50,
        help='MatrixInfoHook interval in the overhead run')
    parser.add_argument(
        '--trials',
        type=int,
        default=2,
        help='alternating hook-off/hook-on training runs')
    parser.add_argument(
        '--single-run', choices=['on', 'off'],
        help=argparse.SUPPRESS)  # internal: one timed run
    parser.add_argument('--skip-functions', action='store_true')
    parser.add_argument('--skip-hook', action='store_true')
    return parser.parse_args()


def load_reference():
    """The float64 scipy reference module of the test-suite."""
    path = osp.join(REPO, 'tests', 'scipy_matrix_info_reference.py')
    spec = importlib.util.spec_from_file_location('scipy_reference', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_time(fn: Callable[[], object], repeats: int) -> Tuple[float, object]:
    """Best wall time of ``repeats`` calls and the last result."""
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


# Direct eigvalsh-based scipy versions (the fast textbook implementation).
def _p(K: np.ndarray) -> np.ndarray:
    vals = np.clip(scipy.linalg.eigvalsh(K, check_finite=False), 0, None)
    return vals / vals.sum()


def _renyi_p(p: np.ndarray, alpha: float) -> float:
    p = p[p > 0]
    if alpha == 1:
        return float(-(p * np.log(p)).sum())
    return float(np.log((p**alpha).sum()) / (1 - alpha))


def eig_entropy(K, alpha=1.0):
    return _renyi_p(_p(K), alpha)


def eig_joint(K1, K2):
    return eig_entropy(K1 * K2)


def eig_mutual(K1, K2):
    return eig_entropy(K1) + eig_entropy(K2) - eig_entropy(K1 * K2)


def eig_js(K1, K2):
    mix = (K1 / np.trace(K1) + K2 / np.trace(K2)) / 2
    return eig_entropy(mix) - (eig_entropy(K1) + eig_entropy(K2)) / 2


def eig_spectrum_js(K1, K2):
    return float(jensenshannon(_p(K1)[::-1], _p(K2)[::-1])**2)


def function_cases(ref, z1: torch.Tensor, z2: torch.Tensor) -> Dict:
    """name -> (torch call, definition call, eigvalsh call or None)."""
    import mmae_plugin.matrix_info as mi
    k1, k2 = mi.normalized_covariance(z1), mi.normalized_covariance(z2)
    a1, a2 = k1.numpy(), k2.numpy()
    zn1 = z1.numpy()
    return {
        'normalized_covariance':
        (lambda: mi.normalized_covariance(z1),
         lambda: ref.normalized_covariance(zn1), None),
        'normalized_gram': (lambda: mi.normalized_gram(z1),
                            lambda: ref.normalized_gram(zn1), None),
        'matrix_entropy(a=1)':
        (lambda: mi.matrix_entropy(k1), lambda: ref.renyi(a1, 1),
         lambda: eig_entropy(a1, 1.0)),
        'matrix_entropy(a=2)':
        (lambda: mi.matrix_entropy(k1, 2), lambda: ref.renyi(a1, 2),
         lambda: eig_entropy(a1, 2.0)),
        'matrix_joint_entropy':
        (lambda: mi.matrix_joint_entropy(k1, k2), lambda: ref.joint(a1, a2, 1),
         lambda: eig_joint(a1, a2)),
        'matrix_mutual_information':
        (lambda: mi.matrix_mutual_information(k1, k2),
         lambda: ref.mutual(a1, a2, 1), lambda: eig_mutual(a1, a2)),
        'matrix_kl_divergence': (lambda: mi.matrix_kl_divergence(k1, k2, 1e-8),
                                 lambda: ref.kl(a1, a2, 1e-8), None),
        'matrix_js_divergence': (lambda: mi.matrix_js_divergence(k1, k2),
                                 lambda: ref.js(a1, a2),
                                 lambda: eig_js(a1, a2)),
        'spectrum_js_divergence': (lambda: mi.spectrum_js_divergence(k1, k2),
                                   lambda: ref.spectrum_js(a1, a2),
                                   lambda: eig_spectrum_js(a1, a2)),
        'total_coding_rate': (lambda: mi.total_coding_rate(z1),
                              lambda: ref.tcr(zn1, 1.0), None),
        'effective_rank': (lambda: mi.effective_rank(z1),
                           lambda: ref.effective_rank(zn1), None),
        'rankme': (lambda: mi.rankme(z1), lambda: ref.rankme(zn1, 1e-7), None),
    }


def value_of(result) -> np.ndarray:
    if isinstance(result, torch.Tensor):
        return result.detach().numpy()
    return np.asarray(result)


def bench_functions(size: int, repeats: int) -> None:
    ref = load_reference()
    gen = torch.Generator().manual_seed(0)
    mixing = torch.eye(
        size, dtype=torch.float64) + 0.05 * torch.randn(
            size, size, generator=gen, dtype=torch.float64)
    z1 = torch.randn(size, size, generator=gen, dtype=torch.float64) @ mixing
    z2 = z1 + 0.5 * torch.randn(size, size, generator=gen, dtype=torch.float64)
    print(f'\n== matrix_info vs scipy, d = B = {size}, float64, best of '
          f'{repeats} ==')
    header = (f'{"function":28s} {"torch s":>9s} {"scipy-def s":>11s} '
              f'{"def/torch":>9s} {"scipy-eig s":>11s} {"eig/torch":>9s} '
              f'{"max |diff|":>10s}')
    print(header)
    print('-' * len(header))
    for name, (ours, definition, eig) in function_cases(ref, z1, z2).items():
        t_ours, v_ours = best_time(ours, repeats)
        t_def, v_def = best_time(definition, 1 if size > 256 else repeats)
        diff = float(np.max(np.abs(value_of(v_ours) - value_of(v_def))))
        if eig is not None:
            t_eig, _ = best_time(eig, repeats)
            eig_cols = f'{t_eig:11.4f} {t_eig / t_ours:9.2f}'
        else:
            eig_cols = f'{"-":>11s} {"-":>9s}'
        print(f'{name:28s} {t_ours:9.4f} {t_def:11.4f} '
              f'{t_def / t_ours:9.2f} {eig_cols} {diff:10.2e}')


def bench_joint_entropy_cost(size: int, repeats: int) -> None:
    """``matrix_joint_entropy`` over one float64 ``eigvalsh`` of its size.

    The floor of any exact joint entropy is one symmetric eigendecomposition
    of the n x n Hadamard product; what the toolbox adds on top is the
    validation of its two inputs (finiteness and symmetry in two reductions
    each, definiteness by a Cholesky factorisation each) and the product.
    Timed alternately, best of ``repeats`` rounds, against torch's and
    scipy's ``eigvalsh`` of that product.
    """
    import mmae_plugin.matrix_info as mi
    from mmae_plugin.matrix_info.spectrum import (check_psd_by_cholesky,
                                                  dense_symmetric)
    gen = torch.Generator().manual_seed(1)
    z1, z2 = (
        torch.randn(size, size // 4, generator=gen, dtype=torch.float64)
        for _ in range(2))
    k1, k2 = mi.normalized_gram(z1), mi.normalized_gram(z2)
    f1, f2 = (mi.normalized_gram(z, factored=True) for z in (z1, z2))
    product = k1 * k2
    calls = {
        'matrix_joint_entropy':
        lambda: mi.matrix_joint_entropy(k1, k2),
        # Factors are PSD by construction: no definiteness check to pay.
        'joint_entropy(factored)':
        lambda: mi.matrix_joint_entropy(f1, f2),
        'torch eigvalsh':
        lambda: torch.linalg.eigvalsh(product),
        'scipy eigvalsh':
        lambda: scipy.linalg.eigvalsh(product.numpy(), check_finite=False),
        'input checks (2x)':
        lambda: [
            check_psd_by_cholesky(dense_symmetric(k, 'K'), 'K', k.dtype)
            for k in (k1, k2)
        ],
    }
    best = {name: math.inf for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            best[name] = min(best[name], best_time(call, 1)[0])
    print(f'\n== matrix_joint_entropy vs one eigvalsh, n = {size}, float64, '
          f'{torch.get_num_threads()} thread(s), best of {repeats} ==')
    for name, seconds in best.items():
        print(f'{name:24s} {seconds:8.4f} s   this / torch eigvalsh '
              f'{seconds / best["torch eigvalsh"]:5.2f}   this / scipy '
              f'eigvalsh {seconds / best["scipy eigvalsh"]:5.2f}')


def overhead_config() -> str:
    mmae = osp.join(REPO, 'configs', 'fashion_mnist', 'mmae_fmnist.py')
    if osp.exists(mmae):
        return mmae
    return osp.join(REPO, 'configs', 'fashion_mnist', 'simclr_fmnist.py')


def timed_run(config: str, iters: int, interval: int,
              with_hook: bool) -> Tuple[float, float, int]:
    """Train ``iters`` iterations; return (train s, hook s, hook samples)."""
    from mmengine.config import Config

    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
    from mmae_plugin.engine.runners.build import build_runner

    cfg = Config.fromfile(config)
    cfg.work_dir = tempfile.mkdtemp(prefix='bench_minfo_')
    cfg.train_dataloader.dataset.indices = \
        iters * cfg.train_dataloader.batch_size
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=interval)
    others = [
        h for h in cfg.get('custom_hooks', []) if h['type'] != 'MatrixInfoHook'
    ]
    cfg.custom_hooks = others + (
        [dict(type='MatrixInfoHook', interval=interval)] if with_hook else [])
    runner = build_runner(cfg)
    spent = [0.0, 0]
    for hook in runner.hooks:
        if isinstance(hook, MatrixInfoHook):
            original = hook.after_train_iter

            def timed(*args, _original=original, _hook=hook, **kwargs):
                armed = _hook.taps.armed
                start = time.perf_counter()
                _original(*args, **kwargs)
                spent[0] += time.perf_counter() - start
                spent[1] += int(armed)

            hook.after_train_iter = timed
    start = time.perf_counter()
    runner.train()
    return time.perf_counter() - start, spent[0], spent[1]


def run_in_fresh_process(config: str, iters: int, interval: int,
                         with_hook: bool) -> Tuple[float, float, int]:
    """:func:`timed_run` in a new interpreter.

    Runners in one process slow each other down (the persistent dataloader
    workers of a finished run stay alive), so each measurement gets its own
    process.
    """
    import json
    import subprocess
    import sys
    command = [
        sys.executable,
        osp.abspath(__file__), '--skip-functions', '--config', config,
        '--iters',
        str(iters), '--interval',
        str(interval), '--single-run', 'on' if with_hook else 'off'
    ]
    output = subprocess.run(
        command, capture_output=True, text=True, check=True).stdout
    marker = [
        line for line in output.splitlines() if line.startswith('SINGLE_RUN ')
    ][-1]
    return tuple(json.loads(marker[len('SINGLE_RUN '):]))


def bench_hook(config: str, iters: int, interval: int, trials: int) -> None:
    print(f'\n== MatrixInfoHook overhead: {osp.relpath(config, REPO)}, '
          f'{iters} iterations, interval {interval}, {trials} alternating '
          f'trials, one process each ==')
    off_times, on_times, hook_times, samples = [], [], [], 0
    for _ in range(trials):
        off_times.append(
            run_in_fresh_process(config, iters, interval, False)[0])
        on, hook_time, count = run_in_fresh_process(config, iters, interval,
                                                    True)
        on_times.append(on)
        hook_times.append(hook_time)
        samples += count
    off, on = float(np.median(off_times)), float(np.median(on_times))
    hook_time = sum(hook_times)
    print('train time without hook: ' +
          ', '.join(f'{t:.2f}' for t in off_times) + f' s (median {off:.2f})')
    print('train time with hook:    ' +
          ', '.join(f'{t:.2f}' for t in on_times) + f' s (median {on:.2f})')
    print(f'wall-clock ratio with/without: {on / off:.4f}')
    print(f'hook compute: {hook_time:.3f} s over {samples} samples '
          f'({hook_time / max(samples, 1) * 1e3:.1f} ms each) = '
          f'{100 * hook_time / sum(on_times):.3f} % of training time')


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_functions and not args.single_run:
        bench_functions(args.size, args.repeats)
        bench_joint_entropy_cost(args.size, max(args.repeats, 5))
    config = args.config or overhead_config()
    if args.single_run:
        import json
        result = timed_run(config, args.iters, args.interval,
                           args.single_run == 'on')
        print('SINGLE_RUN ' + json.dumps(result))
    elif not args.skip_hook:
        bench_hook(config, args.iters, args.interval, args.trials)


if __name__ == '__main__':
    main()
