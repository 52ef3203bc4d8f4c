"""Random state as a function of the training position, so resume is exact."""
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


def seed_everything(*keys: int) -> None:
    """Seed Python, numpy and torch (all devices) from a tuple of integers.

    ``numpy.random.SeedSequence`` mixes the keys, so neighbouring positions
    get unrelated streams.
    """
    seed = int(np.random.SeedSequence(list(keys)).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@HOOKS.register_module()
class ReseedHook(Hook):
    """Derive every random draw from (seed, rank, epoch, iteration).

    mmengine 0.10.7 seeds once at start-up and does not store generator
    states in checkpoints, so after ``--resume`` MAE's random masks and the
    augmentations drawn in the main process differ from those of an
    uninterrupted run. Re-seeding at the start of every epoch (before the
    dataloader iterator and its worker seeds are created) and of every
    iteration from the run's seed and the position makes a resumed run draw
    exactly what an unbroken run draws, with nothing added to checkpoints
    and no collective communication. Ranks get different streams when the
    config's ``randomness.diff_rank_seed`` is true, the same ones otherwise.
    Dataloader workers keep their own generators, which mmengine re-seeds
    identically each epoch unless ``persistent_workers=True``.
    """

    priority = 'HIGHEST'

    def _keys(self, runner) -> list:
        randomness = runner.cfg.get('randomness', None) or {}
        rank = get_rank() if randomness.get('diff_rank_seed', False) else 0
        return [int(runner.seed), rank]

    def before_train_epoch(self, runner) -> None:
        seed_everything(*self._keys(runner), 0, runner.epoch)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        seed_everything(*self._keys(runner), 1, runner.iter)
