"""The resume gate: which checkpoint a run continues from, and whether.

:class:`ResumeGateMixin` goes before mmengine's ``Runner`` or
``FlexibleRunner`` (see :mod:`.runners`); every decision about resuming is
taken here, in this order, before anything loaded is applied:

1. which checkpoint (auto-resume: the newest intact entry of the run
   record, :func:`~mmae_plugin.checkpoint.discovery.choose_resume_checkpoint`);
2. integrity of every local checkpoint resumed or loaded
   (``CorruptCheckpointError``);
3. meta and run identity (another run's or config's checkpoint needs
   ``resume_other_run = True``);
4. nothing saved over another run's files
   (:class:`~mmae_plugin.checkpoint.discovery.CheckpointsInTheWay`);
5. the launch (:mod:`.launch_record`, ``resume_launch_change``).

Every refusal is written to the run's log file as well as raised. The contract:
docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own.
"""
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.dist import broadcast_object_list, get_rank, get_world_size
from mmengine.hooks import CheckpointHook
from mmengine.runner import BaseLoop

from mmae_plugin.checkpoint.discovery import (CheckpointsInTheWay,
                                              choose_resume_checkpoint,
                                              refuse_in_the_way)
from mmae_plugin.checkpoint.integrity import CorruptCheckpointError
from mmae_plugin.checkpoint.loading import (start_verification,
                                            training_meta_problem,
                                            verify_before_loading)
from mmae_plugin.checkpoint.run_record import checkpoint_folder, read_record
from mmae_plugin.engine.run_identity import runner_config_digest
from .launch_record import (LaunchChangedError, check_launch, launch_record,
                            rescale_schedule)

#: The config key that accepts another run's or config's checkpoint.
OTHER_RUN_KEY = 'resume_other_run'


class ForeignCheckpointError(RuntimeError):
    """A checkpoint of another run or config, or one that does not say."""


#: What the gate raises; each is logged first.
REFUSALS = (CorruptCheckpointError, CheckpointsInTheWay, LaunchChangedError,
            ForeignCheckpointError, ValueError)


def pretrained_checkpoints(model: torch.nn.Module) -> Iterator[str]:
    """Checkpoints the ``Pretrained`` ``init_cfg``s of ``model`` will load.

    Args:
        model: The runner's model (wrapped or not).

    Yields:
        Each non-empty ``checkpoint`` of an ``init_cfg`` of type
        ``'Pretrained'``, in module order.
    """
    for module in model.modules():
        init_cfg = getattr(module, 'init_cfg', None)
        for cfg in init_cfg if isinstance(init_cfg, list) else [init_cfg]:
            if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained' \
                    and cfg.get('checkpoint'):
                yield cfg['checkpoint']


def identity_problems(meta: Dict[str, Any], current_run: Optional[str],
                      current_digest: str) -> List[str]:
    """Why a checkpoint's ``meta`` does not show it is this run's.

    Args:
        meta: The checkpoint's ``meta``.
        current_run: The run id of the folder's record, or None.
        current_digest: This config's model digest.

    Returns:
        Sentence fragments; empty when it is this run's (or, in a folder
        without a run, one of this config).
    """
    run_id = meta.get('run_id')
    problems = []
    if not isinstance(run_id, str) or not run_id:
        problems.append('its meta does not say which run wrote it (no '
                        'run_id: written by mmengine or plugin 0.3 or '
                        'earlier)')
    elif current_run is not None and run_id != current_run:
        problems.append(f'it was written by run {run_id}, not by the run '
                        f'{current_run} of this work folder')
    digest = meta.get('config_digest')
    if isinstance(digest, str) and digest != current_digest:
        problems.append(f'its model config digest {digest} is not this '
                        f"config's {current_digest} (another model or "
                        'method)')
    return problems


def runner_checkpoint_folder(runner) -> str:
    """The folder the runner's checkpoint hook saves into (its record's).

    Args:
        runner: The runner (before or after ``before_train``).

    Returns:
        The work folder, or ``<out_dir>/<work folder name>``.
    """
    for hook in getattr(runner, '_hooks', []):
        if isinstance(hook, CheckpointHook):
            out_dir = getattr(hook, 'configured_out_dir', hook.out_dir)
            return checkpoint_folder(runner.work_dir, out_dir)
    return str(runner.work_dir)


def _refuse_new_run_in_the_way(folder: str, limits: Tuple[float,
                                                          float]) -> None:
    refuse_in_the_way(folder, read_record(folder), None, (0, 0), 'a new run',
                      limits)


def _train_limits(runner) -> Tuple[float, float]:
    loop = getattr(runner, '_train_loop', None)
    return (getattr(loop, 'max_iters',
                    float('inf')), getattr(loop, 'max_epochs', float('inf')))


class ResumeGateMixin:
    """Runner behaviour: record-based, verified, checked resume (see the
    module)."""

    _resume_chosen = False  # the checkpoint came from auto-resume
    _resuming = None  # the path mmengine's resume is loading
    _verification = None  # of the checkpoint being loaded, still running
    _rescale = None  # iterations-per-epoch ratio the launch check chose

    # ------------------------------------------------------ 1. which one
    def load_or_resume(self) -> None:
        """Choose the auto-resume checkpoint (or refuse to start), then
        load or resume as mmengine does."""
        if self._has_loaded:
            return super().load_or_resume()
        folder = runner_checkpoint_folder(self)
        training = isinstance(getattr(self, '_train_loop', None), BaseLoop)
        if training and not self._resume:
            self._decided_on_rank0(_refuse_new_run_in_the_way, folder,
                                   _train_limits(self))
        if self._resume is True and self._load_from is None:
            choice = self._decided_on_rank0(choose_resume_checkpoint, folder,
                                            _train_limits(self))
            for note in choice.notes:
                self.logger.warning(note)
            if choice.skipped:
                self.logger.warning(choice.fallback_message())
            if choice.path is not None:
                self.logger.info(f'Auto-resuming from {choice.path}')
                self._load_from, self._resume_chosen = choice.path, True
            else:
                self.logger.warning(f'auto-resume: no checkpoint yet in '
                                    f'{folder}; starting afresh')
                self._resume = False
        return super().load_or_resume()

    # ------------------------------------------------------ 2. integrity
    def _init_model_weights(self) -> None:
        """Verify the ``Pretrained`` checkpoints, then initialise as mmengine.
        """
        for checkpoint in pretrained_checkpoints(self.model):
            verify_before_loading(checkpoint)
        super()._init_model_weights()

    def load_checkpoint(self, filename: str, *args, **kwargs) -> Any:
        """Verify a local checkpoint while mmengine loads it.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``load_checkpoint``.
            **kwargs: As for mmengine's ``load_checkpoint``.

        Returns:
            What mmengine returns.
        """
        if self._resuming == str(filename):  # resume() is verifying it
            return super().load_checkpoint(filename, *args, **kwargs)
        with self._verified_while_loading(filename):
            return super().load_checkpoint(filename, *args, **kwargs)

    def resume(self, filename: str, *args, **kwargs) -> Any:
        """Resume as mmengine does, once the loaded checkpoint passed the
        gate (checked before anything of it is applied); then rescale the
        schedule if the launch check chose to.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``resume``.
            **kwargs: As for mmengine's ``resume``.

        Returns:
            What mmengine returns.
        """
        self._rescale = None
        with self._verified_while_loading(filename):
            self._resuming = str(filename)
            try:
                result = super().resume(filename, *args, **kwargs)
            finally:
                self._resuming = None
        if self._rescale is not None:
            rescale_schedule(self, self._rescale)
        return result

    def save_checkpoint(self, *args, **kwargs) -> None:
        """mmengine's ``save_checkpoint`` with ``meta['launch']`` added."""
        if len(args) < 6:  # meta not passed positionally
            kwargs['meta'] = dict(
                kwargs.get('meta') or {}, launch=launch_record(self))
        return super().save_checkpoint(*args, **kwargs)

    @contextmanager
    def _verified_while_loading(self, filename: str) -> Iterator[None]:
        """Verify ``filename`` in a thread while mmengine loads it; nothing
        loaded is applied before the verdict (``after_load_checkpoint``
        waits for it)."""
        self._verification = start_verification(filename)
        try:
            yield
        except BaseException:
            # A damaged file fails torch.load too: say it is damaged.
            self._wait_for_verification()
            raise
        finally:
            self._wait_for_verification()

    def _wait_for_verification(self) -> None:
        verification, self._verification = self._verification, None
        if verification is not None:
            self._logged(verification.wait)

    def call_hook(self, fn_name: str, **kwargs) -> None:
        """Pass a loaded checkpoint through the gate before mmengine (or a
        hook) reads it."""
        if fn_name == 'after_load_checkpoint':
            self._wait_for_verification()
            if self._resuming:
                self._logged(self._accept, self._resuming,
                             kwargs['checkpoint'])
        super().call_hook(fn_name, **kwargs)

    def _decided_on_rank0(self, decide, *args) -> Any:
        """``decide(*args)`` on rank 0, its result or refusal on every rank:
        all ranks continue from the same checkpoint, or all stop with the
        same message, whatever each rank's view of the folder."""
        if get_world_size() == 1:
            return self._logged(decide, *args)
        outcome = [None]
        if get_rank() == 0:
            try:
                outcome = [(True, decide(*args))]
            except Exception as err:  # noqa: BLE001 (raised on every rank)
                outcome = [(False, err)]
        broadcast_object_list(outcome)
        decided, value = outcome[0]
        if not decided:
            self.logger.error(str(value))
            raise value
        return value

    def _logged(self, check, *args) -> Any:
        # The run's log file, not only stderr, must say why it stopped.
        try:
            return check(*args)
        except REFUSALS as err:
            self.logger.error(str(err))
            raise

    # ----------------------------------------------- 3-5. whether to resume
    def _accept(self, path: str, checkpoint: Dict) -> None:
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) \
            else None
        problem = training_meta_problem(checkpoint, whole=False)
        if problem:
            raise ForeignCheckpointError(
                f'cannot resume {path}: {problem}. Load weights with '
                'load_from and resume=False.')
        if not self._resume_chosen:  # auto-resume checked what it chose
            self._accept_explicit(path, meta)
        choice = self.cfg.get('resume_launch_change', 'refuse') \
            if self.cfg else 'refuse'
        self._rescale, warning = check_launch(path, meta.get('launch'),
                                              launch_record(self), choice)
        if warning:
            self.logger.warning(warning)

    def _accept_explicit(self, path: str, meta: Dict[str, Any]) -> None:
        folder = runner_checkpoint_folder(self)
        record = read_record(folder)
        entry = record.find(path)
        own = entry is not None and entry.run_id == record.run_id
        problems = [] if own else identity_problems(meta, record.run_id,
                                                    runner_config_digest(self))
        if problems and self.cfg.get(OTHER_RUN_KEY, False) is not True:
            raise ForeignCheckpointError(
                f'cannot resume {path}: {"; ".join(problems)}. Set '
                f'{OTHER_RUN_KEY} = True in the config (--cfg-options '
                f'{OTHER_RUN_KEY}=True) to continue from it anyway.')
        if problems:
            self.logger.warning(
                f'resuming {path} although {"; ".join(problems)} '
                f'({OTHER_RUN_KEY}=True)')
        run_id = record.run_id if own else meta.get('run_id')
        refuse_in_the_way(folder, record, run_id,
                          (meta['epoch'], meta['iter']), f'resuming {path}',
                          _train_limits(self))
