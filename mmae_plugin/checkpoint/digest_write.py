"""Checkpoints hashed while they are written, not read back after.

:class:`DigestingLocalBackend` is mmengine's local file backend, registered
under another name; its ``put`` hashes the bytes while writing them
(:class:`DigestingWriter`), and :func:`take_digests` hands the digests to
the checkpoint hook. Measured: docs/performance.md.
"""
import hashlib
import os
import os.path as osp
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Optional

from mmengine.fileio import LocalBackend, register_backend

from .run_record import FileDigest

#: The name of :class:`DigestingLocalBackend` in mmengine's file backends.
BACKEND_NAME = 'mmae_digesting_local'
#: Digests taken by :class:`DigestingLocalBackend`, by absolute path, until
#: :func:`take_digests` collects them.
_WRITTEN: Dict[str, FileDigest] = {}

#: Buffers from this size on are hashed by the helper thread; smaller ones
#: (zip headers, the pickle) cost less to hash than to hand over.
PARALLEL_FROM = 1 << 20


class DigestingWriter:
    """A binary file object that hashes what is written through it.

    Use as a context manager: the helper thread stops on leaving it.

    Args:
        file: The open binary file to write to.
        parallel_from: Buffers of at least this many bytes are hashed in a
            helper thread while they are written.
    """

    def __init__(self, file: Any, parallel_from: int = PARALLEL_FROM) -> None:
        self._file = file
        self._digest = hashlib.sha256()
        self._parallel_from = parallel_from
        self._helper: Optional[ThreadPoolExecutor] = None
        self.size = 0

    def __enter__(self) -> 'DigestingWriter':
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def write(self, data: Any) -> int:
        """Write a bytes-like buffer to the file and hash it.

        Args:
            data: Bytes-like (``torch.save`` passes memoryviews).

        Returns:
            The number of bytes written (all of them).
        """
        view = memoryview(data).cast('B')
        if view.nbytes < self._parallel_from:
            self._digest.update(view)
            self._file.write(view)
        else:
            self._write_hashing_alongside(view)
        self.size += view.nbytes
        return view.nbytes

    def _write_hashing_alongside(self, view: memoryview) -> None:
        if self._helper is None:
            self._helper = ThreadPoolExecutor(
                1, thread_name_prefix='checkpoint-sha256')
        hashed = self._helper.submit(self._digest.update, view)
        try:
            self._file.write(view)
        finally:
            # The caller may free the buffer once write returns.
            hashed.result()

    def flush(self) -> None:
        """Flush the file (``torch.save`` calls this when done)."""
        self._file.flush()

    def hexdigest(self) -> str:
        """The SHA-256 of everything written so far."""
        return self._digest.hexdigest()

    def close(self) -> None:
        """Stop the helper thread; the file stays open."""
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None


@register_backend(BACKEND_NAME)
class DigestingLocalBackend(LocalBackend):
    """mmengine's ``LocalBackend`` whose ``put`` also takes the SHA-256 of
    the bytes it writes.

    :class:`~mmae_plugin.engine.hooks.SafeCheckpointHook` saves through it
    (``backend_args=dict(backend='mmae_digesting_local')``, mmengine's own
    file-backend registry): mmengine's ``save_checkpoint`` serialises the
    checkpoint into memory and hands the bytes to ``put``, which writes
    them while a helper thread hashes them. :func:`take_digests` gives the
    digests to the hook after the save.
    """

    def put(self, obj: bytes, filepath: Any) -> None:
        """Write ``obj`` to ``filepath`` and record its size and SHA-256.

        Args:
            obj: The bytes (mmengine's serialised checkpoint).
            filepath: The local file to write.
        """
        path = os.fspath(filepath)
        os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
        with open(path, 'wb') as file, DigestingWriter(file) as writer:
            writer.write(obj)
        _WRITTEN[osp.abspath(path)] = FileDigest(writer.size,
                                                 writer.hexdigest())


def take_digests(target: str) -> Dict[str, FileDigest]:
    """The digests :class:`DigestingLocalBackend` took of ``target`` (a
    file) or of the files inside it (an FSDP folder's ``rank<i>.pth``),
    removed from its table.

    Args:
        target: The checkpoint file or folder written.

    Returns:
        ``{path relative to target ('.' for target itself): FileDigest}``.
    """
    target = osp.abspath(target)
    taken = [
        path for path in _WRITTEN
        if path == target or path.startswith(target + os.sep)
    ]
    return {osp.relpath(path, target): _WRITTEN.pop(path) for path in taken}
