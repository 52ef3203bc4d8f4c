"""Training of one run in segments, resumable from its last checkpoint.

A segment trains a run from its last checkpoint to the next evaluation
epoch with the config's runner (``resume=True``: mmengine, or the plugin's
``MMAERunner``, loads the newest checkpoint with the optimizer, scheduler
and loop state) and stops there; the learning-rate schedule is that of the
full run (it ends at the comparison's last epoch), so a run trained in
segments, or killed and resumed, trains what one uninterrupted run trains
(the plugin's ``ReseedHook`` derives every random draw from seed, epoch
and iteration). A checkpoint is written every epoch; those that are neither
an evaluation epoch nor the newest are deleted, so a kill loses at most one
epoch.
"""
import copy
import logging
from typing import Any, Dict, Iterable, List

from mmengine.hooks import Hook

from .spec import Arm, Comparison


class StopAtEpochHook(Hook):
    """Ends training after epoch ``stop_epoch`` and prunes checkpoints.

    Runs after mmengine's ``CheckpointHook`` (priority ``'LOWEST'``), so the
    checkpoint of the stopping epoch and the ``last_checkpoint`` pointer to
    it are on disk when the loop stops.

    Args:
        stop_epoch: Last epoch (1-based) this segment trains.
        keep_epochs: Epochs whose checkpoints are never deleted.
    """
    priority = 'LOWEST'

    def __init__(self, stop_epoch: int, keep_epochs: Iterable[int]) -> None:
        self.stop_epoch = stop_epoch
        self.keep_epochs = set(keep_epochs)

    def after_train_epoch(self, runner) -> None:
        finished = runner.epoch + 1  # runner.epoch is 0-based here
        from mmae_plugin.engine.runners.resume_gate import \
            runner_checkpoint_folder
        prune_checkpoints(
            runner_checkpoint_folder(runner), self.keep_epochs | {finished})
        if finished >= self.stop_epoch:
            runner.train_loop.stop_training = True


def prune_checkpoints(directory: str, keep: Iterable[int]) -> None:
    """Remove the run's recorded checkpoints of every epoch not in ``keep``
    but the newest (the one a resume needs), each marked removed in the run
    record before its file goes, through the checkpoint hook's own
    retention (:func:`mmae_plugin.checkpoint.retention.retire`). Files the
    record does not name are left alone.

    Args:
        directory: The run folder.
        keep: Epochs whose checkpoints stay.
    """
    from mmengine.dist import is_main_process
    from mmengine.logging import print_log

    from mmae_plugin.checkpoint.retention import retire
    from mmae_plugin.checkpoint.run_record import read_record
    record = read_record(directory)
    if not is_main_process() or not record.exists:
        return
    entries = sorted(record.checkpoints(), key=lambda e: (e.iter, e.epoch))
    keep = set(keep) | {e.epoch for e in entries[-1:]}
    for sentence in retire([e for e in entries if e.epoch not in keep]):
        print_log(sentence, logger='current', level=logging.WARNING)


def fit_schedule(schedulers: List[dict], old_epochs: int,
                 epochs: int) -> List[dict]:
    """The config's epoch-based schedule stretched to end at ``epochs``.

    Every scheduler that ran to the config's last epoch now ends at
    ``epochs`` (a cosine's ``T_max`` is its new length); warm-ups and
    other early schedulers are kept as they are, cut at ``epochs``; one
    that would begin at or after ``epochs`` is dropped (it never runs).

    Args:
        schedulers: The config's ``param_scheduler`` list.
        old_epochs: The config's ``train_cfg.max_epochs``.
        epochs: The comparison's epochs.

    Returns:
        The new list (the input is not changed).
    """
    fitted = []
    for scheduler in copy.deepcopy(schedulers):
        if not scheduler.get('by_epoch', True):
            fitted.append(scheduler)
            continue
        begin = scheduler.get('begin', 0)
        if begin >= epochs:
            continue
        if scheduler.get('end', old_epochs) >= old_epochs:
            scheduler['end'] = epochs
            if 'T_max' in scheduler:
                scheduler['T_max'] = epochs - begin
        elif scheduler.get('end', old_epochs) > epochs:
            scheduler['end'] = epochs
        fitted.append(scheduler)
    return fitted


def training_options(spec: Comparison, arm: Arm, seed: int) -> Dict[str, Any]:
    """``--cfg-options`` of one run: the comparison's budget, its common
    options, then the arm's own."""
    options = {
        'train_cfg.max_epochs': spec.epochs,
        'randomness.seed': seed,
        'default_hooks.checkpoint.interval': 1,
        # Pruning is StopAtEpochHook's: the evaluation epochs are kept.
        'default_hooks.checkpoint.max_keep_ckpts': -1,
    }
    if spec.images is not None:
        options['train_dataloader.dataset.indices'] = spec.images
    options.update(dict(spec.cfg_options))
    options.update(dict(arm.options))
    return options


def train_segment(config: str,
                  spec: Comparison,
                  arm: Arm,
                  seed: int,
                  work_dir: str,
                  stop_epoch: int,
                  launcher: str = 'none') -> None:
    """Train (or resume) one run up to ``stop_epoch``.

    Args:
        config: The arm's frozen training config.
        spec: The comparison (budget).
        arm: The arm.
        seed: The run's seed.
        work_dir: The run directory (checkpoints, logs).
        stop_epoch: Train until this epoch is finished and saved.
        launcher: mmengine's launcher (``'slurm'`` for one process per GPU
            of a Slurm job).
    """
    from mmengine.config import Config

    from mmae_plugin.engine.runners.build import build_runner

    if not 1 <= stop_epoch <= spec.epochs:
        raise ValueError(f'stop_epoch must be in [1, {spec.epochs}], got '
                         f'{stop_epoch}')
    cfg = Config.fromfile(config)
    old_epochs = cfg.train_cfg.get('max_epochs', spec.epochs)
    cfg.param_scheduler = fit_schedule(
        cfg.get('param_scheduler') or [], old_epochs, spec.epochs)
    cfg.merge_from_dict(training_options(spec, arm, seed))
    cfg.work_dir = work_dir
    cfg.launcher = launcher
    cfg.resume = True  # from the newest checkpoint when there is one
    cfg.load_from = None
    # One name per segment: mmengine's logger, message hub and visualizer
    # are per-name instances, and segments run in one process.
    cfg.experiment_name = f'{arm.name}_seed{seed}_to_epoch{stop_epoch}'
    runner = build_runner(cfg)
    runner.register_hook(
        StopAtEpochHook(stop_epoch, spec.eval_epochs), priority='LOWEST')
    runner.train()
