"""Dispatched aten ops and CPU time of the M-MAE regulariser's step.

One forward + backward of ``TCRLoss`` with the ViT-B recipe's settings
(``configs/mmae_vit-base_200e.py``: reference form, mu 1, no centering,
weight 0.01 / 8) on float32 features of the gathered size (1024 x 768 by
default; the arithmetic runs in float64 inside), in one process (no other
rank: the gather passes the rows through). Every op that reaches torch's
dispatcher is counted with a ``TorchDispatchMode``; each costs a few
microseconds of host time on a GPU whatever its size, which is what the
count measures. The CPU time of the same call (median of ``--reps``, one
thread) is the float64 arithmetic itself, about 2.6 GFLOP at 1024 x 768::

    python dev/benchmarks/regulariser_ops.py
    python dev/benchmarks/regulariser_ops.py --rows 1024 --dim 768 \\
        --json out.json
"""
import argparse
import collections
import json
import os.path as osp
import statistics
import sys
import time
import traceback
from typing import Dict, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: The regulariser of configs/mmae_vit-base_200e.py.
RECIPE = dict(
    type='TCRLoss',
    mu=1.0,
    form='reference',
    centering=False,
    gather='global',
    loss_weight=0.01 / 8)


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched, by name and by the plugin file (and
    line) that called it; ops the autograd engine runs between the plugin's
    backward functions are filed under ``autograd``."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()
        self.by_source: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_op[str(func)] += 1
        self.by_source[_plugin_caller()] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


def _plugin_caller() -> str:
    """``file.py:line`` of the innermost plugin frame, else ``autograd``."""
    for frame in reversed(traceback.extract_stack(limit=16)):
        if f'{osp.sep}mmae_plugin{osp.sep}' in frame.filename:
            return f'{osp.basename(frame.filename)}:{frame.lineno}'
    return 'autograd'


def build_regulariser(settings: Dict):
    """The regulariser of ``settings`` from mmpretrain's registry."""
    sys.path.insert(0, REPO)
    from mmpretrain.registry import MODELS

    import mmae_plugin.registration  # noqa: F401
    return MODELS.build(dict(settings))


def features(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    """Random float32 features (the encoder's output under AMP)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator).requires_grad_()


def count_ops(regulariser, z: torch.Tensor) -> Dict:
    """Ops of one forward and of its backward, by op and by source."""
    forward, backward = OpCounter(), OpCounter()
    with forward:
        loss = regulariser(z)
    with backward:
        loss.backward()
    z.grad = None
    return dict(
        forward=forward.total,
        backward=backward.total,
        total=forward.total + backward.total,
        forward_ops=dict(forward.by_op.most_common()),
        backward_ops=dict(backward.by_op.most_common()),
        forward_sources=dict(forward.by_source.most_common()),
        backward_sources=dict(backward.by_source.most_common()),
        skip_code=float(regulariser.skip_code))


def cpu_times(regulariser, z: torch.Tensor, reps: int) -> List[float]:
    """CPU seconds of forward + backward, ``reps`` times after one."""
    regulariser(z).backward()
    times = []
    for _ in range(reps):
        z.grad = None
        start = time.process_time()
        regulariser(z).backward()
        times.append(time.process_time() - start)
    return times


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """Count, time and print; optionally write JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', type=int, default=1024)
    parser.add_argument('--dim', type=int, default=768)
    parser.add_argument('--reps', type=int, default=10)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--json', default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    regulariser = build_regulariser(RECIPE)
    z = features(args.rows, args.dim)
    ops = count_ops(regulariser, z)
    times = cpu_times(regulariser, z, args.reps)
    result = dict(
        settings=RECIPE,
        rows=args.rows,
        dim=args.dim,
        threads=args.threads,
        ops=ops,
        cpu_ms=dict(
            median=statistics.median(times) * 1e3,
            min=min(times) * 1e3,
            max=max(times) * 1e3,
            reps=args.reps))
    print(f'TCRLoss {args.rows} x {args.dim} (float32 in, float64 inside), '
          f'forward + backward: {ops["total"]} aten ops ({ops["forward"]} '
          f'forward, {ops["backward"]} backward); CPU '
          f'{result["cpu_ms"]["median"]:.1f} ms median of {args.reps} '
          f'({result["cpu_ms"]["min"]:.1f}-{result["cpu_ms"]["max"]:.1f}), '
          f'{args.threads} thread(s)')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    main()
