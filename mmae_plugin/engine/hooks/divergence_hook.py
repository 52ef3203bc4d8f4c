"""Stop training at the first iteration whose total loss is not finite.

mmengine 0.10.7 trains on through ``loss: nan`` to the last epoch, exits 0
and saves checkpoints full of NaN; M-MAE fails a few iterations later deep
in its matrix code, naming neither the diverging term nor the divergence.
:class:`DivergenceHook` raises :class:`TrainingDivergedError` in
``after_train_iter`` of the first iteration whose total loss is NaN or
infinite, with every loss term and its value. It runs before
``CheckpointHook`` (priority ``VERY_LOW``) and ``LoggerHook``, so no
checkpoint of that iteration, or of any later one, is written. A state
that turns non-finite in an update whose loss was still finite is kept
off disk by ``SafeCheckpointHook``, which checks the parameters and the
optimizer state themselves at every save.

No host sync is added: mmengine's ``RuntimeInfoHook`` (priority
``VERY_HIGH``, so it runs first) already converts every value of the
iteration's ``log_vars`` to a Python float with ``.item()``
(``MessageHub.update_scalar`` -> ``_get_valid_value``) every iteration, and
this hook reads those floats back from ``runner.message_hub``.
"""
import math
from typing import Dict, List, Optional, Sequence

from mmengine.hooks import Hook, RuntimeInfoHook
from mmengine.registry import HOOKS as MMENGINE_HOOKS


class TrainingDivergedError(FloatingPointError):
    """The total training loss became NaN or infinite."""


def logged_values(message_hub, keys) -> Dict[str, float]:
    """The current iteration's logged values of ``keys``.

    Args:
        message_hub: ``runner.message_hub``.
        keys: Names in the model's ``log_vars`` (``loss``, ``loss_rec``...).

    Returns:
        ``{key: value}`` as ``RuntimeInfoHook`` stored them this iteration
        (Python floats: reading them syncs nothing).
    """
    scalars = message_hub.log_scalars
    return {
        key: float(scalars[f'train/{key}'].current())
        for key in keys if f'train/{key}' in scalars
    }


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
                       checkpoint: Optional[str] = None) -> str:
    """The error text: where training diverged and every term's value.

    Args:
        values: The iteration's logged values.
        iteration: 1-based iteration number (as the log shows it).
        epoch: 1-based epoch number.
        recent: Total losses of the last iterations, this one last.
        checkpoint: The newest checkpoint of the run, None if it has none.

    Returns:
        The message.
    """
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    good = {k: v for k, v in values.items() if math.isfinite(v)}

    def listing(terms: Dict[str, float]) -> str:
        return ', '.join(f'{k}={v:.6g}' for k, v in terms.items()) or 'none'

    trend = ' -> '.join(f'{v:.4g}' for v in recent)
    restart = f'Resume from the newest checkpoint, {checkpoint},' \
        if checkpoint else 'The run has no checkpoint yet: start it again'
    return (f'training diverged at iteration {iteration} (epoch {epoch}): '
            f'the total loss is not finite. Non-finite terms: {listing(bad)}; '
            f'finite terms: {listing(good)}. Total loss over the last '
            f'iterations: {trend or "n/a"}. No checkpoint of this iteration '
            'was written (and SafeCheckpointHook writes only finite states). '
            f'{restart} with a lower optim_wrapper.optimizer.lr, a longer '
            'warm-up or optim_wrapper.clip_grad.')


# In mmengine's registry too: the hook serves any MMEngine config, whatever
# its default_scope (mmpretrain's registry finds it through its parent).
@MMENGINE_HOOKS.register_module()
class DivergenceHook(Hook):
    """Raise :class:`TrainingDivergedError` on a non-finite total loss.

    Add it to any MMEngine/MMPretrain training config::

        custom_hooks = [dict(type='DivergenceHook')]

    It needs mmengine's default ``RuntimeInfoHook`` (present unless
    ``default_hooks`` removes it), whose per-iteration floats it reads.
    """

    # After RuntimeInfoHook (VERY_HIGH) has stored this iteration's values,
    # before LoggerHook (BELOW_NORMAL) and CheckpointHook (VERY_LOW).
    priority = 'HIGH'

    def before_train(self, runner) -> None:
        """Check that ``RuntimeInfoHook`` runs before this hook.

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
                '(RuntimeInfoHook) with a higher priority than HIGH; got '
                f'hooks {[type(h).__name__ for h in hooks]}')

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        """Raise if this iteration's total loss is NaN or infinite.

        Args:
            runner: The runner.
            batch_idx: Index of the batch in the epoch.
            data_batch: The batch (unused).
            outputs: The model's ``log_vars`` of this iteration.

        Raises:
            TrainingDivergedError: The total loss is not finite.
        """
        if not outputs:
            return
        values = logged_values(runner.message_hub, outputs.keys())
        total = total_loss(values)
        if total is not None and not math.isfinite(total):
            message = divergence_message(
                values, runner.iter + 1, runner.epoch + 1,
                recent_totals(runner.message_hub),
                runner.message_hub.get_info('last_ckpt'))
            runner.logger.error(message)  # the run's log file, not only
            raise TrainingDivergedError(message)  # the traceback on stderr
