"""Shared helper: run a clean-up after ``CheckpointHook.before_train``.

Not a fix itself; ``atomic_checkpoint_write`` (orphan temporaries) and
``checkpoint_retention`` (orphan checksum sidecars) each register one
clean-up through it, so both share one definition of when a clean-up runs.
"""
import functools
from typing import Any, Callable


def clean_up_after_before_train(marker: str,
                                cleanup: Callable[[Any, Any], None]) -> None:
    """Call ``cleanup(hook, runner)`` after upstream's ``before_train``.

    The clean-up runs on the main process only and only when the hook
    writes through mmengine's ``LocalBackend``: other backends (S3, Petrel,
    HTTP) have no local folder to clean, and other ranks must not race the
    main one on a shared folder.

    Args:
        marker: Attribute set on the wrapper so that applying the same fix
            twice wraps once (each fix passes its own).
        cleanup: Called with the hook and the runner.
    """
    from mmengine.dist import is_main_process
    from mmengine.fileio.backends import LocalBackend
    from mmengine.hooks import CheckpointHook

    original = CheckpointHook.before_train
    if getattr(original, marker, False):
        return

    @functools.wraps(original)
    def before_train(self, runner) -> None:
        original(self, runner)
        if is_main_process() and isinstance(self.file_backend, LocalBackend):
            cleanup(self, runner)

    setattr(before_train, marker, True)
    CheckpointHook.before_train = before_train
