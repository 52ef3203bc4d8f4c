"""One live run per work folder (invariant I3 of docs/reliability.md):
a second launch is refused naming the live run, on every rank; the lock
dies with its process; a filesystem without locks is reported."""
import errno
import fcntl
import functools
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from _helpers_gloo import run_gloo_ranks
from checkpoint_fault_tools import toy_runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.checkpoint.run_record import RECORD_NAME
from mmae_plugin.engine.runners.work_dir_lock import (WorkDirLockedError,
                                                      WorkDirLockError,
                                                      acquire_work_dir_lock,
                                                      release_work_dir_lock)

HOLD = textwrap.dedent("""
    import sys, time
    from mmae_plugin.engine.runners.work_dir_lock import acquire_work_dir_lock
    acquire_work_dir_lock(sys.argv[1])
    print('locked', flush=True)
    time.sleep(600)
""")


@pytest.fixture
def live_run(tmp_path):
    """Another process holding ``tmp_path``'s lock, as a training run
    does; killed with SIGKILL at the end."""
    holder = subprocess.Popen(
        [sys.executable, '-c', HOLD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True)
    assert holder.stdout.readline().strip() == 'locked'
    yield holder
    holder.kill()
    holder.wait()


def test_a_second_launch_is_refused_naming_the_live_run(tmp_path, live_run):
    runner = toy_runner(tmp_path, max_epochs=2)
    with pytest.raises(WorkDirLockedError) as refused:
        runner.train()
    message = str(refused.value)
    assert f'pid {live_run.pid}' in message
    assert socket.gethostname() in message and 'started' in message
    # Refused before anything was resumed or saved.
    assert not (tmp_path / RECORD_NAME).exists()
    assert not list(tmp_path.glob('*.pth'))


def test_the_lock_dies_with_its_process(tmp_path, live_run):
    live_run.send_signal(signal.SIGKILL)
    live_run.wait()
    runner = toy_runner(tmp_path, max_epochs=1)
    runner.train()
    assert (tmp_path / 'epoch_1.pth').exists()
    # Released when training ends: the next launch takes it again.
    toy_runner(tmp_path, max_epochs=2, resume=True).train()
    assert (tmp_path / 'epoch_2.pth').exists()


def test_the_same_process_cannot_take_it_twice(tmp_path):
    fd = acquire_work_dir_lock(str(tmp_path))
    with pytest.raises(WorkDirLockedError, match=f'pid {os.getpid()}'):
        acquire_work_dir_lock(str(tmp_path))
    release_work_dir_lock(fd)
    release_work_dir_lock(acquire_work_dir_lock(str(tmp_path)))


def test_dataloader_workers_do_not_keep_the_lock(tmp_path):
    """A forked child (as a persistent dataloader worker is) outliving
    its trainer's run holds no lock: the next launch takes it."""
    fd = acquire_work_dir_lock(str(tmp_path))
    child = os.fork()
    if child == 0:  # the worker: lives on after the trainer released
        import time
        time.sleep(5)
        os._exit(0)
    try:
        release_work_dir_lock(fd)
        holder = subprocess.run([
            sys.executable, '-c',
            HOLD.replace('time.sleep(600)', ''),
            str(tmp_path)
        ],
                                capture_output=True,
                                text=True,
                                timeout=120)
        assert holder.stdout.strip() == 'locked', holder.stderr[-2000:]
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_filesystem_without_locks_is_reported(tmp_path, monkeypatch):

    def no_locks(fd, operation, *args):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, 'lockf', no_locks)
    with pytest.raises(WorkDirLockError, match='cannot lock') as refused:
        toy_runner(tmp_path, max_epochs=1).train()
    assert not isinstance(refused.value, WorkDirLockedError)
    assert 'work_dir_lock = False' in str(refused.value)
    # The documented opt-out trains unlocked.
    from mmengine.config import Config
    toy_runner(
        tmp_path, max_epochs=1, cfg=Config(dict(work_dir_lock=False))).train()
    assert (tmp_path / 'epoch_1.pth').exists()


def _second_launch(work_dir, rank, world):
    """A 2-rank launch into ``work_dir``: what each rank ends with."""
    # What torchrun sets; mmengine reads them for the launcher 'pytorch'.
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    try:
        toy_runner(
            work_dir,
            max_epochs=1,
            launcher='pytorch',
            env_cfg=dict(dist_cfg=dict(backend='gloo'))).train()
    except WorkDirLockedError as error:
        return f'refused: {error}'
    return 'trained'


def test_every_rank_of_a_second_launch_stops(tmp_path, live_run):
    out = tmp_path / 'ranks'
    out.mkdir()
    results = run_gloo_ranks(
        functools.partial(_second_launch, str(tmp_path)), 2, out)
    assert all(r.startswith('refused') for r in results), results
    assert f'pid {live_run.pid}' in results[1]
    assert not list(tmp_path.glob('*.pth'))
