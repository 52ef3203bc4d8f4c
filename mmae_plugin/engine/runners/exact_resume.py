"""Resume inside an epoch where the checkpoint was written.

mmengine 0.10.7's ``EpochBasedTrainLoop`` restarts the current epoch from
its first batch, so a mid-epoch iteration checkpoint trained the epoch's
first batches again. :class:`ExactResumeEpochBasedTrainLoop` (``LOOPS``)
is mmengine's loop, except that the first epoch a resumed run trains skips,
at the sampler (:class:`SkipFirstIndices`), the ``iter - epoch *
len(dataloader)`` batches it had consumed, on every rank alike, and passes
hooks the true batch index; nothing is added to checkpoints. With
mmengine's own ``Runner``::

    train_cfg = dict(type='ExactResumeEpochBasedTrainLoop', max_epochs=...)

:class:`ExactResumeMixin` (in the plugin's runners) builds that loop
wherever the config asks for mmengine's ``EpochBasedTrainLoop``; other
loops are built as configured (a custom epoch loop gets a warning that it
restarts the epoch). A mid-epoch resume with a batch sampler other than
torch's ``BatchSampler``, or none, raises :class:`InexactResumeError`
before anything trains. Details and limits:
docs/reliability.md#resuming-inside-an-epoch.
"""
import logging
from contextlib import contextmanager
from itertools import islice
from typing import Any, Dict, Iterator, Sized, Union

from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import BaseLoop, EpochBasedTrainLoop
from torch.utils.data import BatchSampler, DataLoader, Sampler


class InexactResumeError(RuntimeError):
    """A mid-epoch resume whose consumed batches cannot be skipped."""


class SkipFirstIndices(Sampler):
    """A sampler that yields all but the first ``count`` indices of another.

    The skipped indices are drawn from the wrapped sampler's iterator and
    dropped, so the rest follow in the wrapped sampler's order and no
    dataset item is read for them. ``len`` stays the wrapped sampler's, so
    ``len(dataloader)`` keeps meaning the epoch's length for the hooks;
    other attributes (``set_epoch``, ``seed``...) are the wrapped sampler's.

    Args:
        sampler: The sampler of the epoch.
        count: Indices to drop from the start.
    """

    def __init__(self, sampler: Sized, count: int) -> None:
        self.sampler = sampler
        self.count = int(count)

    def __iter__(self) -> Iterator[int]:
        return islice(iter(self.sampler), self.count, None)

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks; ``__dict__`` keeps a
        # half-built (copied, unpickled) wrapper from recursing here.
        if 'sampler' not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__['sampler'], name)


def skippable_batch_sampler(dataloader: DataLoader) -> BatchSampler:
    """The batch sampler whose batches are consecutive sampler indices.

    Args:
        dataloader: The training dataloader.

    Returns:
        Its ``batch_sampler``, a torch ``BatchSampler`` (or a subclass that
        batches as it does).

    Raises:
        InexactResumeError: For any other batch sampler, or none.
    """
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    if isinstance(batch_sampler, BatchSampler) and \
            type(batch_sampler).__iter__ is BatchSampler.__iter__:
        return batch_sampler
    name = type(batch_sampler).__name__ if batch_sampler is not None else \
        'no batch sampler (batch_size=None)'
    raise InexactResumeError(
        f'cannot resume inside an epoch with {name}: the batches the epoch '
        "already trained can be skipped only under torch's BatchSampler, "
        'whose batches are consecutive indices of the sampler. Resume from '
        'an epoch checkpoint, or use the default batch sampler.')


@contextmanager
def skipping_first_batches(dataloader: DataLoader,
                           batches: int) -> Iterator[None]:
    """Make the dataloader's next pass skip its first ``batches`` batches.

    The batch sampler draws from :class:`SkipFirstIndices` until the block
    exits (a started pass keeps its sampler iterator; persistent workers
    take indices from the main process's batch sampler).

    Args:
        dataloader: The training dataloader.
        batches: Batches to skip; 0 changes nothing.

    Yields:
        Nothing.
    """
    if batches == 0:
        yield
        return
    batch_sampler = skippable_batch_sampler(dataloader)
    sampler = batch_sampler.sampler
    # ``DataLoader`` forbids replacing its samplers; the batch sampler's
    # ``sampler`` is an ordinary attribute, read when a pass starts.
    batch_sampler.sampler = SkipFirstIndices(
        sampler, batches * batch_sampler.batch_size)
    try:
        yield
    finally:
        batch_sampler.sampler = sampler


def batches_done_in_epoch(loop: EpochBasedTrainLoop) -> int:
    """Batches of the current epoch trained before the loop's iteration.

    Args:
        loop: An epoch loop (resumed or not).

    Returns:
        ``iter - epoch * len(dataloader)``: 0 at an epoch's start, the
        epoch's length after its last batch when the epoch counter has not
        advanced yet; outside that range when the checkpoint does not fit
        this dataloader.
    """
    return loop.iter - loop.epoch * len(loop.dataloader)


@LOOPS.register_module()
class ExactResumeEpochBasedTrainLoop(EpochBasedTrainLoop):
    """mmengine's ``EpochBasedTrainLoop`` that resumes inside an epoch.

    Takes the arguments of ``EpochBasedTrainLoop``; see the module.
    """

    _skip_batches = 0  # to skip in the next epoch (the resumed one)
    _batch_offset = 0  # true batch index of the epoch's first batch

    def run(self) -> Any:
        """Decide the resumed epoch's skip, then train as mmengine does.

        Returns:
            What mmengine's ``run`` returns (the model).
        """
        self._skip_batches = self._resumed_batches()
        return super().run()

    def run_epoch(self) -> None:
        """Run one epoch, skipping the resumed epoch's trained batches."""
        self._batch_offset, self._skip_batches = self._skip_batches, 0
        try:
            with skipping_first_batches(self.dataloader, self._batch_offset):
                super().run_epoch()
        finally:
            self._batch_offset = 0

    def run_iter(self, idx: int, data_batch: Any) -> None:
        """Train one batch, passing hooks its position in the epoch.

        Args:
            idx: Index of the batch in this pass of the dataloader.
            data_batch: The batch.
        """
        super().run_iter(idx + self._batch_offset, data_batch)

    def _resumed_batches(self) -> int:
        done, length = batches_done_in_epoch(self), len(self.dataloader)
        if done == 0:
            return 0
        if not 0 < done <= length:
            print_log(
                f'resumed at iteration {self.iter} in epoch {self.epoch + 1}'
                f', which does not fall inside that epoch at {length} '
                'batches per epoch (a checkpoint of another dataloader '
                'length): the epoch restarts from its first batch.',
                logger='current',
                level=logging.WARNING)
            return 0
        try:
            skippable_batch_sampler(self.dataloader)  # before any training
        except InexactResumeError as err:
            print_log(str(err), logger='current', level=logging.ERROR)
            raise
        rest = f'the epoch continues at batch {done + 1}' if done < length \
            else 'no batch is left: only the epoch-end hooks run'
        print_log(
            f'resumed inside epoch {self.epoch + 1} after {done} of its '
            f'{length} batches: the sampler skips them (no sample of theirs '
            f'is loaded) and {rest}.',
            logger='current')
        return done


def exact_resume_loop_cfg(loop: Dict) -> Dict:
    """The loop config with mmengine's epoch loop replaced by the plugin's.

    Args:
        loop: A ``train_cfg`` dict.

    Returns:
        A new config of type :class:`ExactResumeEpochBasedTrainLoop` if
        ``loop`` selects mmengine's ``EpochBasedTrainLoop`` (``by_epoch``
        true, or that type); ``loop`` itself otherwise.
    """
    if 'type' in loop and 'by_epoch' in loop:
        return loop  # mmengine's error says why
    if 'by_epoch' in loop:
        if not loop['by_epoch']:
            return loop
        loop = {k: v for k, v in loop.items() if k != 'by_epoch'}
    elif not _is_upstream_epoch_loop(loop.get('type')):
        return loop
    return dict(loop, type=ExactResumeEpochBasedTrainLoop)


def _is_upstream_epoch_loop(loop_type: Any) -> bool:
    if isinstance(loop_type, str):
        # Resolved as LOOPS.build will: in the current default scope.
        with LOOPS.switch_scope_and_registry(None) as registry:
            loop_type = registry.get(loop_type)
    return loop_type is EpochBasedTrainLoop


class ExactResumeMixin:
    """Runner behaviour: resume inside an epoch exactly (see module).

    Goes before mmengine's ``Runner`` or ``FlexibleRunner`` in the bases,
    and before any mixin whose ``resume`` changes the loop's counters.
    """

    def build_train_loop(self, loop: Union[BaseLoop, Dict]) -> BaseLoop:
        """Build the loop as mmengine does, mmengine's epoch loop replaced
        by :class:`ExactResumeEpochBasedTrainLoop`.

        Args:
            loop: The ``train_cfg`` dict or a built loop.

        Returns:
            The training loop.
        """
        if isinstance(loop, dict):
            loop = exact_resume_loop_cfg(loop)
        return super().build_train_loop(loop)

    def resume(self, filename: str, *args, **kwargs) -> Any:
        """Resume as mmengine does; warn when a custom epoch loop will
        restart the epoch the checkpoint was written in.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``resume``.
            **kwargs: As for mmengine's ``resume``.

        Returns:
            What mmengine returns.
        """
        result = super().resume(filename, *args, **kwargs)
        loop = self.train_loop
        if isinstance(loop, EpochBasedTrainLoop) and \
                not isinstance(loop, ExactResumeEpochBasedTrainLoop) and \
                batches_done_in_epoch(loop) != 0:
            self.logger.warning(
                f'{filename} was written inside epoch {loop.epoch + 1}; '
                f'the custom loop {type(loop).__name__} restarts that '
                'epoch from its first batch, training its first '
                f'{batches_done_in_epoch(loop)} batches again. Subclass '
                'ExactResumeEpochBasedTrainLoop to resume where it stopped.')
        return result


__all__ = [
    'ExactResumeMixin', 'ExactResumeEpochBasedTrainLoop', 'SkipFirstIndices',
    'InexactResumeError', 'skipping_first_batches', 'exact_resume_loop_cfg'
]
