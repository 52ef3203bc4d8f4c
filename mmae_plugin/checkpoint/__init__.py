"""Checkpoint files: the run record, atomic writes, checks, bounded reads.

Plain functions over paths (torch and mmengine are imported only where a
function needs them); the plugin's MMEngine components use them:
``SafeCheckpointHook`` (:mod:`mmae_plugin.engine.hooks.checkpoint_hook`)
writes through them and keeps the run record, ``MMAERunner`` /
``MMAEFlexibleRunner`` (:mod:`mmae_plugin.engine.runners`) resume from the
record, and the model zoo verifies its files. Nothing here changes
mmengine; :mod:`.digest_write` registers one more file backend in
mmengine's registry (a local backend that hashes what it writes), which
the hook names for its saves.
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
