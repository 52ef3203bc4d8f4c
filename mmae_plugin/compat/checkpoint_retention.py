"""Old checkpoints deleted before the new one is written.

Upstream: mmengine 0.10.7 ``CheckpointHook._save_checkpoint_with_step``
removes the oldest kept checkpoint (``max_keep_ckpts``) *before*
``runner.save_checkpoint`` writes the new one, and ``_save_best_checkpoint``
removes the previous best checkpoint before writing the new best. With
``max_keep_ckpts=1`` a job killed during the save is left with no checkpoint
at all, and ``last_checkpoint`` names the deleted file. Not fixed in any
mmengine release as of 0.10.7.

What changes: while those two methods run, the hook's file backend queues
``remove``/``rmtree`` instead of running them; the queue runs when the
method returns, that is after the new checkpoint, its checksum sidecar
(:mod:`.checkpoint_integrity`) and ``last_checkpoint`` are complete. Which
checkpoints are kept, the ``keep_ckpt_ids`` stored in each checkpoint and
the log messages are upstream's. A queued removal of a path that is now
the last or best checkpoint is dropped; if the save raises, nothing is
removed. Removing a checkpoint also removes its checksum sidecar (the
hidden ``.<name>.sha256``, and ``<name>.sha256`` of plugin 0.2.0), and
``before_train`` removes sidecars whose checkpoint upstream deleted.

A kill after ``last_checkpoint`` is written but before the removal leaves
one old checkpoint more than ``max_keep_ckpts`` on disk (it is no longer in
``keep_ckpt_ids``, so nothing deletes it later): a file too many, never
one too few.
"""
import functools
import os
import os.path as osp
from typing import Any, Callable, List, Set, Tuple

from ._checkpoint_hook_cleanup import clean_up_after_before_train
from .checkpoint_integrity import SIDECAR_SUFFIX, sidecar_paths


class DeferredRemovals:
    """A file backend whose ``remove``/``rmtree`` wait for :meth:`run`.

    Every other attribute is the wrapped backend's.

    Args:
        backend: The hook's file backend.
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.queued: List[Tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def remove(self, filepath: str) -> None:
        """Queue the removal of a file."""
        self.queued.append(('remove', filepath))

    def rmtree(self, dir_path: str) -> None:
        """Queue the removal of a folder (deepspeed checkpoints)."""
        self.queued.append(('rmtree', dir_path))

    def run(self, keep: Set[str]) -> None:
        """Remove what was queued, except the paths in ``keep``.

        Args:
            keep: Paths that are now the last or best checkpoints.
        """
        from mmengine.fileio.backends import LocalBackend
        for action, path in self.queued:
            if str(path) in keep:
                continue
            if action == 'rmtree':
                self.backend.rmtree(path)
                continue
            self.backend.remove(path)
            # Sidecars exist only beside local files: on object storage
            # upstream's calls are all there is (and all its tests count).
            if not isinstance(self.backend, LocalBackend):
                continue
            for sidecar in sidecar_paths(str(path)):
                if self.backend.isfile(sidecar):
                    self.backend.remove(sidecar)
        self.queued.clear()


def current_checkpoints(hook: Any) -> Set[str]:
    """Paths the hook now points at as last or best checkpoints.

    Args:
        hook: A ``CheckpointHook``.

    Returns:
        Their string forms.
    """
    paths = [getattr(hook, 'last_ckpt', None),
             getattr(hook, 'best_ckpt_path', None)]
    paths += list((getattr(hook, 'best_ckpt_path_dict', None) or {}).values())
    return {str(path) for path in paths if path is not None}


def remove_after_saving(method: Callable) -> Callable:
    """Wrap a ``CheckpointHook`` save method to delete old files last.

    Args:
        method: ``_save_checkpoint_with_step`` or ``_save_best_checkpoint``.

    Returns:
        The method with its removals run after it returns.
    """

    @functools.wraps(method)
    def save(self, runner, *args, **kwargs) -> Any:
        backend = self.__dict__.get('file_backend')
        # Nested call (the best-checkpoint save calls the step save): the
        # outermost call runs the removals once everything is written.
        if backend is None or isinstance(backend, DeferredRemovals):
            return method(self, runner, *args, **kwargs)
        deferred = DeferredRemovals(backend)
        self.file_backend = deferred
        try:
            result = method(self, runner, *args, **kwargs)
        finally:
            self.file_backend = backend
        deferred.run(keep=current_checkpoints(self))
        return result

    save._mmae_retention = True
    return save


def described_checkpoints(name: str) -> List[str]:
    """The checkpoints a file of ours with this name could describe.

    Args:
        name: A file name in a checkpoint folder.

    Returns:
        ``['X.pth', '.X.pth']`` for ``.X.pth.sha256`` (the hidden sidecar of
        ``X.pth``, or the 0.2.0 one of a checkpoint named ``.X.pth``),
        ``['X.pth']`` for ``X.pth.sha256``, and ``[]`` for anything else
        (other ``.sha256`` files are not ours).
    """
    if not name.endswith('.pth' + SIDECAR_SUFFIX):
        return []
    checkpoint = name[:-len(SIDECAR_SUFFIX)]
    if checkpoint.startswith('.'):
        return [checkpoint[1:], checkpoint]
    return [checkpoint]


def remove_orphan_sidecars(folder: str) -> None:
    """Delete our sidecars whose checkpoint no longer exists.

    Args:
        folder: A local checkpoint folder.
    """
    try:
        names = set(os.listdir(folder))
    except OSError:
        return
    for name in names:
        checkpoints = described_checkpoints(name)
        if checkpoints and not names.intersection(checkpoints):
            try:
                os.remove(osp.join(folder, name))
            except OSError:
                pass


def remove_old_checkpoints_last() -> None:
    """Make ``CheckpointHook`` delete old checkpoints after saving new ones."""
    from mmengine.hooks import CheckpointHook

    for name in ('_save_checkpoint_with_step', '_save_best_checkpoint'):
        method = getattr(CheckpointHook, name)
        if not getattr(method, '_mmae_retention', False):
            setattr(CheckpointHook, name, remove_after_saving(method))

    # Upstream deletes checkpoints beyond max_keep_ckpts in before_train on
    # resume; the sidecars of the deleted ones go right after.
    clean_up_after_before_train(
        '_mmae_retention',
        lambda hook, runner: remove_orphan_sidecars(str(hook.out_dir)))
