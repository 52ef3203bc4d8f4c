"""Report the steps in which M-MAE / U-MAE's regulariser was skipped.

Reads ``MMAE``'s logged ``reg_skipped`` code as a host number where the log
has it (from ``DeferredRuntimeInfoHook`` one step late, or from the
message hub), so it adds no device sync.
"""
import logging
from typing import Optional, Union

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmae_plugin.models.algorithms.mmae import SKIP_KEY
from mmae_plugin.models.losses.feature_regularizer import (SKIP_GATHER_REFUSED,
                                                           FeatureRegularizer)
from .deferred_runtime_info_hook import LoggedStep, deferred_runtime_info_hook


@HOOKS.register_module()
class RegularizerSkipHook(Hook):
    """Warn about a skipped regulariser term; raise when a gather refused.

    After every training iteration of a model with a
    :class:`~mmae_plugin.models.losses.FeatureRegularizer`, the iteration's
    ``reg_skipped`` code decides: 0, nothing; ``SKIP_GATHER_REFUSED``, a
    ``RuntimeError`` on every rank before the next step's collectives; any
    other code, one warning naming the iteration, ranks and reason. A model
    without a regulariser logs no code. The shipped M-MAE / U-MAE configs
    select it::

        default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))

    The codes: docs/reliability.md#no-host-sync-in-the-training-step.
    """

    # After RuntimeInfoHook (VERY_HIGH) has read the step's logged values,
    # before CheckpointHook (VERY_LOW) saves.
    priority = 'HIGH'

    def __init__(self) -> None:
        self._regularizer: Optional[FeatureRegularizer] = None
        self._deferred = None

    def before_run(self, runner) -> None:
        """Find the model's regulariser (None: nothing to report)."""
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        regularizer = getattr(model, 'regularizer', None)
        self._regularizer = regularizer if isinstance(
            regularizer, FeatureRegularizer) else None

    def before_train(self, runner) -> None:
        """Follow a :class:`DeferredRuntimeInfoHook`'s settled steps."""
        self._deferred = deferred_runtime_info_hook(runner)
        if self._deferred is not None:
            self._deferred.subscribe(self.report_step)

    def report_step(self, runner, step: LoggedStep) -> None:
        """Report a settled step's skip code (if the model logs one)."""
        if self._regularizer is not None and SKIP_KEY in step.values:
            self.report(int(step.values[SKIP_KEY]), step.iteration)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Optional[Union[dict, tuple, list]] = None,
                         outputs: Optional[dict] = None) -> None:
        """With upstream's ``RuntimeInfoHook``: report the iteration's skip
        code from the message hub."""
        if self._regularizer is None or self._deferred is not None:
            return
        buffer = runner.message_hub.log_scalars.get(f'train/{SKIP_KEY}')
        if buffer is None:
            return
        self.report(int(buffer.current()), runner.iter + 1)

    def report(self, code: int, iteration: int) -> None:
        """Raise or warn for one step's skip code.

        Args:
            code: The regulariser's ``skip_code`` of the step (0: applied).
            iteration: The step's 1-based training iteration.
        """
        regularizer = self._regularizer
        if code == SKIP_GATHER_REFUSED:
            raise RuntimeError(
                f'{regularizer.loss_name} could not gather the features '
                f'of every rank at training iteration {iteration}: '
                f'{regularizer.skip_reason(code)}')
        if code:
            everywhere = ('this rank'
                          if regularizer.gather == 'local' else 'every rank')
            print_log(
                f'{regularizer.loss_name} was skipped (a zero with zero '
                f'gradient) at training iteration {iteration} on '
                f'{everywhere}: {regularizer.skip_reason(code)}',
                logger='current',
                level=logging.WARNING)
