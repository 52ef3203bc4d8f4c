"""A ``CheckpointHook`` that never leaves a run without a usable checkpoint.

:class:`SafeCheckpointHook` keeps mmengine's schedule, naming,
``keep_ckpt_ids`` and best-checkpoint rules and changes each save: only
finite states are saved (else :class:`NonFiniteCheckpointError` on every
rank), the file is written atomically and recorded, with its SHA-256, in
the run record (:mod:`mmae_plugin.checkpoint.run_record`), and
``max_keep_ckpts`` retires old checkpoints from the record, only after the
new one is on disk (:mod:`mmae_plugin.checkpoint.retention`). Saves to
other backends (``backend_args`` naming object storage) keep upstream's
writes; the finiteness check and the removal order apply there too.
Select it in a config::

    default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook',
                                         interval=1, max_keep_ckpts=2))

The contract and why: docs/reliability.md (Checkpoints: finite, whole,
verified, and the run's own).
"""
import os
import os.path as osp
from collections import deque
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import torch
from mmengine.dist import (all_gather_object, all_reduce, barrier,
                           get_world_size, is_main_process)
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from mmae_plugin.checkpoint.atomic_write import (remove_orphan_temporaries,
                                                 write_atomically)
from mmae_plugin.checkpoint.digest_write import BACKEND_NAME, take_digests
from mmae_plugin.checkpoint.publish import (PARTIAL_SUFFIX, publish_checkpoint,
                                            remove_partial_checkpoints,
                                            remove_path, remove_path_quietly)
from mmae_plugin.checkpoint.retention import retire
from mmae_plugin.checkpoint.run_record import (FileDigest, append_event,
                                               file_id, fingerprint,
                                               read_record, recorded_path)
from mmae_plugin.engine.run_identity import run_identity
from mmae_plugin.engine.runners.launch_record import launch_record
from ..finite_state import all_finite_flag, flag_device, named_state_tensors
from .deferred_runtime_info_hook import settle_logged_values

#: How many non-finite tensor names the error lists before "and N more".
LISTED_TENSORS = 12


class NonFiniteCheckpointError(FloatingPointError):
    """The state to be saved holds NaN or Inf; nothing was written."""


def _check_setting(name: str, value: Any) -> None:
    if type(value) is not int or (value != -1 and value < 1):
        meaning = {
            'interval':
            'save every `interval` epochs or iterations; -1 '
            'saves only the last one (with save_last=True)',
            'max_keep_ckpts':
            'keep that many newest checkpoints; -1 keeps '
            'all (mmengine reads 0 as "keep all" too, '
            'which is never what 0 says)',
        }[name]
        raise ValueError(
            f'SafeCheckpointHook: {name}={value!r} is not allowed: use an '
            f'integer >= 1 or -1 ({meaning})')


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with finite-only, atomic, checksummed saves.

    Takes every argument of mmengine's ``CheckpointHook``; ``interval`` and
    ``max_keep_ckpts`` must be -1 or >= 1 (see the module docstring).
    """

    def __init__(self, interval: int = -1, *args, **kwargs) -> None:
        _check_setting('interval', interval)
        _check_setting('max_keep_ckpts', kwargs.get('max_keep_ckpts', -1))
        super().__init__(interval, *args, **kwargs)
        #: ``out_dir`` as configured (``before_train`` resolves it).
        self.configured_out_dir = self.out_dir
        if self.backend_args is None and self.file_client_args is None:
            # mmengine's local backend, whose put also hashes the bytes it
            # writes (the digest of the record, without reading them back).
            self.backend_args = dict(backend=BACKEND_NAME)
        self._finite_checkpoint: Optional[str] = None
        # Digests of the files of the last local save, by absolute path.
        self._written: Dict[str, FileDigest] = {}

    # ----------------------------------------------------------- lifecycle
    def before_train(self, runner) -> None:
        """Set up as upstream, clean what a killed save left, start the
        run's record.

        Upstream's removal of ``keep_ckpt_ids`` by name is not run: what
        to retire is decided from the record (local saves).

        Args:
            runner: The runner.
        """
        keep, self.max_keep_ckpts = self.max_keep_ckpts, -1
        try:
            super().before_train(runner)
        finally:
            self.max_keep_ckpts = keep
        self.keep_ckpt_ids = deque(
            runner.message_hub.runtime_info.get('keep_ckpt_ids', []),
            max(keep, 1))
        self._finite_checkpoint = runner.message_hub.get_info('last_ckpt')
        self._identity = run_identity(runner)
        if self._writes_locally() and is_main_process():
            os.makedirs(str(self.out_dir), exist_ok=True)
            for folder in {str(self.out_dir), str(runner.work_dir)}:
                remove_orphan_temporaries(folder)
                remove_partial_checkpoints(folder)
            append_event(
                str(self.out_dir),
                dict(
                    event='start',
                    launch=launch_record(runner),
                    resumed_iter=runner.iter or None,
                    **self._identity))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Write the run id and config digest into the checkpoint's meta.

        Args:
            runner: The runner.
            checkpoint: The checkpoint about to be saved.
        """
        identity = getattr(self, '_identity', None) or run_identity(runner)
        checkpoint.setdefault('meta', {}).update(identity)

    def _writes_locally(self) -> bool:
        backend = self.file_backend
        if isinstance(backend, _QueueingBackend):
            backend = backend.backend
        return isinstance(backend, LocalBackend)

    # -------------------------------------------------------- finiteness
    def require_finite_state(self, runner, what: str, iterations: int) -> None:
        """Raise on every rank if any rank's state is not finite.

        One all-reduce and one host read.

        Args:
            runner: The runner.
            what: The checkpoint about to be written (for the message).
            iterations: Iterations trained so far (for the message).

        Raises:
            NonFiniteCheckpointError: Some parameter, buffer or optimizer
                state tensor holds NaN or Inf on some rank.
        """
        named = named_state_tensors(runner.model,
                                    getattr(runner, 'optim_wrapper', None))
        tensors = [tensor for _, tensor in named]
        flag = all_finite_flag(tensors, flag_device(tensors))
        all_reduce(flag, op='min')
        if int(flag.item()) == 1:
            return
        local = [
            name for name, tensor in named
            if not bool(torch.isfinite(tensor).all())
        ]
        per_rank = all_gather_object(local) if get_world_size() > 1 \
            else [local]
        message = self.nonfinite_message(what, iterations, per_rank)
        runner.logger.error(message)  # the run's log file, not only stderr
        raise NonFiniteCheckpointError(message)

    def nonfinite_message(self, what: str, iterations: int,
                          per_rank: List[List[str]]) -> str:
        """The error text, the same on every rank.

        Args:
            what: The checkpoint that was not written.
            iterations: Iterations trained so far.
            per_rank: Non-finite tensor names of each rank.

        Returns:
            The message.
        """
        names = sorted({name for names in per_rank for name in names})
        listed = ', '.join(names[:LISTED_TENSORS])
        if len(names) > LISTED_TENSORS:
            listed += f' and {len(names) - LISTED_TENSORS} more'
        ranks = [rank for rank, names in enumerate(per_rank) if names]
        where = f' (on rank{"s" if len(ranks) > 1 else ""} ' \
                f'{", ".join(map(str, ranks))})' if len(per_rank) > 1 else ''
        restart = (f'The newest checkpoint saved finite is '
                   f'{self._finite_checkpoint}; resume from it'
                   if self._finite_checkpoint else
                   'The run has no checkpoint yet: start it again')
        return (f'not saving {what} after iteration {iterations}: '
                f'{len(names)} tensors of the model or '
                f'optimizer state are NaN or Inf{where}: {listed}. '
                f'{restart} with a lower optim_wrapper.optimizer.lr, a '
                'longer warm-up or optim_wrapper.clip_grad.')

    # ------------------------------------------------------------- saving
    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        # The message hub is saved: DeferredRuntimeInfoHook's pending step
        # goes in first (and DivergenceHook sees it before anything is
        # written).
        settle_logged_values(runner)
        filename = self.filename_tmpl.format(step)
        self.require_finite_state(runner, filename, meta['iter'])
        local = self._writes_locally()
        retired = [] if local else self._update_kept_ids(runner, step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        self.save_atomically(
            runner,
            self.out_dir,
            filename,
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        self._finite_checkpoint = self.last_ckpt
        if not is_main_process():
            return
        if local:
            self.record_saved(runner, str(self.last_ckpt), meta)
        last_checkpoint = osp.join(runner.work_dir, 'last_checkpoint')
        write_atomically(
            str(self.last_ckpt), last_checkpoint, mode='w', encoding='utf-8')
        if local:
            self._retire_by_record(runner, str(self.last_ckpt))
        for path in retired:
            self._remove_checkpoint(path)

    def record_saved(self,
                     runner,
                     path: str,
                     meta: Dict[str, Any],
                     best: bool = False) -> None:
        """Append the ``saved`` event of a finalized local checkpoint.

        Args:
            runner: The runner.
            path: The checkpoint file or FSDP folder.
            meta: Its ``epoch`` and ``iter``.
            best: A best-metric checkpoint (never resumed automatically).
        """
        size, digest, ranks = fingerprint(path, self._written)
        launch = launch_record(runner)
        folder = str(self.out_dir)
        append_event(
            folder,
            dict(
                event='saved',
                path=recorded_path(folder, path),
                epoch=int(meta['epoch']),
                iter=int(meta['iter']),
                size=size,
                sha256=digest,
                file_id=file_id(path),
                best=best,
                launch=launch,
                layout=dict(ranks=ranks, sharding=launch['sharding']),
                **self._identity))

    def _retire_by_record(self, runner, newest: str) -> None:
        """Retire the run's checkpoints older than the kept set
        (:func:`~mmae_plugin.checkpoint.retention.retire`)."""
        if self.max_keep_ckpts <= 0:
            return
        own = read_record(str(self.out_dir)).checkpoints(
            self._identity['run_id'])
        if len(own) <= self.max_keep_ckpts:
            return
        oldest_kept = own[self.max_keep_ckpts - 1]
        retired = [
            entry for entry in own[self.max_keep_ckpts:]
            if (entry.iter, entry.epoch) < (oldest_kept.iter,
                                            oldest_kept.epoch)
            and osp.realpath(entry.location) != osp.realpath(newest)
        ]
        for sentence in retire(retired):
            runner.logger.warning(sentence)

    def _update_kept_ids(self, runner, step: int) -> List[str]:
        """Upstream's ``keep_ckpt_ids`` bookkeeping, removal postponed
        (saves to another backend, which have no record).

        Returns:
            The checkpoints to remove once the new one is complete.
        """
        if self.max_keep_ckpts <= 0 or (self.keep_ckpt_ids
                                        and self.keep_ckpt_ids[-1] == step):
            return []
        retired = []
        if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
            old_step = self.keep_ckpt_ids.popleft()
            retired.append(
                self.file_backend.join_path(
                    self.out_dir, self.filename_tmpl.format(old_step)))
        self.keep_ckpt_ids.append(step)
        runner.message_hub.update_info('keep_ckpt_ids',
                                       list(self.keep_ckpt_ids))
        return retired

    def _save_best_checkpoint(self, runner, metrics) -> None:
        # Upstream's rules decide whether and where; its one save goes
        # through save_atomically and its removal of the old best waits.
        settle_logged_values(runner)
        self.require_finite_state(runner, 'the best checkpoint', runner.iter)
        with deferred_removals(self) as queued, \
                atomic_saves_of(runner, self):
            super()._save_best_checkpoint(runner, metrics)
        keep = {str(self.last_ckpt), str(getattr(self, 'best_ckpt_path', ''))}
        keep |= {
            str(p)
            for p in (
                getattr(self, 'best_ckpt_path_dict', None) or {}).values()
        }
        for path in queued:
            if str(path) in keep:
                continue
            if not self._writes_locally():
                self._remove_checkpoint(path)
            elif is_main_process():
                entry = read_record(str(self.out_dir)).find(str(path))
                for sentence in retire([entry] if entry else []):
                    runner.logger.warning(sentence)

    def save_atomically(self, runner, out_dir: str, filename: str, *args,
                        **kwargs) -> None:
        """``runner.save_checkpoint`` under a partial name, then publish it.

        Args:
            runner: The runner.
            out_dir: The checkpoint folder.
            filename: The checkpoint's final name.
            *args: ``runner.save_checkpoint``'s further arguments.
            **kwargs: ``runner.save_checkpoint``'s keyword arguments.
        """
        save = type(runner).save_checkpoint
        if not self._writes_locally():
            save(runner, out_dir, filename, *args, **kwargs)
            return
        final = osp.join(str(out_dir), filename)
        partial = osp.join(str(out_dir), f'.{filename}{PARTIAL_SUFFIX}')
        self._written = {}
        if is_main_process():
            remove_path(partial)
        _barrier_if_distributed()
        try:
            save(runner, out_dir, osp.basename(partial), *args, **kwargs)
            # Every rank's part is written once all have sent its digest.
            written = _gathered_digests(take_digests(partial))
            if is_main_process():
                publish_checkpoint(partial, final)
                self._written = {
                    osp.abspath(osp.join(final, name)): digest
                    for name, digest in written.items()
                }
        except OSError as err:
            # A full disk says only "[Errno 28] No space left on device".
            if is_main_process():
                remove_path_quietly(partial)
            if err.errno is None:
                raise OSError(f'saving checkpoint {final}: {err}') from err
            raise OSError(
                err.errno, f'{os.strerror(err.errno)} (saving '
                f'checkpoint {final})', final) from err

    def _remove_checkpoint(self, path: str) -> None:
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):
            self.file_backend.rmtree(path)


def _barrier_if_distributed() -> None:
    if get_world_size() > 1:
        barrier()


def _gathered_digests(own: Dict[str, FileDigest]) -> Dict[str, FileDigest]:
    """Every rank's digests of the files it wrote, on every rank.

    Args:
        own: This rank's, by path relative to the checkpoint.

    Returns:
        All ranks' (an FSDP folder's rank files), merged.
    """
    if get_world_size() == 1:
        return own
    merged: Dict[str, FileDigest] = {}
    for part in all_gather_object(own):
        merged.update(part)
    return merged


@contextmanager
def deferred_removals(hook: CheckpointHook) -> Iterator[List[str]]:
    """Queue the hook's ``remove``/``rmtree`` calls instead of running them.

    Args:
        hook: The checkpoint hook.

    Yields:
        The list the queued paths are appended to.
    """
    backend, queued = hook.file_backend, []
    hook.file_backend = _QueueingBackend(backend, queued)
    try:
        yield queued
    finally:
        hook.file_backend = backend


class _QueueingBackend:
    """A file backend whose removals are queued (see deferred_removals)."""

    def __init__(self, backend: Any, queued: List[str]) -> None:
        self.backend, self._queued = backend, queued

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def remove(self, filepath: str) -> None:
        self._queued.append(filepath)

    def rmtree(self, dir_path: str) -> None:
        self._queued.append(dir_path)


@contextmanager
def atomic_saves_of(runner, hook: SafeCheckpointHook) -> Iterator[None]:
    """Route ``runner.save_checkpoint`` through the hook while inside.

    Bound on this runner object only, for the duration of one upstream
    method that saves through it.

    Args:
        runner: The runner.
        hook: The hook whose :meth:`save_atomically` writes.
    """

    def save_checkpoint(out_dir, filename, *args, **kwargs) -> None:
        hook.save_atomically(runner, out_dir, filename, *args, **kwargs)
        if hook._writes_locally() and is_main_process():
            hook.record_saved(
                runner,
                osp.join(str(out_dir), filename),
                kwargs['meta'],
                best=True)

    runner.save_checkpoint = save_checkpoint
    try:
        yield
    finally:
        del runner.save_checkpoint
