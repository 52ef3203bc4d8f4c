"""A ``CheckpointHook`` that never leaves a run without a usable checkpoint.

mmengine 0.10.7's ``CheckpointHook`` writes a checkpoint in place (a kill
mid-save leaves a truncated file), deletes the oldest kept checkpoint
*before* writing the new one (with ``max_keep_ckpts=1`` a kill leaves
none), records nothing to verify a file by, and saves whatever the
parameters hold, NaN included. :class:`SafeCheckpointHook` keeps upstream's
schedule, naming, ``keep_ckpt_ids`` and best-checkpoint rules and changes
how each save is done:

1. **Only finite states are saved.** Before a save every rank reduces the
   finiteness of its parameters, floating-point buffers and optimizer state
   on the device to one flag; one all-reduce (MIN) and one host read per
   save make every rank decide the same. A non-finite state raises
   :class:`NonFiniteCheckpointError` on every rank with the same text
   (iteration, the non-finite tensors of all ranks, the newest checkpoint
   saved finite) and nothing is written.
2. **Atomic, recorded saves.** The checkpoint (a file, or an FSDP
   folder of ``rank<i>.pth``) is written under a hidden partial name,
   fsync'ed and renamed into place; then its name, epoch, global
   iteration, size, SHA-256, layout, run id and launch are appended to the
   run record (:mod:`mmae_plugin.checkpoint.run_record`), and only then is
   ``last_checkpoint`` (for mmengine's tools; it decides nothing) replaced.
   The run id is created when the run first starts and written, with the
   config's digest, into every checkpoint's ``meta``.
3. **Retention from the record.** ``max_keep_ckpts`` keeps the run's
   newest checkpoints by global iteration, whatever their kind (epoch or
   iteration checkpoints, before and after a switch); only entries older
   than the kept set are retired, never the file just finalized, and each
   is marked removed in the record before its file goes.

Saves to other backends (``backend_args`` naming object storage) keep
upstream's writes; the finiteness check and the removal order apply there
too. Select it in a config::

    default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook',
                                         interval=1, max_keep_ckpts=2))
"""
import os
import os.path as osp
import re
import shutil
from collections import deque
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.dist import (all_gather_object, all_reduce, barrier,
                           get_world_size, is_main_process)
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS as MMENGINE_HOOKS

from mmae_plugin.checkpoint.atomic_write import (fsync_folder,
                                                 remove_orphan_temporaries,
                                                 write_atomically)
from mmae_plugin.checkpoint.integrity import remove_sidecars
from mmae_plugin.checkpoint.run_record import (append_event, fingerprint,
                                               read_record, recorded_path)
from mmae_plugin.engine.run_identity import run_identity
from mmae_plugin.engine.runners.launch_record import launch_record

PARTIAL_SUFFIX = '.partial'
_PARTIAL_NAME = re.compile(r'^\..+\.pth' + re.escape(PARTIAL_SUFFIX) + '$')
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


def named_state_tensors(model: torch.nn.Module,
                        optim_wrapper: Any) -> List[Tuple[str, torch.Tensor]]:
    """Every floating-point tensor a checkpoint of this run holds, named.

    Args:
        model: ``runner.model`` (wrapped or not).
        optim_wrapper: ``runner.optim_wrapper`` (an ``OptimWrapper`` or
            ``OptimWrapperDict``), or None.

    Returns:
        ``(name, tensor)`` for parameters, floating-point buffers and
        optimizer state tensors (``optimizer[<param>].exp_avg``...).
    """
    tensors = [(name, p) for name, p in model.named_parameters()]
    tensors += [(name, b) for name, b in model.named_buffers()
                if b.is_floating_point()]
    names = {id(p): name for name, p in model.named_parameters()}
    for optimizer in _optimizers(optim_wrapper):
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and (value.is_floating_point()
                                               or value.is_complex()):
                    owner = names.get(id(param), f'param@{id(param):x}')
                    tensors.append((f'optimizer[{owner}].{key}', value))
    return tensors


def _optimizers(optim_wrapper: Any) -> Iterator[torch.optim.Optimizer]:
    if optim_wrapper is None:
        return
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    for wrapper in (wrappers.values() if wrappers else [optim_wrapper]):
        optimizer = getattr(wrapper, 'optimizer', None)
        if optimizer is not None:
            yield optimizer


def all_finite_flag(tensors: List[torch.Tensor],
                    device: torch.device) -> torch.Tensor:
    """One int flag on ``device``: 1 if every tensor is finite, else 0.

    Computed on the tensors' devices without a host read.

    Args:
        tensors: The state tensors.
        device: Where the flag goes (the collective's device).

    Returns:
        A 0-d int64 tensor.
    """
    flag = torch.ones((), dtype=torch.int64, device=device)
    for tensor in tensors:
        finite = torch.isfinite(tensor).all()
        flag = flag * finite.to(
            device=device, dtype=torch.int64, non_blocking=True)
    return flag


def _flag_device(tensors: List[torch.Tensor]) -> torch.device:
    for tensor in tensors:
        if tensor.device.type != 'cpu':
            return tensor.device
    return torch.device('cpu')


@MMENGINE_HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with finite-only, atomic, checksummed saves.

    Takes every argument of mmengine's ``CheckpointHook``; ``interval`` and
    ``max_keep_ckpts`` must be -1 or >= 1 (see the module docstring).
    """

    def __init__(self, interval: int = -1, *args, **kwargs) -> None:
        _check_setting('interval', interval)
        _check_setting('max_keep_ckpts', kwargs.get('max_keep_ckpts', -1))
        super().__init__(interval, *args, **kwargs)
        self._finite_checkpoint: Optional[str] = None

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
            for folder in {str(self.out_dir), str(runner.work_dir)}:
                remove_orphan_temporaries(folder)
                remove_partial_checkpoints(folder)
            append_event(
                runner.work_dir,
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
        flag = all_finite_flag(tensors, _flag_device(tensors))
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
            retired = self._retired_by_record(runner, str(self.last_ckpt))
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
        size, digest, ranks = fingerprint(path)
        launch = launch_record(runner)
        append_event(
            runner.work_dir,
            dict(
                event='saved',
                path=recorded_path(runner.work_dir, path),
                epoch=int(meta['epoch']),
                iter=int(meta['iter']),
                size=size,
                sha256=digest,
                best=best,
                launch=launch,
                layout=dict(ranks=ranks, sharding=launch['sharding']),
                **self._identity))

    def _retired_by_record(self, runner, newest: str) -> List[str]:
        """Retire the run's checkpoints older than the kept set.

        Each is marked removed in the record before the caller removes it.

        Returns:
            The checkpoints to remove.
        """
        if self.max_keep_ckpts <= 0:
            return []
        own = read_record(runner.work_dir).checkpoints(
            self._identity['run_id'])
        if len(own) <= self.max_keep_ckpts:
            return []
        oldest_kept = own[self.max_keep_ckpts - 1]
        retired = []
        for entry in own[self.max_keep_ckpts:]:
            older = (entry.iter, entry.epoch) < (oldest_kept.iter,
                                                 oldest_kept.epoch)
            if older and osp.realpath(entry.location) != \
                    osp.realpath(newest):
                append_event(runner.work_dir,
                             dict(event='removed', path=entry.path))
                retired.append(entry.location)
        return retired

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
            if str(path) not in keep:
                if self._writes_locally() and is_main_process():
                    append_event(
                        runner.work_dir,
                        dict(
                            event='removed',
                            path=recorded_path(runner.work_dir, str(path))))
                self._remove_checkpoint(path)

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
        if is_main_process():
            _remove_path(partial)
        _barrier_if_distributed()
        try:
            save(runner, out_dir, osp.basename(partial), *args, **kwargs)
            _barrier_if_distributed()  # every rank's part is written
            if is_main_process():
                publish_checkpoint(partial, final)
        except OSError as err:
            # A full disk says only "[Errno 28] No space left on device".
            if is_main_process():
                _remove_path_quietly(partial)
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


def _remove_path(path: str) -> None:
    if osp.isdir(path) and not osp.islink(path):
        shutil.rmtree(path)
    elif osp.lexists(path):
        os.remove(path)


def _remove_path_quietly(path: str) -> None:
    try:
        _remove_path(path)
    except OSError:
        pass  # a later start removes it (remove_partial_checkpoints)


def _fsync_tree(path: str) -> None:
    files = [path] if osp.isfile(path) else \
        [osp.join(path, name) for name in os.listdir(path)]
    for file in files:
        with open(file, 'rb') as handle:
            os.fsync(handle.fileno())
    if osp.isdir(path):
        fsync_folder(path)


def publish_checkpoint(partial: str, final: str) -> None:
    """Move a completely written checkpoint into place.

    A checksum sidecar of plugin 0.3 and earlier describing the replaced
    file goes first (the record is what describes checkpoints now).

    Args:
        partial: The written file or FSDP folder.
        final: Its name.
    """
    _fsync_tree(partial)
    remove_sidecars(final)
    if osp.isdir(partial):
        # A folder cannot be renamed over a non-empty one: move the old one
        # aside first (a re-save of the same name).
        if osp.lexists(final):
            aside = f'{partial}.old'
            _remove_path(aside)
            os.replace(final, aside)
            os.replace(partial, final)
            _remove_path(aside)
        else:
            os.replace(partial, final)
    else:
        os.replace(partial, final)
    fsync_folder(osp.dirname(final) or '.')


def remove_partial_checkpoints(folder: str) -> None:
    """Delete ``.<name>.pth.partial`` files and folders of killed saves.

    Args:
        folder: A checkpoint folder (main process only).
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if _PARTIAL_NAME.match(name) or (name.endswith('.partial.old')
                                         and name.startswith('.')):
            _remove_path(osp.join(folder, name))


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
