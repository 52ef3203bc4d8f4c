"""SIGKILL a real training run at every syscall of a checkpoint save.

Run as a script (``tests/test_checkpoint_faults.py`` does)::

    python tests/checkpoint_kill_driver.py OUT.json [--every K]
        [--upstream-retention]

A run trains the toy model with ``max_keep_ckpts=1``, one checkpoint per
epoch. In epoch 2, just before ``CheckpointHook`` saves, the run attaches
``strace`` to itself; a first run only counts the file syscalls of that
save (``openat``, ``write``, ``fsync``, ``rename``, ``unlink``...); then,
for each syscall kind and each invocation number N of it, a fresh run is
started with ``strace --inject=<kind>:signal=KILL:when=N``: the kernel
kills it on entering that syscall, the way a preempted job or an OOM kill
stops it. After each kill, auto-resume (``resume=True``) must continue to
the end from an intact checkpoint. ``--upstream-retention`` restores
mmengine's own removal order first (old checkpoint deleted before the new
one is written), to show that the sweep finds that bug.

Each run is a forked child of this process (imports once, then ~1 s per
run); the result is a JSON summary.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import torch

torch.set_num_threads(1)  # forked children: no OpenMP pool to inherit

from mmengine.hooks import Hook  # noqa: E402

import mmae_plugin.registration  # noqa: E402,F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_fault_tools import toy_runner  # noqa: E402

#: Syscalls that create, write, sync, rename or delete files.
SYSCALLS = ('openat', 'write', 'pwrite64', 'close', 'fsync', 'fdatasync',
            'fchmod', 'fchown', 'fsetxattr', 'rename', 'renameat', 'renameat2',
            'unlink', 'unlinkat', 'mkdir', 'ftruncate')
SAVE_EPOCH = 1  # 0-based: attach during the second epoch's save


class AttachStrace(Hook):
    """Attach strace to this process right before the epoch-2 save."""

    priority = 'LOW'  # before CheckpointHook (VERY_LOW)

    def __init__(self, log, inject=None):
        self.log, self.inject, self.process = log, inject, None

    def after_train_epoch(self, runner):
        if runner.epoch != SAVE_EPOCH:
            return
        command = [
            'strace', '-qq', '-o', self.log, '-p',
            str(os.getpid()), '-e', 'trace=' + ','.join(SYSCALLS)
        ]
        if self.inject:
            command += ['-e', f'inject={self.inject}']
        self.process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while tracer_pid() == 0:
            if time.time() > deadline or self.process.poll() is not None:
                raise RuntimeError('strace did not attach')
            time.sleep(0.01)


class DetachStrace(Hook):
    """Detach strace once the save (and everything after it) is done."""

    priority = 'LOWEST'

    def __init__(self, attach):
        self.attach = attach

    def after_train_epoch(self, runner):
        process = self.attach.process
        if runner.epoch == SAVE_EPOCH and process is not None:
            process.send_signal(signal.SIGINT)  # strace detaches cleanly
            process.wait(timeout=20)


def tracer_pid():
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('TracerPid:'):
                return int(line.split()[1])
    return 0


def in_child(function):
    """Run ``function`` in a forked child; return how it ended.

    Returns:
        ``('exit', code)`` or ``('signal', number)``.
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            function()
            code = 0
        except BaseException as err:  # reported through the exit code
            sys.stderr.write(f'child failed: {type(err).__name__}: {err}\n')
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ('signal', os.WTERMSIG(status))
    return ('exit', os.WEXITSTATUS(status))


def train_with_strace(work_dir, log, inject=None):
    attach = AttachStrace(log, inject)
    runner = toy_runner(
        work_dir,
        max_epochs=2,
        upstream=UPSTREAM,
        custom_hooks=[attach, DetachStrace(attach)])
    runner.train()


def count_syscalls(work_dir):
    """Invocations of each traced syscall during the epoch-2 save."""
    log = os.path.join(work_dir, '..', 'count.strace')
    ended = in_child(lambda: train_with_strace(work_dir, log))
    if ended != ('exit', 0):
        raise RuntimeError(f'counting run ended with {ended}')
    counts = collections.Counter()
    with open(log) as trace:
        for line in trace:
            match = re.match(r'^(?:\[pid\s+\d+\] )?(\w+)\(', line)
            if match:
                counts[match.group(1)] += 1
    return counts


class RecordStart(Hook):
    """Where the resumed run started and the file it resumed from."""

    priority = 'VERY_LOW'

    def __init__(self, result_file):
        self.result_file = result_file

    def before_train(self, runner):
        with open(self.result_file, 'w') as f:
            json.dump(dict(start_epoch=runner.epoch), f)


def resume_to_the_end(work_dir, result_file):
    runner = toy_runner(
        work_dir,
        max_epochs=3,
        resume=True,
        upstream=UPSTREAM,
        custom_hooks=[RecordStart(result_file)])
    runner.train()


#: Set by ``--upstream-retention``: mmengine's own Runner and CheckpointHook.
UPSTREAM = False


def restore_upstream_retention():
    global UPSTREAM
    UPSTREAM = True


def sweep(root, every=1, only=None):
    """Kill at each counted syscall invocation (every ``every``-th).

    Args:
        root: Scratch folder.
        every: Take every ``every``-th point of the full list.
        only: Explicit ``(syscall, invocation)`` points instead.

    Returns:
        The summary dict.
    """
    counts = count_syscalls(os.path.join(root, 'count'))
    points = only or [(name, n) for name in sorted(counts)
                      for n in range(1, counts[name] + 1)][::every]
    results = []
    for index, (name, n) in enumerate(points):
        work_dir = os.path.join(root, f'run{index}')
        ended = in_child(lambda: train_with_strace(
            work_dir, os.devnull, inject=f'{name}:signal=KILL:when={n}'))
        killed = ended == ('signal', signal.SIGKILL)
        result_file = os.path.join(root, f'run{index}.json')
        resumed = in_child(lambda: resume_to_the_end(work_dir, result_file))
        start = None
        if os.path.exists(result_file):
            with open(result_file) as f:
                start = json.load(f)['start_epoch']
        files = sorted(os.listdir(work_dir)) if os.path.isdir(work_dir) \
            else []
        results.append(
            dict(
                syscall=name,
                invocation=n,
                killed=killed,
                ended=list(ended),
                resume_ended=list(resumed),
                start_epoch=start,
                survived=resumed == ('exit', 0) and start is not None
                and start >= 1,
                files=[f for f in files if not f.startswith('2')]))
    return dict(
        syscall_counts=dict(counts),
        points=len(results),
        killed=sum(r['killed'] for r in results),
        survived=sum(r['survived'] for r in results),
        killed_and_survived=sum(r['killed'] and r['survived']
                                for r in results),
        failures=[r for r in results if not r['survived']],
        results=results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out')
    parser.add_argument(
        '--every',
        type=int,
        default=1,
        help='kill at every K-th syscall only (faster)')
    parser.add_argument(
        '--points', default='', help='explicit points, e.g. write:1,rename:2')
    parser.add_argument('--upstream-retention', action='store_true')
    args = parser.parse_args()
    if args.upstream_retention:
        restore_upstream_retention()
    only = [(p.split(':')[0], int(p.split(':')[1]))
            for p in args.points.split(',') if p]
    with tempfile.TemporaryDirectory() as root:
        summary = sweep(root, args.every, only)
    with open(args.out, 'w') as f:
        json.dump(summary, f, indent=1)


if __name__ == '__main__':
    main()
