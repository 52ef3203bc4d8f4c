"""Checkpoint files: atomic writes, checksums, bounded reads, discovery.

Plain functions over paths (torch and mmengine are imported only where a
function needs them); the plugin's MMEngine components use them:
``SafeCheckpointHook`` (:mod:`mmae_plugin.engine.hooks.checkpoint_hook`)
writes through them, ``MMAERunner`` / ``MMAEFlexibleRunner``
(:mod:`mmae_plugin.engine.runners`) verify and choose what to resume, and
the model zoo verifies its files. Nothing here changes mmengine.
"""
from .bounded_read import SUSPICIOUS_FILE_LIMIT, UnsafeFileError, read_small_text
from .integrity import (CorruptCheckpointError, checkpoint_problem,
                        file_sha256, sidecar_path, write_sidecar)

__all__ = [
    'SUSPICIOUS_FILE_LIMIT', 'UnsafeFileError', 'read_small_text',
    'CorruptCheckpointError', 'checkpoint_problem', 'file_sha256',
    'sidecar_path', 'write_sidecar'
]
