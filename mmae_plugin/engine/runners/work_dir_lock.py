"""One live training run per work folder.

:class:`WorkDirLockMixin` (before mmengine's ``Runner`` or
``FlexibleRunner``): when training starts, rank 0 takes an exclusive POSIX
lock (``fcntl``) on ``work_dir/.mmae_run.lock``, naming the holder, until
training ends; the system releases it when the process dies. A second
launch into the folder stops on every rank with
:class:`WorkDirLockedError` naming the live run; a filesystem that cannot
lock raises :class:`WorkDirLockError` (``work_dir_lock = False`` in the
config trains unlocked). Why: docs/reliability.md#one-live-run-per-work-folder.
"""
import errno
import fcntl
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import Any, Dict, Optional

from mmengine.dist import broadcast_object_list, get_rank, is_distributed

#: The lock file inside the work folder.
LOCK_NAME = '.mmae_run.lock'
#: The config key that trains without the lock (``False``).
LOCK_KEY = 'work_dir_lock'
#: Lock errors of filesystems that cannot lock.
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
#: Work folders this process holds (real path -> descriptor). A POSIX lock
#: does not conflict with its own process, and closing any descriptor of
#: the file would release it: a second taking in-process is refused here.
_HELD: Dict[str, int] = {}


class WorkDirLockError(RuntimeError):
    """The work folder cannot be locked (a filesystem without locks)."""


class WorkDirLockedError(WorkDirLockError):
    """Another live run holds the work folder."""


def holder_description() -> Dict[str, Any]:
    """What the lock file says about this process."""
    return dict(
        host=socket.gethostname(),
        pid=os.getpid(),
        started=time.strftime('%Y-%m-%d %H:%M:%S %Z'),
        command=' '.join(sys.argv)[:500])


def read_holder(path: str) -> str:
    """The lock file's description of its holder, as text for messages."""
    try:
        with open(path) as f:
            holder = json.loads(f.read(4096))
        return (f"host {holder['host']}, pid {holder['pid']}, started "
                f"{holder['started']}, command {holder['command']!r}")
    except (OSError, ValueError, KeyError, TypeError):
        return 'a process that did not say who it is'


def acquire_work_dir_lock(work_dir: str) -> int:
    """Take the exclusive lock of ``work_dir`` and describe the holder.

    Args:
        work_dir: The run's work folder (created if missing).

    Returns:
        The open file descriptor that holds the lock; closing it, or the
        process ending, releases it.

    Raises:
        WorkDirLockedError: Another process holds it (named).
        WorkDirLockError: The filesystem cannot lock.
    """
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, LOCK_NAME)
    if osp.realpath(path) in _HELD:
        raise _in_use(work_dir, read_holder(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise _in_use(work_dir, read_holder(path)) from None
        if error.errno in UNSUPPORTED:
            raise WorkDirLockError(
                f'the filesystem of work_dir {work_dir} cannot lock '
                f'{path} ({os.strerror(error.errno)}), so a second launch '
                'into the same folder could not be refused. Use a work '
                'folder on a filesystem with locks, or set '
                f'`{LOCK_KEY} = False` in the config to train unlocked.'
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder_description()) + '\n').encode())
    os.fsync(fd)
    _HELD[osp.realpath(path)] = fd
    return fd


def release_work_dir_lock(fd: int) -> None:
    """Release a lock :func:`acquire_work_dir_lock` took."""
    for path, held in list(_HELD.items()):
        if held == fd:
            del _HELD[path]
    os.close(fd)


def _in_use(work_dir: str, holder: str) -> 'WorkDirLockedError':
    return WorkDirLockedError(
        f'work_dir {work_dir} is in use by a live run ({holder}): a second '
        'launch into it would train beside it and save over its '
        'checkpoints. Wait for that run to end (or stop it), or train into '
        'another --work-dir.')


def _rank0_outcome(work_dir: str) -> Any:
    """Rank 0's lock: its descriptor, or the error every rank raises."""
    try:
        return acquire_work_dir_lock(work_dir)
    except WorkDirLockError as error:
        return error


class WorkDirLockMixin:
    """Hold the work folder's lock while training (see the module).

    Rank 0 locks, then tells every rank whether it may go on (one
    broadcast before training), so all ranks stop together.
    """
    _work_dir_lock_fd: Optional[int] = None

    def train(self, *args, **kwargs):
        self._lock_work_dir()
        try:
            return super().train(*args, **kwargs)
        finally:
            self._unlock_work_dir()

    def _lock_work_dir(self) -> None:
        if self.cfg.get(LOCK_KEY, True) is False:
            self.logger.warning(
                f'{LOCK_KEY} = False: training without the work folder '
                f'lock; a second launch into {self.work_dir} is not refused')
            return
        outcome = _rank0_outcome(self.work_dir) if get_rank() == 0 else None
        if is_distributed():
            shared = [(type(outcome), str(outcome)) if isinstance(
                outcome, WorkDirLockError) else None]
            broadcast_object_list(shared, src=0)
            if get_rank() != 0 and shared[0] is not None:
                error_type, message = shared[0]
                outcome = error_type(message)
        if isinstance(outcome, Exception):
            self.logger.error(str(outcome))
            raise outcome
        self._work_dir_lock_fd = outcome

    def _unlock_work_dir(self) -> None:
        if self._work_dir_lock_fd is not None:
            release_work_dir_lock(self._work_dir_lock_fd)
            self._work_dir_lock_fd = None
