"""Two "nodes" on one machine: torchrun with a c10d rendezvous on
localhost, one process per node, the shipped M-MAE config trained, killed
and auto-resumed.

Each node is told its own checkpoint ``out_dir`` (as node-local disks
would be); the work dir, where ``last_checkpoint`` and the logs go, is
shared as on a cluster file system. The c10d rendezvous decides which node
holds global rank 0; only that rank may write checkpoints, the record and
``last_checkpoint``, so after each run exactly one node's folder holds
them, and the resumed run continues from what the first run's rank 0
wrote, wherever rank 0 is now.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmae_plugin.checkpoint.run_record import read_record

CONFIG = 'configs/fashion_mnist/mmae_fmnist.py'
SMOKE = [
    'train_dataloader.dataset.indices=64', 'train_dataloader.batch_size=16',
    'train_dataloader.num_workers=0',
    'train_dataloader.persistent_workers=False',
    'default_hooks.logger.interval=1'
]


def node_command(repo_root, port, work_dir, out_dir, max_epochs, resume):
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2',
        '--nproc_per_node', '1', '--rdzv_backend', 'c10d', '--rdzv_endpoint',
        f'127.0.0.1:{port}', '--rdzv_id', 'mmae-2-nodes',
        os.path.join(repo_root, 'tools', 'train.py'),
        os.path.join(repo_root, CONFIG), '--launcher', 'pytorch', '--work-dir',
        str(work_dir)
    ]
    if resume:
        command.append('--resume')
    return command + [
        '--cfg-options', *SMOKE, f'train_cfg.max_epochs={max_epochs}',
        f'default_hooks.checkpoint.out_dir={out_dir}'
    ]


def start_nodes(repo_root, env, work_dir, out_dirs, max_epochs, resume=False):
    port = env['MASTER_PORT']
    return [
        subprocess.Popen(
            node_command(repo_root, port, work_dir, out_dir, max_epochs,
                         resume),
            cwd=repo_root,
            env=dict(env, OMP_NUM_THREADS='1'),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True) for out_dir in out_dirs
    ]


def descendants(pid):
    """Every process below ``pid`` (torchrun starts its workers in process
    groups of their own, so a process-group kill would miss them)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as stat:
                    parent = int(stat.read().rsplit(')', 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_tree(pid):
    """SIGKILL ``pid`` and everything below it, the workers first seen."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def files_below(folder):
    return sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder) for name in names)


@pytest.mark.skipif(sys.platform != 'linux', reason='reads /proc (Linux)')
def test_two_nodes_train_only_rank0_writes_and_a_kill_resumes(
        repo_root, tmp_path, cpu_dist_env_factory):
    work_dir = tmp_path / 'work'
    out_dirs = [tmp_path / 'node0', tmp_path / 'node1']
    # CheckpointHook appends the work dir's name to out_dir; the run
    # record is in rank 0's checkpoint folder (node 0's), and rank 0 alone
    # decides what every rank resumes.
    record = out_dirs[0] / 'work'
    nodes = start_nodes(
        repo_root, cpu_dist_env_factory(), work_dir, out_dirs, max_epochs=40)
    deadline = time.time() + 300
    while not any(entry.epoch >= 2
                  for entry in read_record(str(record)).checkpoints()):
        assert time.time() < deadline, 'no checkpoint within 300 s'
        assert all(node.poll() is None for node in nodes), \
            [node.communicate()[0][-3000:] for node in nodes]
        time.sleep(0.2)
    saved = Path(read_record(str(record)).checkpoints()[0].location).parent
    for node in nodes:  # preempted: the whole node, at once
        kill_tree(node.pid)
        node.wait()
    assert checkpoint_folders(out_dirs) == [saved]
    newest = read_record(str(record)).checkpoints()[0].epoch
    assert newest >= 2

    nodes = start_nodes(
        repo_root,
        cpu_dist_env_factory(),
        work_dir,
        out_dirs,
        max_epochs=newest + 1,
        resume=True)
    logs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], \
        [log[-3000:] for log in logs]
    assert any(f'Auto-resuming from {saved}/epoch_{newest}.pth' in log
               and f'resumed epoch: {newest}' in log for log in logs), \
        [[line for line in log.splitlines() if 'esum' in line]
         for log in logs]
    written = [
        folder for folder in checkpoint_folders(out_dirs)
        if (folder / f'epoch_{newest + 1}.pth').is_file()
    ]
    assert len(written) == 1  # by the resumed run's rank 0 alone
    assert (work_dir / 'last_checkpoint').read_text() == \
        str(written[0] / f'epoch_{newest + 1}.pth')


def checkpoint_folders(out_dirs):
    """The nodes' checkpoint folders that hold any checkpoint file."""
    return [
        out_dir / 'work' for out_dir in out_dirs
        if any('epoch' in name for name in files_below(out_dir))
    ]
