"""Report the steps in which M-MAE / U-MAE's regulariser was skipped.

``MMAE`` logs its regulariser's ``skip_code`` every step as ``reg_skipped``
(0: the term was applied). A step whose features were unusable (NaN/Inf on
some rank) trained on the reconstruction alone; a step whose gather left
some rank's features out means the ranks' batches no longer fit the layout
agreed at the first step, which later steps cannot repair. This hook reads
the code as a host number where the log has it: from
:class:`~.deferred_runtime_info_hook.DeferredRuntimeInfoHook` (the
plugin's configs) as each step's values are settled, one step late, or
from the message hub after each iteration, where mmengine's
``RuntimeInfoHook`` (priority ``VERY_HIGH``) has already put it. It adds
no device sync and the model's forward depends only on its inputs and
state.
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
    :class:`~mmae_plugin.models.losses.FeatureRegularizer` (``MMAE`` with
    ``TCRLoss`` or ``UniformityLoss``), the iteration's ``reg_skipped`` code
    decides:

    * 0: nothing to say;
    * ``SKIP_GATHER_REFUSED``: a ``RuntimeError`` naming the iteration and
      the reason. Every rank logged the same code from the same gathered
      headers, so every rank raises, before the next step's collectives;
    * any other code: one warning naming the iteration, the ranks concerned
      and the reason (the step trained on the reconstruction alone).

    A model without a regulariser logs no code; the hook then does nothing.
    The shipped M-MAE / U-MAE configs select it as a default hook::

        default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
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
