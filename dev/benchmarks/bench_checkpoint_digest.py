"""Cost of the run record's SHA-256 at save and at resume (issue 44, I6).

A ViT-B-sized state with AdamW's two moments (random float32 tensors, 86M
parameters: ~1.03 GB, what a ViT-B MAE checkpoint holds) is written to a
temporary folder on disk and read back, each way side by side in
interleaved rounds, so drift of the machine affects all alike:

Save (goal: ``plugin`` <= 1.05 x ``mmengine``, the checkpoint hook it
replaces):

* ``torch.save``: ``torch.save(state, path)``, nothing else;
* ``mmengine``: mmengine's ``save_checkpoint`` (what its
  ``CheckpointHook`` runs: ``torch.save`` into memory, then the bytes
  into the file);
* ``torch.save+fsync``: the first plus the fsync an atomic save needs;
* ``read-back``: the plugin before issue 44: mmengine's ``save_checkpoint``
  to the partial name, fsync and rename, then the file read back and
  hashed for the record;
* ``sha256 alone``: hashing the file (in the page cache), nothing else:
  the CPU cost that the plugin's helper thread hides if a core is idle;
* ``plugin``: ``SafeCheckpointHook.save_atomically`` (partial name,
  mmengine's save through the hook's ``DigestingLocalBackend``, whose
  ``put`` hashes the bytes while writing them, fsync, rename) and the
  record line.

Load (goal: ``verified`` <= 1.1 x ``torch.load``):

* ``torch.load``: ``torch.load(path, weights_only=True)``;
* ``verify+load``: the record's check (read and hash the file), then the
  load, one after the other (what resume does in ``resume_gate.py``);
* ``verified``: :func:`~mmae_plugin.checkpoint.loading.load_verified`, the
  check in a thread while the file loads;
* ``sha256 alone``: hashing the file, nothing else (the floor of any
  verification by SHA-256).

Loads run with the file in the page cache (``warm``) and evicted before
each (``cold``: fsync, then ``posix_fadvise(DONTNEED)`` on the file only;
no root, other files' pages stay). Per variant the median wall time and
process CPU time (all threads) are printed, and the median of the
per-round ratios to the baseline. On a shared machine, where the hash
thread finds no idle core, compare the CPU columns too::

    python dev/benchmarks/bench_checkpoint_digest.py --repeats 5
    python dev/benchmarks/bench_checkpoint_digest.py --scale 0.05 \\
        --repeats 1  # smoke
"""
import argparse
import os
import os.path as osp
import shutil
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.fileio.backends import LocalBackend
from mmengine.runner.checkpoint import save_checkpoint

import mmae_plugin.registration  # noqa: F401 (the load allow-list)
from mmae_plugin.checkpoint import run_record
from mmae_plugin.checkpoint.loading import load_verified, verify_before_loading
from mmae_plugin.checkpoint.publish import publish_checkpoint
from mmae_plugin.checkpoint.run_record import (append_event, file_sha256,
                                               fingerprint)
from mmae_plugin.engine.hooks import SafeCheckpointHook

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: Shapes of ViT-B/16's parameters (86M); one block's repeated 12 times.
STEM = [('patch_embed.weight', (768, 3, 16, 16)),
        ('patch_embed.bias', (768, )), ('cls_token', (1, 1, 768)),
        ('pos_embed', (1, 197, 768))]
BLOCK = [('ln1.weight', (768, )), ('ln1.bias', (768, )),
         ('attn.qkv.weight', (2304, 768)), ('attn.qkv.bias', (2304, )),
         ('attn.proj.weight', (768, 768)), ('attn.proj.bias', (768, )),
         ('ln2.weight', (768, )), ('ln2.bias', (768, )),
         ('ffn.fc1.weight', (3072, 768)), ('ffn.fc1.bias', (3072, )),
         ('ffn.fc2.weight', (768, 3072)), ('ffn.fc2.bias', (768, ))]


def vit_b_state(scale: float = 1.0) -> Dict:
    """A training checkpoint's worth of random float32 tensors.

    Args:
        scale: Fraction of each weight matrix's rows kept (1: ViT-B).

    Returns:
        ``{'meta', 'state_dict', 'optimizer'}`` as mmengine saves them,
        AdamW state per parameter.
    """
    shapes = STEM + [(f'blocks.{i}.{name}', shape) for i in range(12)
                     for name, shape in BLOCK]
    generator = torch.Generator().manual_seed(0)
    state_dict, moments = {}, {}
    for index, (name, shape) in enumerate(shapes):
        shape = (max(1, round(shape[0] * scale)), ) + tuple(shape[1:])
        state_dict[name] = torch.randn(shape, generator=generator)
        moments[index] = dict(
            step=torch.tensor(1000.),
            exp_avg=torch.randn(shape, generator=generator),
            exp_avg_sq=torch.rand(shape, generator=generator))
    groups = [dict(lr=1.5e-4, weight_decay=0.05, params=list(moments))]
    return dict(
        meta=dict(epoch=1, iter=1000),
        state_dict=state_dict,
        optimizer=dict(state=moments, param_groups=groups))


def state_bytes(state: Dict) -> int:
    tensors = list(state['state_dict'].values()) + [
        t for m in state['optimizer']['state'].values() for t in m.values()
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


class StateSavingRunner:
    """What ``SafeCheckpointHook.save_atomically`` calls to write: the
    runner's ``save_checkpoint``, here mmengine's function on the state
    (no model to build a state dict from)."""

    def __init__(self, state: Dict) -> None:
        self.state = state

    def save_checkpoint(self,
                        out_dir: str,
                        filename: str,
                        backend_args: Optional[dict] = None) -> None:
        import mmengine.runner.checkpoint as checkpoint_module
        checkpoint_module.save_checkpoint(
            self.state, osp.join(out_dir, filename), backend_args=backend_args)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path: str) -> None:
    """Drop the file's pages from the page cache (after writing them)."""
    fsync_file(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def record_line(work_dir: str, path: str, written=None) -> None:
    """The ``saved`` line the hook appends (its fields that cost time)."""
    size, digest, ranks = fingerprint(path, written)
    append_event(
        work_dir,
        dict(
            event='saved',
            path=osp.basename(path),
            epoch=1,
            iter=1000,
            size=size,
            sha256=digest,
            best=False,
            run_id='bench',
            layout=dict(ranks=ranks)))


def save_variants(state: Dict, folder: str) -> Dict[str, Callable]:
    hook = SafeCheckpointHook(interval=1)
    hook.file_backend = LocalBackend()
    runner = StateSavingRunner(state)
    path = osp.join(folder, 'epoch_1.pth')

    def read_back() -> None:
        partial = osp.join(folder, '.epoch_1.pth.partial')
        save_checkpoint(state, partial)
        publish_checkpoint(partial, path)
        record_line(folder, path)

    def plugin() -> None:
        # As mmengine's CheckpointHook calls it: with the hook's backend.
        hook.save_atomically(
            runner, folder, 'epoch_1.pth', backend_args=hook.backend_args)
        record_line(folder, path, hook._written)

    def saved_and_synced() -> None:
        torch.save(state, path)
        fsync_file(path)

    return {
        'torch.save': lambda: torch.save(state, path),
        'mmengine': lambda: save_checkpoint(state, path),
        'torch.save+fsync': saved_and_synced,
        'read-back': read_back,
        'sha256 alone': lambda: file_sha256(path),
        'plugin': plugin,  # last: the loads read the file it recorded
    }


def load_variants(path: str) -> Dict[str, Callable]:

    def verify_then_load() -> None:
        verify_before_loading(path)
        torch.load(path, map_location='cpu', weights_only=True)

    def load() -> None:
        torch.load(path, map_location='cpu', weights_only=True)

    return {
        'torch.load': load,
        'verify+load': verify_then_load,
        'verified': lambda: load_verified(path),
        'sha256 alone': lambda: file_sha256(path),
    }


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def timed(fn: Callable) -> Tuple[float, float]:
    # Resume hashes a file once per process; every round is a new resume.
    run_record._FINGERPRINTS.clear()
    wall, cpu = time.perf_counter(), cpu_seconds()
    fn()
    return time.perf_counter() - wall, cpu_seconds() - cpu


def run_rounds(variants: Dict[str, Callable], repeats: int,
               before_each: Callable[[], None]) -> Dict[str, List]:
    times = {name: [] for name in variants}
    for _ in range(repeats + 1):  # the first round warms up
        for name, fn in variants.items():
            before_each()
            times[name].append(timed(fn))
    return {name: runs[1:] for name, runs in times.items()}


def ratio(times: Dict[str, List], name: str, base: str) -> float:
    """Median of the per-round wall-time ratios ``name / base``."""
    return statistics.median(w / b
                             for (w, _), (b,
                                          _) in zip(times[name], times[base]))


def report(title: str, times: Dict[str, List], gigabytes: float) -> None:
    names = list(times)
    base = names[0]
    print(f'\n{title} ({gigabytes:.2f} GB, {len(times[base])} rounds)')
    for name in names:
        wall = statistics.median(w for w, _ in times[name])
        cpu = statistics.median(c for _, c in times[name])
        print(f'  {name:18s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  '
              f'wall ratio to {base} {ratio(times, name, base):5.2f}')


#: (what, variant, baseline, goal) of the ratios printed last.
SUMMARY = (
    ('save', 'plugin', 'mmengine', 1.05),
    ('save', 'plugin', 'torch.save', None),
    ('save', 'read-back', 'mmengine', None),
    ('load warm', 'verified', 'torch.load', 1.1),
    ('load cold', 'verified', 'torch.load', 1.1),
    ('load cold', 'verify+load', 'torch.load', None),
)


def summary(results: Dict[str, Dict[str, List]]) -> None:
    print('\nratios (median of per-round wall-time ratios):')
    for what, variant, base, goal in SUMMARY:
        aim = f' (goal <= {goal})' if goal else ''
        print(f'  {what:9s} {variant} / {base}: '
              f'{ratio(results[what], variant, base):.2f}{aim}')


def filesystem(folder: str) -> str:
    """The mount point and type ``folder`` is on (from /proc/mounts)."""
    best = ('?', '?')
    try:
        with open('/proc/mounts') as mounts:
            for line in mounts:
                _, point, kind = line.split()[:3]
                if osp.realpath(folder).startswith(point.rstrip('/') + '/') \
                        and len(point) >= len(best[0]):
                    best = (point, kind)
    except OSError:
        pass
    return f'{best[0]} ({best[1]})'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--dir',
        default=REPO,
        help='where the temporary folder goes (a disk, not /dev/shm); '
        'default: the repository')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--scale',
        type=float,
        default=1.0,
        help='fraction of ViT-B weight rows (1: ~1.03 GB)')
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix='.bench_checkpoint_digest.', dir=args.dir)
    try:
        state = vit_b_state(args.scale)
        gigabytes = state_bytes(state) / 1e9
        print(f'{folder} on {filesystem(folder)}; {os.cpu_count()} CPUs, '
              f'load average {os.getloadavg()[0]:.1f}, torch '
              f'{torch.__version__}')
        results = {}
        results['save'] = run_rounds(
            save_variants(state, folder), args.repeats, lambda: None)
        report('save', results['save'], gigabytes)
        path = osp.join(folder, 'epoch_1.pth')
        del state
        loads = load_variants(path)
        results['load warm'] = run_rounds(loads, args.repeats, lambda: None)
        report('load, warm page cache', results['load warm'], gigabytes)
        results['load cold'] = run_rounds(loads, args.repeats,
                                          lambda: evict(path))
        report('load, cold (file evicted before each)', results['load cold'],
               gigabytes)
        summary(results)
    finally:
        shutil.rmtree(folder)


if __name__ == '__main__':
    main()
