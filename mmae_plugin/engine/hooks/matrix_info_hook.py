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
from mmengine.dist import all_gather, get_world_size
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmpretrain.registry import HOOKS
from torch import Tensor, nn

from mmae_plugin.matrix_info import (effective_rank, matrix_entropy,
                                     matrix_joint_entropy,
                                     matrix_js_divergence,
                                     matrix_mutual_information,
                                     normalized_covariance, normalized_gram,
                                     rankme, spectrum_js_divergence,
                                     total_coding_rate)

KERNELS = {'covariance': normalized_covariance, 'gram': normalized_gram}
ROWS = ('all', 'even', 'odd')
POOLS = ('cls', 'mean')


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
      image.

    Args:
        model: The unwrapped algorithm.
        pool: Pooling of token outputs, ``'cls'`` or ``'mean'``.

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


def gather_rows(x: Tensor) -> Tensor:
    """Concatenate the rows of ``x`` from every rank (sizes may differ).

    Args:
        x: Local (N_rank, C) tensor.

    Returns:
        (sum N_rank, C) tensor, rank 0's rows first.
    """
    if get_world_size() == 1:
        return x
    size = torch.tensor([x.shape[0]], device=x.device)
    sizes = [int(s) for s in all_gather(size)]
    padded = x.new_zeros((max(sizes), ) + tuple(x.shape[1:]))
    padded[:x.shape[0]] = x
    parts = all_gather(padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def one_branch_quantities(z: Tensor, kernel: str, alpha: float,
                          mu: float) -> Dict[str, Tensor]:
    """Entropy, effective rank, RankMe and TCR of one batch of embeddings.

    Args:
        z: Embeddings (B, C).
        kernel: ``'covariance'`` or ``'gram'`` (matrix of the entropy).
        alpha: Renyi order of the entropy.
        mu: Ridge of the coding rate, computed on l2-normalised rows
            (``logdet(mu I + zn^T zn)``, the paper's M-MAE form).

    Returns:
        Scalars by name.
    """
    matrix = KERNELS[kernel](z, factored=True)
    return dict(
        entropy=matrix_entropy(matrix, alpha),
        erank=effective_rank(z),
        rankme=rankme(z),
        tcr=total_coding_rate(normalized_gram(z, factored=True).factor, mu))


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
    over ranks, and logs, as ``train/<prefix>/<name>`` scalars of the message
    hub (hence the text log, ``vis_data/scalars.json`` and TensorBoard):

    * two branches (SimCLR, BYOL, Barlow Twins): ``entropy_1``,
      ``entropy_2``, ``mutual_info``, ``joint_entropy``, ``matrix_js``,
      ``spectrum_js`` of the batch-normalised covariances (paper figures
      1-3);
    * one branch (MAE, MMAE): ``entropy``, ``erank``, ``rankme`` and ``tcr``
      of the pooled encoder features.

    The values are written by the ``LoggerHook`` at its own interval, which
    should divide ``interval`` (a warning says otherwise).

    Args:
        interval: Sample every ``interval`` iterations (of the epoch, as the
            ``LoggerHook`` counts them).
        branches: Branch specifications (see :func:`default_branches`), or
            ``None`` to pick them from the algorithm's class.
        kernel: Matrix the quantities use: ``'covariance'`` (d x d, features
            standardised over the batch) or ``'gram'`` (B x B, l2-normalised
            rows).
        alpha: Renyi order of entropies and mutual information.
        pool: Pooling of token outputs for the default MAE branch, ``'cls'``
            or ``'mean'``; ``None`` follows ``MMAE.feature`` if present, else
            ``'cls'``.
        mu: Ridge of the coding rate (one-branch models).
        prefix: Name prefix of the logged scalars.
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
                 mu: float = 1.0,
                 prefix: str = 'minfo',
                 cpu_threads: Optional[int] = 1) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'interval must be a positive integer, got '
                             f'{interval!r}')
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {tuple(KERNELS)}, got '
                             f'{kernel!r}')
        if pool is not None and pool not in POOLS:
            raise ValueError(f'pool must be one of {POOLS} or None, got '
                             f'{pool!r}')
        if not (isinstance(alpha, (int, float)) and alpha > 0):
            raise ValueError(f'alpha must be a positive number, got {alpha!r}')
        if not (isinstance(mu, (int, float)) and mu > 0):
            raise ValueError(f'mu must be a positive number, got {mu!r}')
        self.interval = interval
        self.branches = None if branches is None else \
            [self._checked_branch(b) for b in branches]
        if self.branches is not None and len(self.branches) not in (1, 2):
            raise ValueError(f'branches must hold 1 or 2 specifications, got '
                             f'{len(self.branches)}')
        self.kernel = kernel
        self.alpha = float(alpha)
        self.pool = pool
        self.mu = float(mu)
        if cpu_threads is not None and (not isinstance(cpu_threads, int)
                                        or cpu_threads < 1):
            raise ValueError(f'cpu_threads must be a positive integer or '
                             f'None, got {cpu_threads!r}')
        self.prefix = prefix
        self.cpu_threads = cpu_threads
        self._armed = False
        self._records: Dict[str, List[Tensor]] = {}
        self._handles: list = []

    @staticmethod
    def _checked_branch(branch: dict) -> dict:
        """Validate one branch specification and fill its defaults."""
        if not isinstance(branch, dict) or 'module' not in branch:
            raise ValueError(f'each branch must be a dict with a "module" '
                             f'key, got {branch!r}')
        unknown = set(branch) - {'module', 'call', 'rows', 'pool'}
        if unknown:
            raise ValueError(f'unknown branch key(s) {sorted(unknown)} in '
                             f'{branch!r}; allowed: module, call, rows, pool')
        spec = {**dict(call=0, rows='all', pool='cls'), **branch}
        if spec['rows'] not in ROWS:
            raise ValueError(f'branch rows must be one of {ROWS}, got '
                             f'{spec["rows"]!r}')
        if spec['pool'] not in POOLS:
            raise ValueError(f'branch pool must be one of {POOLS}, got '
                             f'{spec["pool"]!r}')
        if not isinstance(spec['call'], int) or spec['call'] < 0:
            raise ValueError(f'branch call must be an integer >= 0, got '
                             f'{spec["call"]!r}')
        return spec

    # ------------------------------------------------------------------
    # set-up and tear-down
    # ------------------------------------------------------------------
    def before_run(self, runner) -> None:
        """Resolve the branches and register the forward hooks."""
        self.after_run(runner)  # idempotent: never tap a module twice
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        if self.branches is None:
            pool = self.pool or ('mean' if getattr(model, 'feature', 'cls')
                                 == 'mean_visible' else 'cls')
            self.branches = [self._checked_branch(b)
                             for b in default_branches(model, pool)]
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
        """Forward hook keeping ``name``'s outputs while armed."""

        def record(module: nn.Module, args: Any, output: Any) -> None:
            if self._armed:
                # Clone: later in-place ops of the model must not alter it.
                kept = _first_tensor(output).detach().clone()
                self._records.setdefault(name, []).append(kept)

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
            calls = self._records.get(spec['module'], [])
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
                                                 self.alpha, self.mu)
                return two_branch_quantities(gathered[0], gathered[1],
                                             self.kernel, self.alpha)
            finally:
                torch.set_num_threads(saved_threads)
