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
import math
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS
from torch import Tensor, nn

from mmae_plugin.matrix_info import (matrix_entropy,
                                     matrix_joint_entropy,
                                     matrix_js_divergence,
                                     matrix_mutual_information,
                                     normalized_covariance, normalized_gram,
                                     rankme, spectrum_js_divergence,
                                     total_coding_rate)
from mmae_plugin.matrix_info.validation import (check_bool, check_choice,
                                                check_int, check_real)
# One definition of the padded all-gather, shared with the regularisers.
from mmae_plugin.models.utils.gather import gather_rows

KERNELS = {'covariance': normalized_covariance, 'gram': normalized_gram}
ROWS = ('all', 'even', 'odd')
POOLS = ('cls', 'mean')
TAPS = ('output', 'input')
TCR_CHOICES = ('objective', 'reference', 'paper')
#: Largest Renyi order: beyond it ``p ** alpha`` underflows float64 for the
#: smallest top eigenvalue a d x d matrix can have (``p_max >= 1/d``) once
#: ``alpha log d > 745``, i.e. for d above 3e6 at alpha 50; the entropy is
#: then within ``log(d) / (alpha - 1)`` of its limit ``-log p_max``.
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
        pool: Pooling of token outputs, ``'cls'`` or ``'mean'``, or
            ``None`` to follow the model (its regulariser's input, else
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
            pool = 'mean' if getattr(model, 'feature', 'cls') == \
                'mean_visible' else 'cls'
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
            (N, L, C) tokens are pooled (``'cls'``: token 0, ``'mean'``: mean
            of tokens 1:), (N, C, H, W) maps are averaged over space.
        pool: ``'cls'`` or ``'mean'``.

    Returns:
        Detached (N, C) tensor.
    """
    x = _first_tensor(output).detach()
    if x.dim() == 3:
        x = x[:, 0] if pool == 'cls' else x[:, 1:].mean(dim=1)
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


def coding_rate(z: Tensor, form: str, mu: float,
                centering: bool = False) -> Tensor:
    """Total coding rate of l2-normalised rows, as ``TCRLoss`` defines it.

    Args:
        z: Features (B, d).
        form: ``'reference'``: ``logdet(I + (mu/d) zn^T zn)`` (published
            M-MAE code); ``'paper'``: ``logdet(mu I + zn^T zn)`` (eq. 8, 13).
        mu: Positive coding-rate parameter.
        centering: Use ``zn^T J_B zn`` (batch-centred) instead of
            ``zn^T zn``.

    Returns:
        Scalar float64 tensor.
    """
    zn = F.normalize(z.to(torch.float64), dim=1)
    if centering:
        zn = zn - zn.mean(dim=0, keepdim=True)
    if form == 'paper':
        return total_coding_rate(zn, mu)
    return total_coding_rate(zn * math.sqrt(mu / zn.shape[1]), 1.0)


def one_branch_quantities(z: Tensor, kernel: str, alpha: float,
                          tcr: dict) -> Dict[str, Tensor]:
    """Entropy, effective rank, RankMe and TCR of one batch of embeddings.

    Args:
        z: Embeddings (B, C).
        kernel: ``'covariance'`` or ``'gram'`` (matrix of the entropy and of
            the effective rank).
        alpha: Renyi order of the entropy.
        tcr: ``dict(form=, mu=, centering=)`` of :func:`coding_rate`.

    Returns:
        ``entropy`` (order ``alpha``); ``erank``, the paper's effective rank
        (Definition 6) of the unit-diagonal kernel, ``exp`` of its von
        Neumann entropy; ``rankme``, RankMe (eps 1e-7) of the raw
        embeddings; ``tcr``.
    """
    matrix = KERNELS[kernel](z, factored=True)
    entropy = matrix_entropy(matrix, alpha)
    von_neumann = entropy if alpha == 1.0 else matrix_entropy(matrix, 1.0)
    return dict(
        entropy=entropy,
        erank=torch.exp(von_neumann),
        rankme=rankme(z),
        tcr=coding_rate(z, **tcr))


def two_branch_quantities(z1: Tensor, z2: Tensor, kernel: str,
                          alpha: float) -> Dict[str, Tensor]:
    """Per-branch entropy, MI, joint entropy, matrix and spectrum JS.

    Args:
        z1: Embeddings of branch 1 (B, C).
        z2: Embeddings of branch 2 (B, C), same samples in the same order.
        kernel: ``'covariance'`` (paper figures 1-3) or ``'gram'``.
        alpha: Renyi order of entropies and mutual information.

    Returns:
        Scalars by name.
    """
    if z1.shape != z2.shape:
        raise ValueError(f'the two branches must have the same shape, got '
                         f'{tuple(z1.shape)} and {tuple(z2.shape)}')
    build = KERNELS[kernel]
    k1, k2 = build(z1, factored=True), build(z2, factored=True)
    return dict(
        entropy_1=matrix_entropy(k1, alpha),
        entropy_2=matrix_entropy(k2, alpha),
        mutual_info=matrix_mutual_information(k1, k2, alpha),
        joint_entropy=matrix_joint_entropy(k1, k2, alpha),
        matrix_js=matrix_js_divergence(k1, k2),
        spectrum_js=spectrum_js_divergence(k1, k2))


@HOOKS.register_module()
class MatrixInfoHook(Hook):
    """Log matrix entropies, mutual information and divergences of features.

    Every ``interval`` training iterations the hook takes the embeddings the
    training forward pass produced (see the module docstring), gathers them
    over ranks, and puts them in the message hub as ``train/<prefix>/<name>``
    scalars; the ``LoggerHook`` drops the ``train/`` mode prefix, so the text
    log, ``vis_data/scalars.json`` and TensorBoard show ``<prefix>/<name>``
    (``minfo/erank``):

    * two branches (SimCLR, BYOL, Barlow Twins): ``entropy_1``,
      ``entropy_2``, ``mutual_info``, ``joint_entropy``, ``matrix_js``,
      ``spectrum_js`` of the batch-normalised covariances (paper figures
      1-3);
    * one branch (MAE, MMAE): ``entropy`` (Renyi order ``alpha`` of the
      kernel), ``erank`` (the paper's effective rank, Definition 6: ``exp``
      of the von Neumann entropy of the unit-diagonal kernel), ``rankme``
      (RankMe, eps 1e-7, of the raw embeddings) and ``tcr``, the total coding
      rate of the l2-normalised embeddings. By default (``tcr='objective'``)
      ``tcr`` is the one the model's ``TCRLoss`` maximises, with its form,
      ``mu`` and centering; a model without one gets the published M-MAE
      objective ``logdet(I + (1/d) zn^T zn)``.

    The values are written by the ``LoggerHook`` at its own interval, which
    should divide ``interval`` (a warning says otherwise).

    Args:
        interval: Sample every ``interval`` iterations (of the epoch, as the
            ``LoggerHook`` counts them); an integer >= 1.
        branches: Branch specifications (see :func:`default_branches`), or
            ``None`` to pick them from the algorithm's class.
        kernel: Matrix the entropies and ``erank`` use: ``'covariance'``
            (d x d, features standardised over the batch) or ``'gram'``
            (B x B, l2-normalised rows).
        alpha: Renyi order of entropies and mutual information, in
            ``(0, 50]`` (see :data:`MAX_ALPHA`).
        pool: Pooling of token outputs for the default MAE branch, ``'cls'``
            or ``'mean'``; ``None`` follows the model (see
            :func:`default_branches`).
        tcr: Which coding rate ``tcr`` is: ``'objective'`` (the model's
            ``TCRLoss``), ``'reference'`` (``logdet(I + (mu/d) zn^T zn)``) or
            ``'paper'`` (``logdet(mu I + zn^T zn)``).
        mu: Coding-rate parameter (> 0) for ``tcr='reference'``/``'paper'``
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
        self.pool = None if pool is None else check_choice(
            pool, 'pool', POOLS)
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
        return dict(
            form=tcr,
            mu=1.0 if mu is None else check_real(mu, 'mu', minimum=0,
                                                 strict=True),
            centering=False if centering is None else check_bool(
                centering, 'centering'))

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
        check_choice(spec['pool'], 'branch pool', POOLS)
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
        for name, value in values.items():
            runner.message_hub.update_scalar(
                f'train/{self.prefix}/{name}', float(value))

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
