"""Resume from the run record; verify every checkpoint loaded.

:class:`VerifiedCheckpointMixin` goes before mmengine's ``Runner`` or
``FlexibleRunner`` (see :mod:`.runners`). It changes three things, only in
runs whose config sets ``runner_type`` to one of the plugin's runners:

* auto-resume (``resume=True`` without ``load_from``) continues from the
  newest intact checkpoint of the checkpoint folder's run record
  (:func:`~mmae_plugin.checkpoint.discovery.choose_resume_checkpoint`);
  fallbacks, with what they cost, and refusals go to the run's log file;
* no launch (auto-resume, ``--resume PATH`` or a new run) starts when it
  would save over a checkpoint file its run did not write
  (:class:`~mmae_plugin.checkpoint.discovery.CheckpointsInTheWay`);
* an explicit ``--resume PATH`` that is not the current run's recorded
  checkpoint must say in its ``meta`` what it is (epoch, iteration, run
  id); a checkpoint of another run, or of another model config, is
  refused by name unless the config sets ``resume_other_run = True``;
* every local checkpoint the runner resumes or loads (``--resume``,
  ``load_from``, and the ``Pretrained`` ``init_cfg`` of any module), file
  or FSDP folder, is verified first; a damaged one raises
  ``CorruptCheckpointError`` naming it and the newest intact checkpoint
  recorded beside it.
"""
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Tuple

import torch

from mmengine.hooks import CheckpointHook
from mmengine.runner import BaseLoop

from mmae_plugin.checkpoint.discovery import (CheckpointsInTheWay,
                                              choose_resume_checkpoint,
                                              refuse_in_the_way)
from mmae_plugin.checkpoint.integrity import CorruptCheckpointError
from mmae_plugin.checkpoint.loading import (start_verification,
                                            verify_before_loading)
from mmae_plugin.checkpoint.run_record import checkpoint_folder, read_record
from mmae_plugin.engine.run_identity import runner_config_digest

#: The config key that accepts another run's or config's checkpoint.
OTHER_RUN_KEY = 'resume_other_run'


class ForeignCheckpointError(RuntimeError):
    """A checkpoint of another run or config, or one that does not say."""


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


def identity_problems(meta: Any, current_run: Any,
                      current_digest: str) -> List[str]:
    """Why a checkpoint's ``meta`` does not show it is this run's.

    Args:
        meta: The checkpoint's ``meta``.
        current_run: The run id of the work folder's record, or None.
        current_digest: This config's model digest.

    Returns:
        Sentence fragments; empty when it is this run's (or, in a work
        folder without a run, one of this config).
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


def _train_limits(runner) -> Tuple[float, float]:
    loop = getattr(runner, '_train_loop', None)
    return (getattr(loop, 'max_iters', float('inf')),
            getattr(loop, 'max_epochs', float('inf')))


class VerifiedCheckpointMixin:
    """Runner behaviour for record-based, verified resume (see module)."""

    _resume_chosen = False  # the checkpoint came from auto-resume
    _resuming = None  # the path mmengine's resume is loading
    _verification = None  # of the checkpoint being loaded, still running

    def load_or_resume(self) -> None:
        """Choose the auto-resume checkpoint, then load or resume as mmengine.
        """
        folder = runner_checkpoint_folder(self)
        training = isinstance(getattr(self, '_train_loop', None), BaseLoop)
        if training and not self._has_loaded and not self._resume:
            self._logged(refuse_in_the_way, folder, read_record(folder), None,
                         (0, 0), 'a new run', _train_limits(self))
        if not self._has_loaded and self._resume is True and \
                self._load_from is None:
            try:
                choice = choose_resume_checkpoint(folder, _train_limits(self))
            except (CorruptCheckpointError, CheckpointsInTheWay) as err:
                self.logger.error(str(err))
                raise
            for note in choice.notes:
                self.logger.warning(note)
            if choice.skipped:
                self.logger.warning(choice.fallback_message())
            if choice.path is not None:
                self.logger.info(f'Auto-resuming from {choice.path}')
                self._load_from, self._resume_chosen = choice.path, True
            else:
                self.logger.warning(f'auto-resume: no checkpoint yet in '
                                    f'{self.work_dir}; starting afresh')
                self._resume = False
        super().load_or_resume()

    def _init_model_weights(self) -> None:
        """Verify the ``Pretrained`` checkpoints, then initialise as mmengine.
        """
        for checkpoint in pretrained_checkpoints(self.model):
            verify_before_loading(checkpoint)
        super()._init_model_weights()

    def load_checkpoint(self, filename: str, *args, **kwargs) -> Any:
        """Verify a local checkpoint, then load it as mmengine does.

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
        """Verify a local checkpoint and whose it is, then resume as
        mmengine does.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``resume``.
            **kwargs: As for mmengine's ``resume``.

        Returns:
            What mmengine returns.
        """
        with self._verified_while_loading(filename):
            self._resuming = str(filename)
            try:
                return super().resume(filename, *args, **kwargs)
            finally:
                self._resuming = None

    @contextmanager
    def _verified_while_loading(self, filename: str) -> Iterator[None]:
        """Verify ``filename`` in a thread while mmengine loads it.

        Hashing a multi-GB checkpoint costs about what loading it does; the
        two overlap, and nothing loaded is used before the verdict
        (``after_load_checkpoint``, which mmengine calls before it applies
        anything, waits for it).
        """
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
        """Wait for the loaded checkpoint's verification and check a resumed
        one's ``meta`` before mmengine reads it."""
        if fn_name == 'after_load_checkpoint':
            self._wait_for_verification()
        if fn_name == 'after_load_checkpoint' and self._resuming:
            self._logged(self._check_resumable, self._resuming,
                         kwargs['checkpoint'])
        super().call_hook(fn_name, **kwargs)

    def _logged(self, check, *args) -> None:
        # The run's log file, not only stderr, must say why it stopped.
        try:
            check(*args)
        except (CorruptCheckpointError, ForeignCheckpointError,
                CheckpointsInTheWay) as err:
            self.logger.error(str(err))
            raise

    def _check_resumable(self, path: str, checkpoint: Dict) -> None:
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) \
            else None
        missing = [
            key for key in ('epoch', 'iter')
            if not isinstance(meta, dict) or type(meta.get(key)) is not int
        ]
        if missing:
            raise ForeignCheckpointError(
                f'cannot resume {path}: its meta does not say its '
                f'{" and ".join(missing)} (a plain state dict, converted '
                'weights or a classifier checkpoint, not a training '
                'checkpoint). Load weights with load_from and resume=False.')
        if self._resume_chosen:
            return  # auto-resume checked the folder when it chose
        folder = runner_checkpoint_folder(self)
        record = read_record(folder)
        entry = record.find(path)
        own = entry is not None and entry.run_id == record.run_id
        problems = [] if own else identity_problems(
            meta, record.run_id, runner_config_digest(self))
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
