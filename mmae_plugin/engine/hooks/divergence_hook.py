"""Stop training at the first iteration whose total loss is not finite.

:class:`DivergenceHook` raises :class:`TrainingDivergedError`, naming every
loss term and its value, after the first iteration whose total loss is NaN
or infinite, before any checkpoint of it is written. Every rank stops in
the same iteration: the step's logged values of all ranks are summed in one
device all-reduce (:func:`~.deferred_runtime_info_hook.value_table`), read
on the host with :class:`~.deferred_runtime_info_hook.
DeferredRuntimeInfoHook`'s one copy per step (one step late), so no host
read is added. Use::

    custom_hooks = [dict(type='DivergenceHook')]

Why: docs/reliability.md#diverging-runs-stop-at-the-first-non-finite-loss.
"""
import math
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from mmengine.hooks import Hook, RuntimeInfoHook
from mmengine.registry import HOOKS

from .deferred_runtime_info_hook import (LoggedStep,
                                         deferred_runtime_info_hook,
                                         value_table)


class TrainingDivergedError(FloatingPointError):
    """The total training loss became NaN or infinite."""


def total_loss(values: Dict[str, float]) -> Optional[float]:
    """The total loss mmengine optimised, from the logged values.

    Args:
        values: The iteration's logged values.

    Returns:
        ``values['loss']`` (``BaseModel.parse_losses`` puts the sum of the
        ``*loss*`` terms there); without it, the sum of the ``*loss*`` terms;
        None if there is none.
    """
    if 'loss' in values:
        return values['loss']
    terms = [value for key, value in values.items() if 'loss' in key]
    return sum(terms) if terms else None


def recent_totals(message_hub, count: int = 4) -> List[float]:
    """The total loss of the last ``count`` iterations, oldest first.

    Args:
        message_hub: ``runner.message_hub``.
        count: How many.

    Returns:
        Logged values of ``train/loss`` (Python floats), possibly fewer.
    """
    history = message_hub.log_scalars.get('train/loss')
    if history is None:
        return []
    return [float(v) for v in history.data[0][-count:]]


def divergence_message(values: Dict[str, float],
                       iteration: int,
                       epoch: int,
                       recent: Sequence[float] = (),
                       checkpoint: Optional[str] = None,
                       ranks: Sequence[int] = (),
                       world_size: int = 1) -> str:
    """The error text: where training diverged and every term's value.

    Args:
        values: The iteration's logged values (of the first diverged rank).
        iteration: 1-based iteration number (as the log shows it).
        epoch: 1-based epoch number.
        recent: Total losses of the last iterations, this one last (left
            out when empty).
        checkpoint: The newest checkpoint of the run, None if it has none.
        ranks: The ranks whose total loss is not finite (named when
            ``world_size`` > 1).
        world_size: Number of ranks.

    Returns:
        The message.
    """
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    good = {k: v for k, v in values.items() if math.isfinite(v)}

    def listing(terms: Dict[str, float]) -> str:
        return ', '.join(f'{k}={v:.6g}' for k, v in terms.items()) or 'none'

    where = terms_of = ''
    if world_size > 1:
        where = f' on rank{"s" if len(ranks) > 1 else ""} ' \
            f'{", ".join(map(str, ranks))} of {world_size}'
        terms_of = f' (rank {ranks[0]})'
    trend = ' -> '.join(f'{v:.4g}' for v in recent)
    trend = f' Total loss over the last iterations: {trend}.' if trend else ''
    restart = f'Resume from the newest checkpoint, {checkpoint},' \
        if checkpoint else 'The run has no checkpoint yet: start it again'
    return (f'training diverged at iteration {iteration} (epoch {epoch}): '
            f'the total loss is not finite{where}. Non-finite '
            f'terms{terms_of}: {listing(bad)}; finite terms: {listing(good)}.'
            f'{trend} No checkpoint of this iteration '
            'was written (and SafeCheckpointHook writes only finite states). '
            f'{restart} with a lower optim_wrapper.optimizer.lr, a longer '
            'warm-up or optim_wrapper.clip_grad.')


def diverged_ranks(per_rank: Dict[str, List[float]]) -> List[int]:
    """The ranks whose total loss is not finite.

    Args:
        per_rank: ``{key: [value of rank 0, rank 1, ...]}``.

    Returns:
        Their ranks, in order.
    """
    ranks = []
    for rank in range(len(next(iter(per_rank.values()), []))):
        total = total_loss({k: v[rank] for k, v in per_rank.items()})
        if total is not None and not math.isfinite(total):
            ranks.append(rank)
    return ranks


# In mmengine's registry too: the hook serves any MMEngine config, whatever
# its default_scope (mmpretrain's registry finds it through its parent).
@HOOKS.register_module()
class DivergenceHook(Hook):
    """Raise :class:`TrainingDivergedError` on a non-finite total loss.

    Add it to any MMEngine/MMPretrain training config::

        custom_hooks = [dict(type='DivergenceHook')]

    It needs a ``RuntimeInfoHook`` (mmengine's default, or the plugin's
    :class:`DeferredRuntimeInfoHook`), whose logged values it reads.
    """

    # After RuntimeInfoHook (VERY_HIGH) has stored this iteration's values,
    # before LoggerHook (BELOW_NORMAL) and CheckpointHook (VERY_LOW).
    priority = 'HIGH'

    def __init__(self) -> None:
        self._deferred = None

    def before_train(self, runner) -> None:
        """Check that a ``RuntimeInfoHook`` runs before this hook; follow a
        :class:`DeferredRuntimeInfoHook`'s settled steps.

        Args:
            runner: The runner.

        Raises:
            ValueError: No ``RuntimeInfoHook``, or one running after us.
        """
        hooks = list(runner.hooks)
        runtime_info = [
            i for i, h in enumerate(hooks) if isinstance(h, RuntimeInfoHook)
        ]
        if not runtime_info or runtime_info[0] > hooks.index(self):
            raise ValueError(
                'DivergenceHook reads the loss values RuntimeInfoHook logs '
                'each iteration, so default_hooks must keep runtime_info '
                '(RuntimeInfoHook or DeferredRuntimeInfoHook) with a higher '
                f'priority than HIGH; got hooks '
                f'{[type(h).__name__ for h in hooks]}')
        self._deferred = deferred_runtime_info_hook(runner)
        if self._deferred is not None:
            self._deferred.subscribe(self.check_step, every_rank=True)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        """With upstream's ``RuntimeInfoHook``: check this step now.

        (With :class:`DeferredRuntimeInfoHook` :meth:`check_step` is called
        as each step is settled.)

        Args:
            runner: The runner.
            batch_idx: Index of the batch in the epoch.
            data_batch: The batch (unused).
            outputs: The model's ``log_vars`` of this iteration.
        """
        if getattr(self, '_deferred', None) is not None or not outputs:
            return
        table = value_table(outputs, every_rank=True)
        if table is None:
            return
        every_rank = replace(table, data=table.data.cpu()).columns()
        # check_step reads only every rank's values, so the step carries
        # no copy of the logged values.
        self.check_step(
            runner,
            LoggedStep(runner.iter + 1, runner.epoch + 1, {}, every_rank))

    def check_step(self, runner, step: LoggedStep) -> None:
        """Raise on every rank if some rank's total loss is not finite.

        Args:
            runner: The runner.
            step: A step's logged values with every rank's values.

        Raises:
            TrainingDivergedError: Some rank's total loss is not finite.
        """
        per_rank = step.every_rank
        ranks = diverged_ranks(per_rank)
        if not ranks:
            return
        world_size = len(next(iter(per_rank.values())))
        # The trend is this rank's history: named only on a single rank,
        # so that every rank raises the same text.
        recent = recent_totals(runner.message_hub) if world_size == 1 else ()
        message = divergence_message(
            {key: values[ranks[0]]
             for key, values in per_rank.items()},
            step.iteration, step.epoch, recent,
            runner.message_hub.get_info('last_ckpt'), ranks, world_size)
        runner.logger.error(message)  # the run's log file, not only
        raise TrainingDivergedError(message)  # the traceback on stderr
