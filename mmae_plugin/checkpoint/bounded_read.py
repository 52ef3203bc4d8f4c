"""Reading small metadata files that a hostile or broken folder may fake.

:func:`read_small_text` refuses, by name and at once, what would block or
fill memory in a plain ``open().read()`` of a sidecar or
``last_checkpoint`` (a FIFO, ``/dev/zero``, a huge sparse file): it opens
without blocking, checks that the descriptor is a regular file within the
limit, and reads at most that many bytes.
"""
import os
import stat

#: Default cap, in bytes, for a metadata file (a sidecar of a 1,024-rank
#: FSDP folder is ~100 kB).
SUSPICIOUS_FILE_LIMIT = 1 << 20


class UnsafeFileError(OSError):
    """A metadata file that is not a small regular file."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages (``'a FIFO'``)."""
    for test, name in ((stat.S_ISFIFO, 'a FIFO'), (stat.S_ISCHR,
                                                   'a character device'),
                       (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISSOCK, 'a socket'), (stat.S_ISDIR,
                                                     'a directory')):
        if test(mode):
            return name
    return 'not a regular file'


def read_small_text(path: str,
                    what: str,
                    limit: int = SUSPICIOUS_FILE_LIMIT) -> str:
    """Read a small regular text file, refusing anything else by name.

    Args:
        path: The file (symlinks are followed; what they point at is
            checked).
        what: What the file is, for the message (``'checksum file'``).
        limit: Largest size accepted, in bytes.

    Returns:
        Its text (UTF-8; undecodable bytes replaced).

    Raises:
        FileNotFoundError: It does not exist.
        UnsafeFileError: It is a FIFO, device, socket or directory, or
            larger than ``limit``.
    """
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of
    # waiting for one; the type check on the descriptor then refuses it.
    fd = os.open(path,
                 os.O_RDONLY | os.O_NONBLOCK | getattr(os, 'O_CLOEXEC', 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(
                f'{what} {path} is {file_kind(info.st_mode)}, not a regular '
                'file; refusing to read it')
        if info.st_size > limit:
            raise UnsafeFileError(
                f'{what} {path} has {info.st_size} bytes, more than the '
                f'{limit} such a file can need; refusing to read it')
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew since fstat
        raise UnsafeFileError(
            f'{what} {path} is larger than {limit} bytes; refusing to read it')
    return data.decode('utf-8', errors='replace')
