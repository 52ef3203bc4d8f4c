"""Random state as a function of the training position, so resume is exact."""
import logging
import random
from contextlib import contextmanager
from typing import Iterator, List

import numpy as np
import torch
from mmcv.transforms import CenterCrop, LoadImageFromFile, Resize
from mmengine.dataset import Compose
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmpretrain.datasets.transforms import (Collect, PackInputs, ResizeEdge,
                                            Transpose)
from torch.utils.data import get_worker_info

from mmae_plugin.utils.validation import check_bool

#: Value of the shared epoch while the training loop is not running: the
#: pipeline then draws from the caller's streams (e.g. a hook's fixed seed).
INACTIVE = -1
#: Transforms that draw no random numbers (exact types: a subclass may).
#: A pipeline made only of these is not re-seeded per sample, which costs
#: more than the rest of such a pipeline (Fashion-MNIST pretraining:
#: 110 vs 16 ms of CPU per 256-image batch in the main process).
DETERMINISTIC_TRANSFORMS = (CenterCrop, Collect, LoadImageFromFile, PackInputs,
                            Resize, ResizeEdge, Transpose)


def derive_seed(*keys: int) -> int:
    """A 32-bit seed mixed from a tuple of integers.

    ``numpy.random.SeedSequence`` mixes the keys, so neighbouring positions
    get unrelated streams.
    """
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])


def seed_everything(*keys: int) -> None:
    """Seed Python, numpy and torch (all devices) from a tuple of integers."""
    seed = derive_seed(*keys)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def seed_cpu_streams(seed: int) -> None:
    """Seed Python, numpy and torch's CPU generator (not CUDA's)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.random.default_generator.manual_seed(seed)


@contextmanager
def seeded_cpu_streams(seed: int) -> Iterator[None]:
    """Seed Python, numpy and torch's CPU generator; restore them on exit.

    In the main process restoring keeps the caller's draws independent of how
    many samples were loaded; in a dataloader worker the (~0.15 ms) save and
    restore is skipped.

    Args:
        seed: The seed of the three generators.
    """
    if get_worker_info() is not None:
        seed_cpu_streams(seed)
        yield
        return
    states = (random.getstate(), np.random.get_state(),
              torch.random.default_generator.get_state())
    seed_cpu_streams(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.default_generator.set_state(states[2])


class SampleSeededCompose(Compose):
    """A pipeline whose random draws depend on (seed, epoch, sample index).

    Every call seeds Python's, numpy's and torch's CPU generators from
    ``(seed, epoch, results['sample_idx'])`` before the transforms run. The
    epoch lives in a one-element tensor in shared memory, so dataloader
    workers (persistent ones included, forked or spawned) read the value the
    main process wrote before it handed them the epoch's indices.

    Args:
        transforms: The transforms of the wrapped pipeline.
        seed: Base seed of the data pipeline (the same on every rank).
    """

    def __init__(self, transforms, seed: int) -> None:
        super().__init__(transforms)
        self.seed = int(seed)
        self.epoch = torch.full((1, ), INACTIVE,
                                dtype=torch.int64).share_memory_()

    def __call__(self, results: dict):
        epoch = int(self.epoch[0])
        if epoch == INACTIVE:
            return super().__call__(results)
        seed = derive_seed(self.seed, epoch, int(results['sample_idx']))
        with seeded_cpu_streams(seed):
            return super().__call__(results)


def draws_nothing_at_random(pipeline: Compose) -> bool:
    """Whether every transform of ``pipeline`` is a known deterministic
    one (:data:`DETERMINISTIC_TRANSFORMS`)."""
    return all(
        type(transform) in DETERMINISTIC_TRANSFORMS
        for transform in pipeline.transforms)


def leaf_datasets(dataset) -> List:
    """The datasets that own a pipeline, looking through mmengine wrappers.

    ``ConcatDataset`` keeps ``datasets``; ``RepeatDataset``,
    ``ClassBalancedDataset`` and similar keep ``dataset``.
    """
    if isinstance(getattr(dataset, 'pipeline', None), Compose):
        return [dataset]
    children = getattr(dataset, 'datasets', None)
    if children is None and getattr(dataset, 'dataset', None) is not None:
        children = [dataset.dataset]
    return [leaf for child in children or [] for leaf in leaf_datasets(child)]


@HOOKS.register_module()
class ReseedHook(Hook):
    """Derive every random draw of training from the training position.

    The main process (MAE's masks, batched augmentations) is re-seeded from
    (seed, rank, epoch) before each epoch and (seed, rank, iteration) before
    each iteration; the training dataset's pipeline before each sample from
    (seed, epoch, sample index), in whichever worker or rank loads it. So every
    epoch draws fresh augmentations and a resumed run draws exactly what an
    unbroken run drew. Nothing is added to checkpoints. Use::

        custom_hooks = [dict(type='ReseedHook')]

    Why, the limits (private generators, ``RepeatDataset``,
    ``IterBasedTrainLoop``, datasets without ``sample_idx``) and the cost:
    docs/reliability.md#exact-resume.

    Args:
        reseed_pipeline: Also re-seed the training dataset's pipeline per
            sample. Defaults to True.
    """

    priority = 'HIGHEST'

    def __init__(self, reseed_pipeline: bool = True) -> None:
        self.reseed_pipeline = check_bool(reseed_pipeline, 'reseed_pipeline')
        self._pipelines: List[SampleSeededCompose] = []

    def _keys(self, runner) -> list:
        randomness = runner.cfg.get('randomness', None) or {}
        rank = get_rank() if randomness.get('diff_rank_seed', False) else 0
        return [int(runner.seed), rank]

    def _data_seed(self, runner) -> int:
        """The run's seed without mmengine's per-rank offset."""
        randomness = runner.cfg.get('randomness', None) or {}
        if randomness.get('diff_rank_seed', False):
            return int(runner.seed) - get_rank()
        return int(runner.seed)

    def before_train(self, runner) -> None:
        """Wrap the pipelines before the epoch loop creates any worker."""
        if not self.reseed_pipeline:
            return
        dataset = runner.train_dataloader.dataset
        leaves = leaf_datasets(dataset)
        if not leaves:
            print_log(
                f'ReseedHook: {type(dataset).__name__} has no mmengine '
                'pipeline; its augmentations keep mmengine worker seeds.',
                logger='current',
                level=logging.WARNING)
        random_leaves = []
        for leaf in leaves:
            if draws_nothing_at_random(leaf.pipeline):
                names = [type(t).__name__ for t in leaf.pipeline.transforms]
                print_log(
                    f'ReseedHook: the pipeline of {type(leaf).__name__} '
                    f'({", ".join(names) or "empty"}) draws nothing at '
                    'random; '
                    'not re-seeded per sample.',
                    logger='current')
            else:
                random_leaves.append(leaf)
        self._pipelines = [self._wrap(leaf, runner) for leaf in random_leaves]

    def _wrap(self, dataset, runner) -> SampleSeededCompose:
        if len(dataset) and 'sample_idx' not in dataset.get_data_info(0):
            raise ValueError(
                f'ReseedHook(reseed_pipeline=True) needs the sample_idx that '
                f"mmengine's BaseDataset.get_data_info adds; "
                f'{type(dataset).__name__} does not provide it. Set '
                'reseed_pipeline=False to keep mmengine worker seeds.')
        pipeline = dataset.pipeline
        if isinstance(pipeline, SampleSeededCompose):
            pipeline.seed = self._data_seed(runner)
        else:
            pipeline = SampleSeededCompose(pipeline.transforms,
                                           self._data_seed(runner))
            dataset.pipeline = pipeline
        return pipeline

    def before_train_epoch(self, runner) -> None:
        # Workers receive the epoch's indices only after this returns.
        for pipeline in self._pipelines:
            pipeline.epoch.fill_(runner.epoch)
        seed_everything(*self._keys(runner), 0, runner.epoch)

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        seed_everything(*self._keys(runner), 1, runner.iter)

    def after_train(self, runner) -> None:
        for pipeline in self._pipelines:
            pipeline.epoch.fill_(INACTIVE)
