"""Log matrix-information quantities of the representations during training.

How the representations are obtained (exact and cheap): the hook registers
PyTorch forward hooks on the submodules that produce the embeddings the loss
uses (a projector, a predictor, a target network, the MAE encoder). On the
iterations it samples, those forward hooks keep a detached reference to the
outputs of the training forward pass itself. So the quantities describe
exactly the batch, augmentations, masks and train-mode BatchNorm statistics
the loss saw, no second forward pass is run (recomputing features would also
update BatchNorm running statistics, a side effect on training), and on the
other iterations the forward hooks return after one attribute check. The
features are then gathered over ranks and the quantities computed in float64
under ``torch.no_grad()`` with autocast disabled.

Optionally (``heldout=``) the hook also measures, once per epoch, a fixed
held-out set: images the model never trains on, each turned into its
augmented views once, with a fixed seed, so that every epoch sees exactly
the same inputs and the curves over epochs show the network changing, not
the batch (see :class:`MatrixInfoHook`).

The parts live beside this file: what to tap per algorithm
(:mod:`.matrix_info_branches`) and how (:mod:`.matrix_info_taps`), the
measurement (:mod:`.matrix_info_measure`) and the held-out pass
(:mod:`.matrix_info_heldout`).
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
from .matrix_info_branches import default_branches
from .matrix_info_heldout import (build_heldout_batches, checked_heldout,
                                  measure_in_place, training_autocast)
from .matrix_info_measure import (FALLBACK_TCR, MAX_ALPHA, checked_tcr,
                                  measure_embeddings, objective_tcr)
from .matrix_info_taps import (BranchTaps, check_row_pairing, checked_branch,
                               checked_branches)


@HOOKS.register_module()
class MatrixInfoHook(Hook):
    """Log matrix entropies, mutual information and divergences of features.

    Every ``interval`` training iterations the hook takes the embeddings the
    training forward pass produced (see the module docstring), gathers them
    over ranks, and puts them in the message hub as ``train/<prefix>/<name>``
    scalars; the ``LoggerHook`` drops the ``train/`` mode prefix, so the text
    log, ``vis_data/scalars.json`` and TensorBoard show ``<prefix>/<name>``
    (``minfo/erank_cov``). Every key names the matrix it is computed on
    (``<k>`` is ``cov`` for ``kernel='covariance'``, ``gram`` for
    ``kernel='gram'``); the definitions are those of
    :mod:`mmae_plugin.matrix_info.representation`, so a key has the value
    ``RepresentationStatistics`` gives the same features:

    * two branches (Siamese methods: SimCLR, BYOL, Barlow Twins, MoCo,
      SimSiam, SwAV, DenseCL): ``entropy_1_<k>``, ``entropy_2_<k>``,
      ``mutual_info_<k>``, ``joint_entropy_<k>``, ``matrix_js_<k>``,
      ``spectrum_js_<k>`` (paper figures 1-3 with the default covariance
      kernel); the order-dependent ones end in ``_alpha<a>`` when
      ``alpha != 1``;
    * one branch (masked modelling and distillation: MAE, MMAE, BEiT,
      SimMIM, ...): ``entropy_<k>`` (von Neumann; Renyi order ``alpha``
      as ``entropy_<k>_alpha<a>``), ``erank_<k>`` (the paper's
      effective rank, Definition 6: ``exp`` of the von Neumann entropy of
      the unit-diagonal kernel), ``rankme_raw`` (RankMe, eps 1e-7, of the
      raw, uncentred embeddings) and ``tcr_<form>[_centered]_mu<mu>``, the
      total coding rate of the l2-normalised embeddings. By default
      (``tcr='objective'``) it is the one the model's ``TCRLoss``
      maximises, with its form, ``mu`` and centering (so
      ``tcr_reference_mu1`` for the published objective); a model without
      one gets the published M-MAE objective ``logdet(I + (1/d) zn^T zn)``.

    The values are written by the ``LoggerHook`` at its own interval, which
    should divide ``interval`` (a warning says otherwise).

    **Held-out set** (``heldout=dict(dataset=..., ...)``, off by default).
    Training-batch values mix two changes, the network's and the batch's.
    With ``heldout`` the hook also measures, before training
    (``at_start``) and after every ``interval``-th epoch (always after the
    last), the same quantities, under the same keys with the prefix
    ``<prefix>_heldout`` (``minfo_heldout/mutual_info_cov``), on a fixed
    held-out set:

    * ``num_batches`` batches of ``batch_size`` images (default: the global
      training batch, ranks x per-rank batch, the batch the training values
      are computed on, so both estimators see the same number of rows) are
      drawn without replacement from ``dataset``, an mmpretrain dataset
      config, e.g. the test split with the training pipeline;
    * each image goes through the dataset's pipeline once, with python,
      numpy and torch seeded by ``seed`` (the training random streams are
      restored after), and the collated batches are kept on the host: every
      measurement sees the same images and the same two views;
    * each batch is run through the model's own training forward
      (``mode='loss'``) under ``torch.no_grad()`` and the run's autocast
      (the optimizer wrapper's, as in a training step), with the forward
      hooks tapping the same branches as on the training batches, on the
      training model itself (under FSDP through the FSDP root, which
      gathers the full parameters; no copy, so no extra memory) with its
      momentum networks frozen (BYOL's target branch is the target network
      as training left it, not one momentum step further), in ``mode``
      ``'eval'`` (BatchNorm running statistics) or ``'train'`` (batch
      statistics), and with torch's generator seeded by ``seed`` (the same
      MAE masks every epoch). What the loss forward changes besides its
      outputs (modes, BatchNorm statistics, the modules' own attributes,
      random states) is restored after the pass;
    * the quantities of each batch are averaged over the batches. Every rank
      measures the same batches (no gather), so all ranks log the same.

    The values go to the message hub (``<prefix>_heldout/<name>``), to
    ``vis_data/scalars.json`` and the run's ``<timestamp>.json`` (one row
    per measurement, with an ``epoch`` field, step = iterations done) and
    to the text log.

    Args:
        interval: Sample every ``interval`` iterations (of the epoch, as the
            ``LoggerHook`` counts them); an integer >= 1.
        branches: Branch specifications (see
            :func:`~.matrix_info_branches.default_branches`), or
            ``None`` to pick them from the algorithm's class.
        kernel: Matrix the entropies and the effective rank use:
            ``'covariance'`` (d x d, features standardised over the batch:
            centred; keys ``*_cov``) or ``'gram'`` (B x B, l2-normalised
            rows, uncentred; keys ``*_gram``).
        alpha: Renyi order of entropies and mutual information, in
            ``(0, 50]`` (see
            :data:`~.matrix_info_measure.MAX_ALPHA`).
        pool: Pooling of token outputs for the default one-branch taps,
            ``'cls'``, ``'mean'`` or ``'cls+mean'``; ``None`` follows the
            algorithm (see :func:`~.matrix_info_branches.default_branches`).
        tcr: Which coding rate is logged: ``'objective'`` (the model's
            ``TCRLoss``), ``'reference'`` (``logdet(I + (mu/d) zn^T zn)``) or
            ``'paper'`` (``logdet(mu I + zn^T zn)``).
        mu: Coding-rate parameter (in ``(0, 1e300]``) for
            ``tcr='reference'``/``'paper'`` (default 1); must be None with
            ``'objective'``.
        centering: Batch-centre the normalised features first, for
            ``tcr='reference'``/``'paper'`` (default False); must be None
            with ``'objective'``.
        prefix: Non-empty name prefix of the logged scalars.
        cpu_threads: Torch threads while computing on CPU tensors (restored
            afterwards); ``None`` keeps the training setting. One thread is
            the default because eigendecompositions of these sizes gain
            little from threads, and multi-threaded LAPACK eigensolvers can
            stall for about a second at OpenMP barriers when the cores are
            shared with dataloader workers.
        heldout: ``None`` (default: training batches only) or a dict with
            ``dataset`` (required: an mmpretrain dataset config),
            ``num_batches`` (4), ``batch_size`` (None: the global training
            batch), ``seed`` (0), ``mode`` (``'eval'``), ``interval`` (1
            epoch) and ``at_start`` (True); see above.
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
                it was (see :func:`~.matrix_info_heldout.measure_in_place`).

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
