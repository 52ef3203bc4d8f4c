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
"""
import contextlib
import copy
import logging
import random
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import torch
from mmengine.dist import get_world_size
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmpretrain.registry import DATASETS, HOOKS
from torch import Tensor, nn

# coding_rate stays importable from here (its former home).
from mmae_plugin.matrix_info.coding_rate import (  # noqa: F401
    check_coding_rate_args, coding_rate)
from mmae_plugin.matrix_info.pooling import (POOLINGS, check_pooling_name,
                                             pool_token_sequence)
from mmae_plugin.matrix_info.representation import (KERNELS,
                                                    one_branch_statistics,
                                                    two_branch_statistics)
# One definition of the padded all-gather, shared with the regularisers.
from mmae_plugin.models.utils.gather import gather_rows
from mmae_plugin.utils.validation import (check_bool, check_choice,
                                          check_config, check_int, check_real)

ROWS = ('all', 'even', 'odd')
#: Poolings of token outputs: the plugin's one vocabulary.
POOLS = POOLINGS
TAPS = ('output', 'input')
TCR_CHOICES = ('objective', 'reference', 'paper')
#: Largest Renyi order the hook accepts. The toolbox computes every order
#: stably in log space; beyond 50 the entropy is within ``log(d) / 49`` of
#: its limit, the min-entropy ``-log p_max``, so larger orders add nothing.
MAX_ALPHA = 50.0
#: What ``tcr='objective'`` logs for a model without a ``TCRLoss``: the
#: published M-MAE objective (reference form, ViT-B's mu).
FALLBACK_TCR = dict(form='reference', mu=1.0, centering=False)
#: Modes of the network during the held-out pass: ``'eval'`` (BatchNorm
#: running statistics, the network as a linear probe sees it) or ``'train'``
#: (batch statistics, as on the training batches).
HELDOUT_MODES = ('eval', 'train')
HELDOUT_KEYS = ('dataset', 'num_batches', 'batch_size', 'seed', 'mode',
                'interval', 'at_start')


@dataclass(frozen=True)
class HeldoutSpec:
    """Validated ``heldout=`` settings of :class:`MatrixInfoHook`.

    Attributes:
        dataset: mmpretrain dataset config (its pipeline makes the views).
        num_batches: Number of held-out batches.
        batch_size: Images per batch (None: the global training batch).
        seed: Seed of the image choice and of the augmentations.
        mode: ``'eval'`` or ``'train'`` (see :data:`HELDOUT_MODES`).
        interval: Measure every ``interval`` epochs (and after the last).
        at_start: Also measure the initial network (epoch 0).
    """

    dataset: dict
    num_batches: int = 4
    batch_size: Optional[int] = None
    seed: int = 0
    mode: str = 'eval'
    interval: int = 1
    at_start: bool = True


def checked_heldout(heldout: Optional[dict]) -> Optional[HeldoutSpec]:
    """Validate the ``heldout=`` argument of :class:`MatrixInfoHook`.

    Args:
        heldout: ``None`` or a dict with the keys of :class:`HeldoutSpec`
            (``dataset`` required).

    Returns:
        The settings, or None when the option is off.
    """
    if heldout is None:
        return None
    if not isinstance(heldout, dict) or 'dataset' not in heldout:
        raise ValueError(f'heldout must be None or a dict with a "dataset" '
                         f'config, got {heldout!r}')
    unknown = set(heldout) - set(HELDOUT_KEYS)
    if unknown:
        raise ValueError(f'unknown heldout key(s) {sorted(unknown)}; allowed: '
                         f'{", ".join(HELDOUT_KEYS)}')
    spec = HeldoutSpec(**heldout)
    check_config(spec.dataset, 'heldout dataset')
    check_int(spec.num_batches, 'heldout num_batches', minimum=1)
    if spec.batch_size is not None:
        # Two rows at least: the covariance kernel standardises over them.
        check_int(spec.batch_size, 'heldout batch_size', minimum=2)
    check_int(spec.seed, 'heldout seed', minimum=0)
    if spec.seed >= 2**32:  # numpy seeds are 32-bit unsigned
        raise ValueError(f'heldout seed must be < 2**32, got {spec.seed!r}')
    check_choice(spec.mode, 'heldout mode', HELDOUT_MODES)
    check_int(spec.interval, 'heldout interval', minimum=1)
    check_bool(spec.at_start, 'heldout at_start')
    return spec


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed python, numpy and torch inside; restore their states after.

    The held-out views and masks are drawn here, so they are the same at
    every measurement, and training draws exactly what it would without the
    held-out option.

    Args:
        seed: Seed of all three generators.
        device: The model's device; a CUDA device's generator is also
            forked (the other devices are not touched by the forward).
    """
    states = (random.getstate(), np.random.get_state())
    devices = [device] if device.type == 'cuda' else []
    try:
        with torch.random.fork_rng(devices=devices):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


def _no_update(*args: Any, **kwargs: Any) -> None:
    """Stand-in for ``BaseAveragedModel.update_parameters`` in a copy."""


def freeze_averaged_models(model: nn.Module) -> None:
    """Stop the momentum (EMA) networks inside ``model`` from updating.

    BYOL's loss forward steps its target network before running it; the
    held-out pass should measure the target network as training left it,
    not one momentum step further.

    Args:
        model: A copy of the algorithm (changed in place).
    """
    from mmengine.model import BaseAveragedModel
    for module in model.modules():
        if isinstance(module, BaseAveragedModel):
            module.update_parameters = _no_update


def average_values(per_batch: List[Dict[str, Tensor]]) -> Dict[str, float]:
    """Mean over batches of each quantity (NaN if any batch had NaN).

    Args:
        per_batch: The quantities of each batch, same keys.

    Returns:
        ``{name: mean}`` as Python floats.
    """
    return {name: float(sum(float(values[name]) for values in per_batch) /
                        len(per_batch))
            for name in per_batch[0]}


def default_branches(model: nn.Module, pool: str) -> List[dict]:
    """Where the embeddings of each supported algorithm come from.

    Each branch is ``dict(module=<dotted submodule name>, call=<index of the
    call within one training step>, rows='all'|'even'|'odd', pool=...)``:

    * ``SimCLR`` runs its projector (``neck``) once on both views interleaved
      row by row: even rows are view 1, odd rows view 2.
    * ``BarlowTwins`` and the plugin's ``SpectralContrastive`` run ``neck``
      on view 1, then on view 2.
    * ``BYOL``: the paper's two branches are the online network and its
      momentum copy, the target network (same architecture). Branch 1 is the
      online projection of view 1 (first ``neck`` call), branch 2 the target
      projection of view 2 (second ``target_net`` call), the view the loss
      pairs it with. The predictor output instead is
      ``dict(module='head.predictor', call=0)``.
    * ``MAE`` and its subclasses (the plugin's ``MMAE``) have one branch, the
      masked encoder pass (``backbone`` output), pooled to one vector per
      image. A model with a ``regularizer`` submodule (``MMAE`` with
      ``TCRLoss`` or ``UniformityLoss``) and ``pool=None`` instead taps that
      regulariser's input: exactly the features its loss term sees (the
      pooling and any extra norm the model applies before it).

    Args:
        model: The unwrapped algorithm.
        pool: Pooling of token outputs, one of
            :data:`~mmae_plugin.matrix_info.pooling.POOLINGS`, or ``None``
            to follow the model (its regulariser's input, else
            ``MMAE.feature``, else ``'cls'``).

    Returns:
        List of one or two branch specifications.
    """
    from mmpretrain.models import MAE, BYOL, BarlowTwins, SimCLR

    from mmae_plugin.models.algorithms import SpectralContrastive
    if isinstance(model, SimCLR):
        return [dict(module='neck', call=0, rows='even'),
                dict(module='neck', call=0, rows='odd')]
    if isinstance(model, (BarlowTwins, SpectralContrastive)):
        return [dict(module='neck', call=0), dict(module='neck', call=1)]
    if isinstance(model, BYOL):
        return [dict(module='neck', call=0),
                dict(module='target_net', call=1)]
    if isinstance(model, MAE):
        if pool is None and isinstance(
                getattr(model, 'regularizer', None), nn.Module):
            return [dict(module='regularizer', call=0, tap='input')]
        if pool is None:
            pool = getattr(model, 'feature', 'cls')
        return [dict(module='backbone', call=0, pool=pool)]
    raise TypeError(
        f'MatrixInfoHook has no default branches for '
        f'{type(model).__name__}; pass branches=[dict(module=..., call=...), '
        f'...] naming the submodule(s) whose outputs are the embeddings')


def _first_tensor(output: Any) -> Tensor:
    """The first tensor of a (nested) tuple/list output."""
    while isinstance(output, (tuple, list)):
        if not output:
            raise ValueError('a tapped module returned an empty sequence')
        output = output[0]
    if not isinstance(output, Tensor):
        raise TypeError(f'a tapped module returned {type(output).__name__}, '
                        f'expected a tensor or a tuple starting with one')
    return output


def to_embeddings(output: Any, pool: str) -> Tensor:
    """Turn a module output into one embedding row per sample (N, C).

    Args:
        output: Tensor or tuple; its first tensor is used. (N, C) is kept,
            (N, L, C) tokens are pooled by
            :func:`~mmae_plugin.matrix_info.pooling.pool_token_sequence`
            (one extra token, the CLS), (N, C, H, W) maps are averaged over
            space.
        pool: One of :data:`~mmae_plugin.matrix_info.pooling.POOLINGS`.

    Returns:
        Detached (N, C) (or (N, 2C) for ``'cls+mean'``) tensor.
    """
    x = _first_tensor(output).detach()
    if x.dim() == 3:
        x = pool_token_sequence(x, pool)
    elif x.dim() == 4:
        x = x.mean(dim=(2, 3))
    elif x.dim() != 2:
        raise ValueError(f'cannot turn a module output of shape '
                         f'{tuple(x.shape)} into (N, C) embeddings')
    return x


def objective_tcr(model: nn.Module) -> Optional[dict]:
    """Form, mu and centering of the model's ``TCRLoss``, if it has one.

    Args:
        model: The unwrapped algorithm.

    Returns:
        ``dict(form=, mu=, centering=)`` or ``None``.
    """
    from mmae_plugin.models.losses import TCRLoss
    regularizer = getattr(model, 'regularizer', None)
    if isinstance(regularizer, TCRLoss):
        return dict(form=regularizer.form, mu=regularizer.mu,
                    centering=regularizer.centering)
    return None


def one_branch_quantities(z: Tensor, kernel: str, alpha: float,
                          tcr: dict) -> Dict[str, Tensor]:
    """Entropy, effective rank, RankMe and TCR of one batch of embeddings.

    Args:
        z: Embeddings (B, C).
        kernel: ``'covariance'`` or ``'gram'`` (matrix of the entropy and of
            the effective rank).
        alpha: Renyi order of the entropy.
        tcr: ``dict(form=, mu=, centering=)`` of the coding rate.

    Returns:
        The keys of :func:`~mmae_plugin.matrix_info.representation.
        one_branch_statistics` for ``kernel``: ``entropy_<k>`` (order
        ``alpha``), ``erank_<k>`` (the paper's effective rank, Definition 6,
        of the unit-diagonal kernel), ``rankme_raw`` (RankMe of the raw
        embeddings) and ``tcr_<form>[_centered]_mu<mu>``; ``<k>`` is
        ``cov`` or ``gram``. The entropy and effective rank of a zero
        kernel (a fully collapsed batch) are NaN: undefined.
    """
    return one_branch_statistics(z, kernels=(kernel, ), alpha=alpha, tcr=tcr,
                                 undefined='nan')


def two_branch_quantities(z1: Tensor, z2: Tensor, kernel: str,
                          alpha: float) -> Dict[str, Tensor]:
    """Per-branch entropy, MI, joint entropy, matrix and spectrum JS.

    Args:
        z1: Embeddings of branch 1 (B, C).
        z2: Embeddings of branch 2 (B, C), same samples in the same order.
        kernel: ``'covariance'`` (paper figures 1-3) or ``'gram'``.
        alpha: Renyi order of entropies and mutual information.

    Returns:
        Scalars keyed ``<name>_<k>``, NaN when a kernel is the zero matrix
        (see
        :func:`~mmae_plugin.matrix_info.representation.
        two_branch_statistics`).
    """
    return two_branch_statistics(z1, z2, kernel, alpha, undefined='nan')


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

    * two branches (SimCLR, BYOL, Barlow Twins): ``entropy_1_<k>``,
      ``entropy_2_<k>``, ``mutual_info_<k>``, ``joint_entropy_<k>``,
      ``matrix_js_<k>``, ``spectrum_js_<k>`` (paper figures 1-3 with the
      default covariance kernel); the order-dependent ones end in
      ``_alpha<a>`` when ``alpha != 1``;
    * one branch (MAE, MMAE): ``entropy_<k>`` (von Neumann; Renyi order
      ``alpha`` as ``entropy_<k>_alpha<a>``), ``erank_<k>`` (the paper's
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
      (``mode='loss'``) under ``torch.no_grad()``, with the forward hooks
      tapping the same branches as on the training batches, in a copy of
      the model (``copy.deepcopy``: the loss forward has side effects, such
      as BatchNorm statistics, that must not reach training; the copy
      doubles the model's memory for the duration) whose momentum networks
      are frozen (BYOL's target branch is the target network as training
      left it, not one momentum step further), in ``mode`` ``'eval'``
      (BatchNorm running statistics) or ``'train'`` (batch statistics), and
      with torch's generator seeded by ``seed`` (the same MAE masks every
      epoch);
    * the quantities of each batch are averaged over the batches. Every rank
      measures the same batches (no gather), so all ranks log the same.

    The values go to the message hub (``<prefix>_heldout/<name>``), to
    ``vis_data/scalars.json`` and the run's ``<timestamp>.json`` (one row
    per measurement, with an ``epoch`` field, step = iterations done) and
    to the text log.

    Args:
        interval: Sample every ``interval`` iterations (of the epoch, as the
            ``LoggerHook`` counts them); an integer >= 1.
        branches: Branch specifications (see :func:`default_branches`), or
            ``None`` to pick them from the algorithm's class.
        kernel: Matrix the entropies and the effective rank use:
            ``'covariance'`` (d x d, features standardised over the batch:
            centred; keys ``*_cov``) or ``'gram'`` (B x B, l2-normalised
            rows, uncentred; keys ``*_gram``).
        alpha: Renyi order of entropies and mutual information, in
            ``(0, 50]`` (see :data:`MAX_ALPHA`).
        pool: Pooling of token outputs for the default MAE branch, ``'cls'``,
            ``'mean'`` or ``'cls+mean'``; ``None`` follows the model (see
            :func:`default_branches`).
        tcr: Which coding rate is logged: ``'objective'`` (the model's
            ``TCRLoss``), ``'reference'`` (``logdet(I + (mu/d) zn^T zn)``) or
            ``'paper'`` (``logdet(mu I + zn^T zn)``).
        mu: Coding-rate parameter (in ``(0, 1e300]``) for ``tcr='reference'``/``'paper'``
            (default 1); must be None with ``'objective'``.
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
        self.alpha = check_real(alpha, 'alpha', minimum=0, strict=True,
                                maximum=MAX_ALPHA)
        self.pool = None if pool is None else check_pooling_name(
            pool, 'pool')
        self.tcr = self._checked_tcr(tcr, mu, centering)
        self._tcr = self.tcr or FALLBACK_TCR  # resolved again in before_run
        if not isinstance(prefix, str) or not prefix.strip('/'):
            raise TypeError(f'prefix must be a non-empty string, got '
                            f'{type(prefix).__name__} {prefix!r}')
        self.prefix = prefix.strip('/')
        self.cpu_threads = None if cpu_threads is None else check_int(
            cpu_threads, 'cpu_threads', minimum=1)
        self.branches = self._checked_branches(branches)
        self.heldout = checked_heldout(heldout)
        # Collated held-out batches (host memory), built in before_train.
        self._heldout_batches: List[Any] = []
        self.heldout_history: List[Dict[str, float]] = []
        self._armed = False
        self._records: Dict[tuple, List[Tensor]] = {}
        self._handles: list = []

    @staticmethod
    def _checked_tcr(tcr: str, mu: Optional[float],
                     centering: Optional[bool]) -> Optional[dict]:
        """The coding-rate settings, or None to take them from the model."""
        check_choice(tcr, 'tcr', TCR_CHOICES)
        if tcr == 'objective':
            if mu is not None or centering is not None:
                raise ValueError(
                    f"with tcr='objective' mu and centering come from the "
                    f"model's TCRLoss; got mu={mu!r}, centering="
                    f"{centering!r}. Use tcr='reference' or tcr='paper' to "
                    f"set them")
            return None
        form, mu, centering = check_coding_rate_args(
            tcr, 1.0 if mu is None else mu,
            False if centering is None else centering)
        return dict(form=form, mu=mu, centering=centering)

    @classmethod
    def _checked_branches(cls, branches: Any) -> Optional[List[dict]]:
        """Validate the branch list (None: chosen from the model)."""
        if branches is None:
            return None
        if not isinstance(branches, (list, tuple)) or \
                len(branches) not in (1, 2):
            raise ValueError(f'branches must be None or a list of 1 or 2 '
                             f'dicts, got {branches!r}')
        return [cls._checked_branch(b) for b in branches]

    @staticmethod
    def _checked_branch(branch: dict) -> dict:
        """Validate one branch specification and fill its defaults."""
        if not isinstance(branch, dict) or 'module' not in branch:
            raise ValueError(f'each branch must be a dict with a "module" '
                             f'key, got {branch!r}')
        unknown = set(branch) - {'module', 'call', 'rows', 'pool', 'tap'}
        if unknown:
            raise ValueError(f'unknown branch key(s) {sorted(unknown)} in '
                             f'{branch!r}; allowed: module, call, rows, '
                             f'pool, tap')
        spec = {**dict(call=0, rows='all', pool='cls', tap='output'),
                **branch}
        if not isinstance(spec['module'], str):
            raise TypeError(f'branch module must be a dotted submodule name, '
                            f'got {spec["module"]!r}')
        check_choice(spec['rows'], 'branch rows', ROWS)
        check_pooling_name(spec['pool'], 'branch pool')
        check_choice(spec['tap'], 'branch tap', TAPS)
        check_int(spec['call'], 'branch call', minimum=0)
        return spec

    # ------------------------------------------------------------------
    # set-up and tear-down
    # ------------------------------------------------------------------
    def before_run(self, runner) -> None:
        """Resolve the branches and the TCR; register the forward hooks."""
        self.after_run(runner)  # idempotent: never tap a module twice
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        if self.branches is None:
            self.branches = [self._checked_branch(b)
                             for b in default_branches(model, self.pool)]
        self._tcr = self.tcr or objective_tcr(model) or FALLBACK_TCR
        self._handles = self._tap(model)

    def _tap(self, model: nn.Module) -> list:
        """Register the recording forward hooks on ``model``'s branches.

        Args:
            model: The unwrapped algorithm (or a copy of it).

        Returns:
            The hook handles.
        """
        handles = []
        for name in {b['module'] for b in self.branches}:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f'MatrixInfoHook: {type(model).__name__} has no '
                    f'submodule {name!r} (branches={self.branches})') from None
            handles.append(
                module.register_forward_hook(self._recorder(name)))
        return handles

    def before_train(self, runner) -> None:
        """Warn about the logger interval; build and measure the held-out set.
        """
        self._warn_on_logger_interval(runner)
        if self.heldout is None:
            return
        self._heldout_batches = self._build_heldout(runner)
        # A resumed run (iter > 0) measured its start epoch before it stopped.
        if self.heldout.at_start and runner.iter == 0:
            self._log_heldout(runner, epoch=0)

    def after_train_epoch(self, runner) -> None:
        """Measure the held-out set every ``interval`` epochs and at the end.
        """
        if self.heldout is None:
            return
        if (self.every_n_epochs(runner, self.heldout.interval)
                or self.is_last_train_epoch(runner)):
            self._log_heldout(runner, epoch=runner.epoch + 1)

    def _warn_on_logger_interval(self, runner) -> None:
        """Warn when the logger would not write every sampled value."""
        for hook in runner.hooks:
            if isinstance(hook, LoggerHook) and \
                    self.interval % hook.interval != 0:
                print_log(
                    f'MatrixInfoHook interval {self.interval} is not a '
                    f'multiple of LoggerHook interval {hook.interval}: some '
                    f'values will not be written and others repeated',
                    logger='current', level=logging.WARNING)

    def after_run(self, runner) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _recorder(self, name: str):
        """Forward hook keeping ``name``'s inputs/outputs while armed."""
        taps = {b['tap'] for b in self.branches if b['module'] == name}

        def record(module: nn.Module, args: Any, output: Any) -> None:
            if self._armed:
                # Clone: later in-place ops of the model must not alter it.
                for tap in taps:
                    kept = _first_tensor(args if tap == 'input' else output)
                    self._records.setdefault((name, tap), []).append(
                        kept.detach().clone())

        return record

    # ------------------------------------------------------------------
    # sampling
    # ------------------------------------------------------------------
    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: Optional[Union[dict, tuple,
                                                     list]] = None) -> None:
        """Arm the forward hooks on sampled iterations."""
        self._records = {}
        self._armed = self.every_n_inner_iters(batch_idx, self.interval)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Optional[Union[dict, tuple, list]] = None,
                         outputs: Optional[dict] = None) -> None:
        """Compute and log the quantities of the recorded embeddings."""
        if not self._armed:
            return
        self._armed = False
        values = self.compute(self._branch_embeddings())
        self._records = {}
        undefined = []
        for name, value in values.items():
            value = float(value)
            if value != value:  # NaN: the statistic of a zero kernel
                undefined.append(name)
            runner.message_hub.update_scalar(
                f'train/{self.prefix}/{name}', value)
        if undefined:
            print_log(
                f'MatrixInfoHook: {", ".join(undefined)} undefined (logged '
                f'as NaN) at iteration {runner.iter + 1}: the {self.kernel} '
                'kernel of the batch is the zero matrix (a fully collapsed '
                'batch)', logger='current', level=logging.WARNING)

    def _branch_embeddings(self) -> List[Tensor]:
        """The local embeddings of each branch from the recorded outputs."""
        embeddings = []
        for spec in self.branches:
            calls = self._records.get((spec['module'], spec['tap']), [])
            if spec['call'] >= len(calls):
                raise RuntimeError(
                    f'MatrixInfoHook expected call {spec["call"]} of '
                    f'{spec["module"]!r} in the training step but saw '
                    f'{len(calls)} call(s); set branches= to match the '
                    f'model\'s forward')
            z = to_embeddings(calls[spec['call']], spec['pool'])
            if spec['rows'] != 'all':
                z = z[0::2] if spec['rows'] == 'even' else z[1::2]
            embeddings.append(z)
        return embeddings

    def compute(self, embeddings: List[Tensor],
                gather: bool = True) -> Dict[str, Tensor]:
        """Gather the embeddings over ranks and compute the quantities.

        Args:
            embeddings: Local (N, C) embeddings of one or two branches.
            gather: Gather the rows of every rank first (training batches);
                False for the held-out set, which every rank has whole.

        Returns:
            Scalars by name (float64 tensors).
        """
        device_type = embeddings[0].device.type
        with torch.no_grad(), torch.autocast(device_type=device_type,
                                             enabled=False):
            gathered = [gather_rows(z.contiguous()) if gather else z
                        for z in embeddings]
            saved_threads = torch.get_num_threads()
            if device_type == 'cpu' and self.cpu_threads is not None:
                torch.set_num_threads(self.cpu_threads)
            try:
                if len(gathered) == 1:
                    return one_branch_quantities(gathered[0], self.kernel,
                                                 self.alpha, self._tcr)
                return two_branch_quantities(gathered[0], gathered[1],
                                             self.kernel, self.alpha)
            finally:
                torch.set_num_threads(saved_threads)

    # ------------------------------------------------------------------
    # the held-out set
    # ------------------------------------------------------------------
    def heldout_batch_size(self, runner) -> int:
        """Images per held-out batch: the setting, or the global batch."""
        if self.heldout.batch_size is not None:
            return self.heldout.batch_size
        return runner.train_dataloader.batch_size * get_world_size()

    def _build_heldout(self, runner) -> List[Any]:
        """Draw, augment and collate the held-out batches once.

        Args:
            runner: The runner (its training dataloader gives the collate
                function and the default batch size).

        Returns:
            The collated batches, in host memory.
        """
        spec = self.heldout
        batch_size = self.heldout_batch_size(runner)
        dataset = DATASETS.build(copy.deepcopy(spec.dataset))
        needed = spec.num_batches * batch_size
        if len(dataset) < needed:
            raise ValueError(
                f'MatrixInfoHook heldout: {spec.num_batches} batches of '
                f'{batch_size} need {needed} images; the dataset has '
                f'{len(dataset)}')
        # The images are a seeded random subset, so a test split sorted by
        # class still gives every class.
        chosen = np.random.default_rng(spec.seed).permutation(
            len(dataset))[:needed]
        with seeded_rng(spec.seed, torch.device('cpu')):
            items = [dataset[int(index)] for index in chosen]
        collate = runner.train_dataloader.collate_fn
        return [collate(items[start:start + batch_size])
                for start in range(0, needed, batch_size)]

    def measure_heldout(self, model: nn.Module) -> Dict[str, float]:
        """The quantities of the held-out set, averaged over its batches.

        Args:
            model: The unwrapped algorithm (left unchanged: the forward
                runs on a copy).

        Returns:
            ``{name: value}`` with the keys of the training-batch values.
        """
        if not self._heldout_batches:
            raise RuntimeError('MatrixInfoHook: the held-out set is built in '
                               'before_train; call it first')
        device = next(model.parameters()).device
        shadow = self._untapped_copy(model)
        shadow_handles = self._tap(shadow)
        shadow.train(self.heldout.mode == 'train')
        per_batch = []
        try:
            with torch.no_grad(), seeded_rng(self.heldout.seed, device):
                for batch in self._heldout_batches:
                    data = shadow.data_preprocessor(batch, False)
                    self._records, self._armed = {}, True
                    try:
                        shadow(**data, mode='loss')
                    finally:
                        self._armed = False
                    per_batch.append(
                        self.compute(self._branch_embeddings(), gather=False))
        finally:
            self._records = {}
            for handle in shadow_handles:
                handle.remove()
            del shadow
        return average_values(per_batch)

    def _untapped_copy(self, model: nn.Module) -> nn.Module:
        """A deep copy of ``model`` without this hook's forward hooks.

        deepcopy would copy the recording hooks along (it shares functions),
        so they are removed for the copy and put back on ``model``.
        """
        tapped = bool(self._handles)
        for handle in self._handles:
            handle.remove()
        try:
            shadow = copy.deepcopy(model)
        finally:
            if tapped:
                self._handles = self._tap(model)
        freeze_averaged_models(shadow)
        return shadow

    def _log_heldout(self, runner, epoch: int) -> None:
        """Measure the held-out set and write the values everywhere."""
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        values = self.measure_heldout(model)
        scalars = {f'{self.prefix}_heldout/{name}': value
                   for name, value in values.items()}
        runner.message_hub.update_scalars(scalars)
        self.heldout_history.append(dict(epoch=epoch, step=runner.iter,
                                         **scalars))
        runner.visualizer.add_scalars(dict(scalars, epoch=epoch),
                                      step=runner.iter,
                                      file_path=f'{runner.timestamp}.json')
        listing = ', '.join(f'{name}: {value:.4f}'
                            for name, value in values.items())
        print_log(f'MatrixInfoHook held-out set, epoch {epoch}: {listing}',
                  logger='current', level=logging.INFO)
