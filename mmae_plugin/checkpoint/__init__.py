"""Checkpoint files: the run record, atomic writes, checks, bounded reads.

Plain functions over paths, used by ``SafeCheckpointHook``, the plugin's
runners and the model zoo; nothing here changes mmengine (:mod:`.digest_write`
registers one more local file backend, which the hook names).
"""
from .bounded_read import (SUSPICIOUS_FILE_LIMIT, UnsafeFileError,
                           read_small_text)
from .integrity import (CorruptCheckpointError, checkpoint_problem,
                        sidecar_path, write_sidecar)
from .run_record import RECORD_NAME, file_sha256, read_record

__all__ = [
    'SUSPICIOUS_FILE_LIMIT', 'UnsafeFileError', 'read_small_text',
    'CorruptCheckpointError', 'checkpoint_problem', 'file_sha256',
    'sidecar_path', 'write_sidecar', 'RECORD_NAME', 'read_record'
]
