"""Log matrix-information quantities of the representations during training.

Forward hooks on the branches the loss uses keep the training forward pass's
own outputs on sampled iterations (no second forward pass); the quantities are
computed in float64 after a gather over ranks. Optionally (``heldout=``) a
fixed held-out set is measured once per epoch. The parts live in
``mmae_plugin/engine/monitoring/``: what to tap (``branches``), how
(``taps``), the measurement (``measure``) and
the held-out pass (``heldout``). Design: docs/matrix_info.md.
"""
import logging
from typing import Any, Dict, List, Optional, Sequence, Union

from mmengine.dist import get_world_size
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch import Tensor, nn

# coding_rate stays importable from here (its former home).
from mmae_plugin.matrix_info.coding_rate import coding_rate  # noqa: F401
from mmae_plugin.matrix_info.pooling import check_pooling_name
from mmae_plugin.matrix_info.representation import KERNELS
from mmae_plugin.utils.validation import check_choice, check_int, check_real
from ..monitoring.branches import default_branches
from ..monitoring.heldout import (build_heldout_batches, checked_heldout,
                                  measure_in_place, training_autocast)
from ..monitoring.measure import (FALLBACK_TCR, MAX_ALPHA, checked_tcr,
                                  measure_embeddings, objective_tcr)
from ..monitoring.taps import (BranchTaps, check_row_pairing, checked_branch,
                               checked_branches)


@HOOKS.register_module()
class MatrixInfoHook(Hook):
    """Log matrix entropies, mutual information and divergences of features.

    Every ``interval`` training iterations the hook takes the embeddings of the
    training forward pass, gathers them over ranks and logs them as
    ``<prefix>/<name>`` (``minfo/erank_cov``): the two-branch (Siamese) or
    one-branch (masked modelling) keys of
    :mod:`mmae_plugin.matrix_info.representation`. With ``heldout`` the same
    keys are logged under ``<prefix>_heldout`` for a fixed held-out set,
    before training and after every ``interval``-th epoch.

    Example::

        custom_hooks = [dict(type='MatrixInfoHook', interval=50,
                             heldout=dict(dataset=test_set_with_train_pipeline))]

    The ``LoggerHook`` interval should divide ``interval`` (warned otherwise).
    The default taps per algorithm, every key, the held-out protocol and the
    costs: docs/matrix_info.md#2-matrixinfohook.

    Args:
        interval: Sample every ``interval`` iterations (of the epoch, as the
            ``LoggerHook`` counts them); an integer >= 1.
        branches: Branch specifications (see
            ``monitoring.branches.default_branches``), or
            ``None`` to pick them from the algorithm's class.
        kernel: Matrix the entropies and the effective rank use:
            ``'covariance'`` (d x d, features standardised over the batch:
            centred; keys ``*_cov``) or ``'gram'`` (B x B, l2-normalised
            rows, uncentred; keys ``*_gram``).
        alpha: Renyi order of entropies and mutual information, in
            ``(0, 50]`` (see
            ``monitoring.measure.MAX_ALPHA``).
        pool: Pooling of token outputs for the default one-branch taps,
            ``'cls'``, ``'mean'`` or ``'cls+mean'``; ``None`` follows the
            algorithm (see ``monitoring.branches.default_branches``).
        tcr: Which coding rate is logged: ``'objective'`` (the model's
            ``TCRLoss``; without one the published M-MAE objective),
            ``'reference'`` (``logdet(I + (mu/d) zn^T zn)``) or ``'paper'``
            (``logdet(mu I + zn^T zn)``).
        mu: Coding-rate parameter (in ``(0, 1e300]``) for
            ``tcr='reference'``/``'paper'`` (default 1); must be None with
            ``'objective'``.
        centering: Batch-centre the normalised features first, for
            ``tcr='reference'``/``'paper'`` (default False); must be None
            with ``'objective'``.
        prefix: Non-empty name prefix of the logged scalars.
        cpu_threads: Torch threads while computing on CPU tensors (restored
            afterwards); ``None`` keeps the training setting. Default 1
            (why: docs/matrix_info.md#2-matrixinfohook).
        heldout: ``None`` (default: training batches only) or a dict with
            ``dataset`` (required: an mmpretrain dataset config),
            ``num_batches`` (4), ``batch_size`` (None: the global training
            batch), ``seed`` (0), ``mode`` (``'eval'`` or ``'train'``),
            ``interval`` (1 epoch) and ``at_start`` (True).
    """

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) writes the logs

    def __init__(self,
                 interval: int = 50,
                 branches: Optional[Sequence[dict]] = None,
                 kernel: str = 'covariance',
                 alpha: float = 1.0,
                 pool: Optional[str] = None,
                 tcr: str = 'objective',
                 mu: Optional[float] = None,
                 centering: Optional[bool] = None,
                 prefix: str = 'minfo',
                 cpu_threads: Optional[int] = 1,
                 heldout: Optional[dict] = None) -> None:
        self.interval = check_int(interval, 'interval', minimum=1)
        self.kernel = check_choice(kernel, 'kernel', tuple(KERNELS))
        self.alpha = check_real(
            alpha, 'alpha', minimum=0, strict=True, maximum=MAX_ALPHA)
        self.pool = None if pool is None else check_pooling_name(pool, 'pool')
        self.tcr = checked_tcr(tcr, mu, centering)
        self._tcr = self.tcr or FALLBACK_TCR  # resolved again in before_run
        if not isinstance(prefix, str) or not prefix.strip('/'):
            raise TypeError(f'prefix must be a non-empty string, got '
                            f'{type(prefix).__name__} {prefix!r}')
        self.prefix = prefix.strip('/')
        self.cpu_threads = None if cpu_threads is None else check_int(
            cpu_threads, 'cpu_threads', minimum=1)
        self.branches = checked_branches(branches)
        self.heldout = checked_heldout(heldout)
        # Collated held-out batches (host memory), built in before_train.
        self._heldout_batches: List[Any] = []
        self.heldout_history: List[Dict[str, float]] = []
        # The run's training autocast (before_train), for the held-out pass.
        self._autocast = None
        # The forward hooks on the model's branches, made in before_run.
        self.taps: Optional[BranchTaps] = None

    def before_run(self, runner) -> None:
        """Resolve the branches and the TCR; register the forward hooks."""
        self.after_run(runner)  # idempotent: never tap a module twice
        model = self._model(runner)
        if self.branches is None:
            self.branches = [
                checked_branch(b) for b in default_branches(model, self.pool)
            ]
        check_row_pairing(self.branches, self.kernel)
        self._tcr = self.tcr or objective_tcr(model) or FALLBACK_TCR
        self.taps = BranchTaps(self.branches)
        self.taps.attach(model)

    def before_train(self, runner) -> None:
        """Warn about the logger interval; build and measure the held-out set.
        """
        self._warn_on_logger_interval(runner)
        if self.heldout is None:
            return
        self._autocast = training_autocast(runner.optim_wrapper)
        self._heldout_batches = self._build_heldout(runner)
        # A resumed run (iter > 0) measured its start epoch before it stopped.
        if self.heldout.at_start and runner.iter == 0:
            self._log_heldout(runner, epoch=0)

    def before_train_iter(
            self,
            runner,
            batch_idx: int,
            data_batch: Optional[Union[dict, tuple, list]] = None) -> None:
        """Arm the forward hooks on sampled iterations."""
        self.taps.clear()
        self.taps.armed = self.every_n_inner_iters(batch_idx, self.interval)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Optional[Union[dict, tuple, list]] = None,
                         outputs: Optional[dict] = None) -> None:
        """Compute and log the quantities of the recorded embeddings."""
        if not self.taps.armed:
            return
        self.taps.armed = False
        values = self.compute(self.taps.embeddings())
        self.taps.clear()
        self._log_training_values(runner, values)

    def after_train_epoch(self, runner) -> None:
        """Measure the held-out set every ``interval`` epochs and at the end.
        """
        if self.heldout is None:
            return
        if (self.every_n_epochs(runner, self.heldout.interval)
                or self.is_last_train_epoch(runner)):
            self._log_heldout(runner, epoch=runner.epoch + 1)

    def after_run(self, runner) -> None:
        """Remove the forward hooks."""
        if self.taps is not None:
            self.taps.detach()

    def compute(self,
                embeddings: List[Tensor],
                gather: bool = True) -> Dict[str, Tensor]:
        """Gather the embeddings over ranks and compute the quantities.

        Args:
            embeddings: Local (N, C) embeddings of one or two branches.
            gather: Gather the rows of every rank first (training batches);
                False for the held-out set, which every rank has whole.

        Returns:
            Scalars by name (float64 tensors).
        """
        return measure_embeddings(embeddings, self.kernel, self.alpha,
                                  self._tcr, self.cpu_threads, gather)

    def heldout_batch_size(self, runner) -> int:
        """Images per held-out batch: the setting, or the global batch."""
        if self.heldout.batch_size is not None:
            return self.heldout.batch_size
        return runner.train_dataloader.batch_size * get_world_size()

    def measure_heldout(self, model: nn.Module) -> Dict[str, float]:
        """The quantities of the held-out set, averaged over its batches.

        Args:
            model: The runner's model, wrapped (DDP, FSDP) or not; left as
                it was (see ``monitoring.heldout.measure_in_place``).

        Returns:
            ``{name: value}`` with the keys of the training-batch values.
        """
        if not self._heldout_batches:
            raise RuntimeError('MatrixInfoHook: the held-out set is built in '
                               'before_train; call it first')
        return measure_in_place(
            model, self.taps.branches, self._heldout_batches, self.heldout,
            lambda embeddings: self.compute(embeddings, gather=False),
            self._autocast)

    @staticmethod
    def _model(runner) -> nn.Module:
        """The runner's algorithm, unwrapped from DDP / FSDP wrappers."""
        return runner.model.module if is_model_wrapper(runner.model) \
            else runner.model

    def _warn_on_logger_interval(self, runner) -> None:
        """Warn when the logger would not write every sampled value."""
        for hook in runner.hooks:
            if isinstance(hook, LoggerHook) and \
                    self.interval % hook.interval != 0:
                print_log(
                    f'MatrixInfoHook interval {self.interval} is not a '
                    f'multiple of LoggerHook interval {hook.interval}: some '
                    f'values will not be written and others repeated',
                    logger='current',
                    level=logging.WARNING)

    def _log_training_values(self, runner, values: Dict[str, Tensor]) -> None:
        """Put a training batch's values in the message hub (NaN: warn)."""
        undefined = []
        for name, value in values.items():
            value = float(value)
            if value != value:  # NaN: the statistic of a zero kernel
                undefined.append(name)
            runner.message_hub.update_scalar(f'train/{self.prefix}/{name}',
                                             value)
        if undefined:
            print_log(
                f'MatrixInfoHook: {", ".join(undefined)} undefined (logged '
                f'as NaN) at iteration {runner.iter + 1}: the {self.kernel} '
                'kernel of the batch is the zero matrix (a fully collapsed '
                'batch)',
                logger='current',
                level=logging.WARNING)

    def _build_heldout(self, runner) -> List[Any]:
        """The held-out batches, drawn, augmented and collated once."""
        return build_heldout_batches(self.heldout,
                                     self.heldout_batch_size(runner),
                                     runner.train_dataloader.collate_fn)

    def _log_heldout(self, runner, epoch: int) -> None:
        """Measure the held-out set and write the values everywhere."""
        values = self.measure_heldout(runner.model)
        scalars = {
            f'{self.prefix}_heldout/{name}': value
            for name, value in values.items()
        }
        runner.message_hub.update_scalars(scalars)
        self.heldout_history.append(
            dict(epoch=epoch, step=runner.iter, **scalars))
        runner.visualizer.add_scalars(
            dict(scalars, epoch=epoch),
            step=runner.iter,
            file_path=f'{runner.timestamp}.json')
        listing = ', '.join(f'{name}: {value:.4f}'
                            for name, value in values.items())
        print_log(
            f'MatrixInfoHook held-out set, epoch {epoch}: {listing}',
            logger='current',
            level=logging.INFO)
