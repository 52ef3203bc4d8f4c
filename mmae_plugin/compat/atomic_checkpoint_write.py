"""Checkpoints written in place.

Upstream: mmengine 0.10.7 ``LocalBackend.put`` / ``put_text`` open the
target with 'wb' / 'w' and write into it, and ``CheckpointHook`` writes
``last_checkpoint`` with ``open(..., 'w')``, so a job killed while saving
leaves a truncated ``epoch_N.pth`` or an empty ``last_checkpoint``: resume
then fails. Not fixed in any mmengine release as of 0.10.7. Writing to a
temporary file ``.<name>.XXXXXXXX.tmp`` beside the target and renaming it
over the target makes every save all-or-nothing.

Only where a rename is equivalent to upstream's in-place write: the target
(after following symlinks, so a symlink is written through as upstream
does) is missing or a regular file with one link owned by us, and its
folder accepts a new file. Hard links, FIFOs, devices and files of other
owners get upstream's in-place write. The new file gets the old file's
mode, or ``0o666 & ~umask`` like ``open``. Temporary files left by a killed
write (``.<name>.<pid>.XXXXXXXX.tmp``) are removed by the next write of the
same file and, in the work and checkpoint folders, when training starts,
once the process that wrote them is gone: every rank of a job may write the
same file (mmengine dumps test metrics on each rank), and one writer must
not delete another's live temporary.
"""
import builtins
import functools
import locale
import os
import os.path as osp
import re
import stat
import tempfile
from typing import IO, Any, Callable, Optional, Union


_TMP_NAME = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$')


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows.

    Returns:
        The umask bits.
    """
    try:
        with builtins.open('/proc/self/status') as status:
            for line in status:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_target(filepath: Union[str, 'os.PathLike']) -> Optional[str]:
    """Where an atomic write of ``filepath`` goes, or None for upstream's.

    Args:
        filepath: The path ``put``/``put_text`` was given.

    Returns:
        The real path to replace, or None when only an in-place write keeps
        upstream's semantics (hard link, special file, another owner, missing
        folder of a symlink's target).
    """
    real = osp.realpath(filepath)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return real if osp.isdir(osp.dirname(real)) else None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or \
            info.st_uid != os.geteuid():
        return None
    return real


def remove_orphan_temporaries(folder: str, name: Optional[str] = None) -> None:
    """Delete temporaries of interrupted atomic writes whose writer is gone.

    Args:
        folder: Where to look.
        name: Only those of this target file name; None for all.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        match = _TMP_NAME.match(entry)
        if match and (name is None or match.group('name') == name) \
                and not _process_alive(int(match.group('pid'))):
            try:
                os.remove(osp.join(folder, entry))
            except OSError:
                pass


def write_atomically(data: Union[bytes, str], filepath: str,
                     mode: str = 'wb',
                     encoding: Optional[str] = None) -> None:
    """Write ``data`` to ``filepath`` so readers see the old or new file only.

    Args:
        data: Bytes-like for ``mode='wb'``, str for ``mode='w'``; anything
            else raises TypeError (as ``open(...).write`` does) and leaves
            the target untouched.
        filepath: Destination: a real path whose folder exists (see
            :func:`atomic_write_target`).
        mode: ``'wb'`` or ``'w'``.
        encoding: Text encoding for ``mode='w'``.
    """
    if mode not in ('wb', 'w'):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    folder, name = osp.split(filepath)
    try:
        file_mode = stat.S_IMODE(os.stat(filepath).st_mode)
    except FileNotFoundError:
        file_mode = 0o666 & ~current_umask()
    remove_orphan_temporaries(folder, name)
    fd, tmp_path = tempfile.mkstemp(
        dir=folder, prefix=f'.{name}.{os.getpid()}.', suffix='.tmp')
    try:
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, mode, encoding=encoding) as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_path, filepath)
    except BaseException:
        if osp.lexists(tmp_path):
            os.remove(tmp_path)
        raise


def write_local_files_atomically() -> None:
    """Route mmengine's local ``put`` and ``put_text`` through a rename."""
    from mmengine.fileio.backends import LocalBackend

    upstream_put, upstream_put_text = LocalBackend.put, LocalBackend.put_text
    if getattr(upstream_put, '_mmae_fixed', False):
        return

    def write(obj: Any, filepath, mode: str, encoding: Optional[str],
              upstream: Callable[[], None]) -> None:
        os.makedirs(osp.dirname(filepath) or '.', exist_ok=True)
        target = atomic_write_target(filepath)
        if target is None:
            return upstream()
        try:
            write_atomically(obj, target, mode, encoding)
        except PermissionError:
            upstream()  # a writable file in a folder we may not add to

    @functools.wraps(upstream_put)
    def put(self, obj: bytes, filepath) -> None:
        write(obj, filepath, 'wb', None,
              lambda: upstream_put(self, obj, filepath))

    @functools.wraps(upstream_put_text)
    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        write(obj, filepath, 'w', encoding,
              lambda: upstream_put_text(self, obj, filepath, encoding))

    put._mmae_fixed = put_text._mmae_fixed = True
    LocalBackend.put, LocalBackend.put_text = put, put_text


class _AtomicTextFile:
    """File-like object for ``open(path, 'w')`` that writes on close."""

    def __init__(self, path: str) -> None:
        self.path, self._parts = path, []

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f'write() argument must be str, not '
                            f'{type(text).__name__}')
        self._parts.append(text)
        return len(text)

    def __enter__(self) -> '_AtomicTextFile':
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            from mmengine.fileio.backends import LocalBackend
            LocalBackend().put_text(''.join(self._parts), self.path,
                                    locale.getpreferredencoding(False))


def open_last_checkpoint_atomically(file: Any, mode: str = 'r', *args,
                                    **kwargs) -> Union[IO, _AtomicTextFile]:
    """``open`` for ``mmengine.hooks.checkpoint_hook``.

    Args:
        file: Path to open.
        mode: As for ``open``.
        *args: As for ``open``.
        **kwargs: As for ``open``.

    Returns:
        A writer that replaces ``last_checkpoint`` atomically on close for
        ``open(<...>/last_checkpoint, 'w')``, else ``open``'s file object.
    """
    if mode == 'w' and not args and not kwargs and isinstance(
            file, (str, os.PathLike)) and \
            osp.basename(file) == 'last_checkpoint':
        return _AtomicTextFile(os.fspath(file))
    return builtins.open(file, mode, *args, **kwargs)


def write_last_checkpoint_atomically() -> None:
    """Write ``last_checkpoint`` atomically; clean up orphans at start."""
    import mmengine.hooks.checkpoint_hook as hook_module
    from mmengine.dist import is_main_process
    from mmengine.fileio.backends import LocalBackend

    hook_module.open = open_last_checkpoint_atomically
    hook_class = hook_module.CheckpointHook
    original = hook_class.before_train
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def before_train(self, runner) -> None:
        original(self, runner)
        if is_main_process() and isinstance(self.file_backend, LocalBackend):
            for folder in {str(self.out_dir), str(runner.work_dir)}:
                remove_orphan_temporaries(folder)

    before_train._mmae_fixed = True
    hook_class.before_train = before_train
