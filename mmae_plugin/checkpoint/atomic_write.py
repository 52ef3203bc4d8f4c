"""Writing a file so that a reader sees the old one or the new one.

:func:`write_atomically` writes to a temporary beside the target, fsyncs it
and renames it over the target (checksum sidecars, ``last_checkpoint``);
:func:`open_atomically` does the same for a writer that streams
(``torch.save``). A rename is used only where it is equivalent to an
in-place write (:func:`atomic_write_target`); the new file keeps the old
one's mode, group and extended attributes (a new one gets ``0o666 &
~umask``). Temporaries are named ``.<name>.<writer>.<pid>.XXXXXXXX.tmp``
(``<writer>``: host, boot id, pid namespace), and only one left by a dead
process of this host, boot and namespace is ever removed. Why:
docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own.
"""
import builtins
import contextlib
import os
import os.path as osp
import re
import socket
import stat
import tempfile
from typing import IO, Iterator, Optional, Union

_TMP_NAME = re.compile(r'^\.(?P<name>.+)\.(?P<writer>[A-Za-z0-9_-]+)'
                       r'\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$')


def _read_first_line(path: str) -> str:
    try:
        with builtins.open(path) as file:
            return file.readline().strip()
    except OSError:
        return ''


def writer_identity() -> str:
    """This process's writer tag: host, boot and pid namespace.

    Two processes with the same tag see the same pid numbers, so one may
    test whether the other is alive; processes with different tags may not.

    Returns:
        ``<host>-<boot id prefix>-<pid namespace inode>`` with only
        ``[A-Za-z0-9_-]`` characters.
    """
    host = re.sub(r'[^A-Za-z0-9_-]', '_', socket.gethostname())[:32] or 'host'
    boot = re.sub(r'[^0-9a-f]', '',
                  _read_first_line('/proc/sys/kernel/random/boot_id'))[:8]
    try:
        namespace = re.sub(r'\D', '', os.readlink('/proc/self/ns/pid'))
    except OSError:
        namespace = ''
    return f'{host}-{boot or "noboot"}-{namespace or "nons"}'


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


def is_own_dead_writers(temporary_name: str,
                        name: Optional[str] = None) -> bool:
    """Whether a temporary was left by a dead writer of this pid namespace.

    Args:
        temporary_name: A file name in a checkpoint folder.
        name: Only temporaries of this target file name; None for all.

    Returns:
        True only for our naming scheme, our writer identity and a pid that
        no longer exists.
    """
    match = _TMP_NAME.match(temporary_name)
    return bool(match) and (name is None or match.group('name') == name) \
        and match.group('writer') == writer_identity() \
        and not _process_alive(int(match.group('pid')))


def remove_orphan_temporaries(folder: str, name: Optional[str] = None) -> None:
    """Delete temporaries of interrupted writes of this host's dead writers.

    Args:
        folder: Where to look.
        name: Only those of this target file name; None for all.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        if is_own_dead_writers(entry, name):
            try:
                os.remove(osp.join(folder, entry))
            except OSError:
                pass


def copy_file_attributes(fd: int, old: Optional[os.stat_result],
                         filepath: str) -> None:
    """Give the temporary the mode, group and xattrs the target has.

    Args:
        fd: The open temporary.
        old: ``os.stat`` of the target, None if it does not exist yet.
        filepath: The target (for its extended attributes).
    """
    if old is None:
        os.fchmod(fd, 0o666 & ~current_umask())
        return
    if old.st_gid != os.fstat(fd).st_gid:
        try:
            os.fchown(fd, -1, old.st_gid)
        except PermissionError:
            pass  # not a member of that group: as a new file by us would be
    try:
        for attribute in os.listxattr(filepath):
            try:
                os.setxattr(fd, attribute, os.getxattr(filepath, attribute))
            except OSError:
                pass  # e.g. security.* without the capability
    except OSError:
        pass  # the filesystem has no extended attributes
    # After fchown, which clears set-id bits.
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


@contextlib.contextmanager
def open_atomically(filepath: str,
                    mode: str = 'wb',
                    encoding: Optional[str] = None) -> Iterator[IO]:
    """A file to write ``filepath`` through; readers see old or new only.

    The body writes to a temporary beside ``filepath``; on leaving the block
    normally it is flushed, fsynced and renamed over ``filepath``; if the block
    raises, it is removed and ``filepath`` is left as it was.

    Args:
        filepath: Destination: a real path whose folder exists (see
            :func:`atomic_write_target`).
        mode: ``'wb'`` or ``'w'``.
        encoding: Text encoding for ``mode='w'``.

    Yields:
        The open temporary.

    Raises:
        OSError: Naming ``filepath`` (a full disk otherwise reports only
            the errno).
    """
    if mode not in ('wb', 'w'):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    folder, name = osp.split(filepath)
    try:
        old = os.stat(filepath)
    except FileNotFoundError:
        old = None
    remove_orphan_temporaries(folder, name)
    try:
        fd, tmp_path = tempfile.mkstemp(
            dir=folder,
            prefix=f'.{name}.{writer_identity()}.{os.getpid()}.',
            suffix='.tmp')
    except OSError as err:
        raise _naming(err, filepath) from err
    try:
        copy_file_attributes(fd, old, filepath)
        with os.fdopen(fd, mode, encoding=encoding) as tmp:
            yield tmp
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_path, filepath)
    except BaseException as err:
        if osp.lexists(tmp_path):
            os.remove(tmp_path)
        if isinstance(err, OSError):
            raise _naming(err, filepath) from err
        raise


def write_atomically(data: Union[bytes, str],
                     filepath: str,
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

    Raises:
        OSError: Naming ``filepath`` (a full disk otherwise reports only
            the errno).
    """
    with open_atomically(filepath, mode, encoding) as file:
        file.write(data)


def _naming(err: OSError, filepath: str) -> OSError:
    if err.errno is None:
        return OSError(f'{filepath}: {err}')
    return OSError(err.errno, os.strerror(err.errno), filepath)


def fsync_folder(folder: str) -> None:
    """Make a rename inside ``folder`` durable (best effort).

    Args:
        folder: The folder whose entries changed.
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on folders; the rename stands
    finally:
        os.close(fd)
