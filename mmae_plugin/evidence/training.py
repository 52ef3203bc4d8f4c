"""Training of one run in segments, resumable from its last checkpoint.

A segment trains a run from its last checkpoint to the next evaluation
epoch with the real MMEngine ``Runner`` (``resume=True``: mmengine loads
``last_checkpoint`` with the optimizer, scheduler and loop state) and stops
there; the learning-rate schedule is that of the full run (its cosine ends
at the study's last epoch), so a study trained in segments, or killed and
resumed, trains what one uninterrupted run trains (the plugin's
``ReseedHook`` derives every random draw from seed, epoch and iteration).
A checkpoint is written every epoch; those that are neither an evaluation
epoch nor the newest are deleted, so a kill loses at most one epoch.
"""
import os
import os.path as osp
from typing import Iterable, Optional

from mmengine.hooks import Hook

from .study import Arm, Study, checkpoint_epochs


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
        prune_checkpoints(runner.work_dir, self.keep_epochs | {finished})
        if finished >= self.stop_epoch:
            runner.train_loop.stop_training = True


def prune_checkpoints(directory: str, keep: Iterable[int]) -> None:
    """Delete ``epoch_<e>.pth`` (and its sidecar files, e.g. the plugin's
    hidden ``.epoch_<e>.pth.sha256``) for every ``e`` not in ``keep`` but
    the newest (the one a resume needs)."""
    epochs = checkpoint_epochs(directory)
    keep = set(keep) | set(epochs[-1:])
    for epoch in epochs:
        if epoch in keep:
            continue
        name = f'epoch_{epoch}.pth'
        for entry in os.listdir(directory):
            if entry in (name, f'.{name}.sha256') or \
                    entry.startswith(name + '.'):
                os.remove(osp.join(directory, entry))


def training_options(study: Study, arm: Arm, seed: int) -> dict:
    """``--cfg-options`` of one run: the study's budget and the arm's."""
    options = {
        'train_cfg.max_epochs': study.epochs,
        # 1 warm-up epoch, then cosine to the study's last epoch.
        'param_scheduler.1.T_max': study.epochs - 1,
        'param_scheduler.1.end': study.epochs,
        'randomness.seed': seed,
        'default_hooks.checkpoint.interval': 1,
        # Pruning is StopAtEpochHook's: the evaluation epochs are kept.
        'default_hooks.checkpoint.max_keep_ckpts': -1,
        'default_hooks.logger.interval': 50,
    }
    if study.images < 60000:
        options['train_dataloader.dataset.indices'] = study.images
    options.update(dict(arm.options))
    return options


def train_segment(config: str, study: Study, arm: Arm, seed: int,
                  work_dir: str, stop_epoch: int,
                  workers: Optional[int] = None) -> None:
    """Train (or resume) one run up to ``stop_epoch``.

    Args:
        config: The arm's frozen training config.
        study: The study (budget).
        arm: The arm.
        seed: The run's seed.
        work_dir: The run directory (checkpoints, logs).
        stop_epoch: Train until this epoch is finished and saved.
        workers: Dataloader workers (default: the config's).
    """
    from mmengine.config import Config
    from mmengine.runner import Runner

    if not 1 <= stop_epoch <= study.epochs:
        raise ValueError(f'stop_epoch must be in [1, {study.epochs}], got '
                         f'{stop_epoch}')
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(training_options(study, arm, seed))
    if workers is not None:
        cfg.merge_from_dict({'train_dataloader.num_workers': workers,
                             'train_dataloader.persistent_workers':
                             workers > 0})
    cfg.work_dir = work_dir
    cfg.resume = True  # from last_checkpoint when there is one
    cfg.load_from = None
    runner = Runner.from_cfg(cfg)
    runner.register_hook(StopAtEpochHook(stop_epoch, study.eval_epochs),
                         priority='LOWEST')
    runner.train()
