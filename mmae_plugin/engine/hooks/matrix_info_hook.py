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
"""
import logging
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS
from torch import Tensor, nn

# coding_rate stays importable from here (its former home).
from mmae_plugin.matrix_info.coding_rate import (  # noqa: F401
    check_coding_rate_args, coding_rate)
from mmae_plugin.matrix_info.pooling import (POOLINGS, check_pooling_name,
                                             pool_token_sequence)
from mmae_plugin.matrix_info.representation import (KERNELS,
                                                    one_branch_statistics,
                                                    two_branch_statistics)
from mmae_plugin.matrix_info.validation import (check_choice, check_int,
                                                check_real)
# One definition of the padded all-gather, shared with the regularisers.
from mmae_plugin.models.utils.gather import gather_rows

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


def default_branches(model: nn.Module, pool: str) -> List[dict]:
    """Where the embeddings of each supported algorithm come from.

    Each branch is ``dict(module=<dotted submodule name>, call=<index of the
    call within one training step>, rows='all'|'even'|'odd', pool=...)``:

    * ``SimCLR`` runs its projector (``neck``) once on both views interleaved
      row by row: even rows are view 1, odd rows view 2.
    * ``BarlowTwins`` runs ``neck`` on view 1, then on view 2.
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
    if isinstance(model, SimCLR):
        return [dict(module='neck', call=0, rows='even'),
                dict(module='neck', call=0, rows='odd')]
    if isinstance(model, BarlowTwins):
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
                 cpu_threads: Optional[int] = 1) -> None:
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
        for name in {b['module'] for b in self.branches}:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f'MatrixInfoHook: {type(model).__name__} has no '
                    f'submodule {name!r} (branches={self.branches})') from None
            self._handles.append(
                module.register_forward_hook(self._recorder(name)))

    def before_train(self, runner) -> None:
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

    def compute(self, embeddings: List[Tensor]) -> Dict[str, Tensor]:
        """Gather the embeddings over ranks and compute the quantities.

        Args:
            embeddings: Local (N, C) embeddings of one or two branches.

        Returns:
            Scalars by name (float64 tensors).
        """
        device_type = embeddings[0].device.type
        with torch.no_grad(), torch.autocast(device_type=device_type,
                                             enabled=False):
            gathered = [gather_rows(z.contiguous()) for z in embeddings]
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
