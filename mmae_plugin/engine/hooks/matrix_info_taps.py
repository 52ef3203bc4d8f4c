"""What :class:`~.MatrixInfoHook` taps: the branches of each algorithm.

A branch names the submodule whose output (or input) is an embedding the
loss uses, which call of it within one training step, which rows and how
token outputs are pooled. :func:`default_branches` knows the supported
algorithms; :class:`BranchTaps` holds the PyTorch forward hooks that keep
those tensors from the training forward pass itself (no second forward).
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

from torch import Tensor, nn

from mmae_plugin.matrix_info.pooling import (check_pooling_name,
                                             pool_token_sequence)
from mmae_plugin.utils.validation import check_choice, check_int

ROWS = ('all', 'even', 'odd')
TAPS = ('output', 'input')
BRANCH_KEYS = ('module', 'call', 'rows', 'pool', 'tap')


def default_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
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
    from mmpretrain.models import BYOL, MAE, BarlowTwins, SimCLR

    from mmae_plugin.models.algorithms import SpectralContrastive
    if isinstance(model, SimCLR):
        return [
            dict(module='neck', call=0, rows='even'),
            dict(module='neck', call=0, rows='odd')
        ]
    if isinstance(model, (BarlowTwins, SpectralContrastive)):
        return [dict(module='neck', call=0), dict(module='neck', call=1)]
    if isinstance(model, BYOL):
        return [dict(module='neck', call=0), dict(module='target_net', call=1)]
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


def checked_branches(branches: Any) -> Optional[List[dict]]:
    """Validate the ``branches=`` argument (None: chosen from the model).

    Args:
        branches: None or a list of one or two branch dicts.

    Returns:
        The branches with their defaults filled, or None.
    """
    if branches is None:
        return None
    if not isinstance(branches, (list, tuple)) or \
            len(branches) not in (1, 2):
        raise ValueError(f'branches must be None or a list of 1 or 2 '
                         f'dicts, got {branches!r}')
    return [checked_branch(b) for b in branches]


def checked_branch(branch: dict) -> dict:
    """Validate one branch specification and fill its defaults.

    Args:
        branch: A dict with ``module`` and optionally ``call``, ``rows``,
            ``pool``, ``tap``.

    Returns:
        The full specification.
    """
    if not isinstance(branch, dict) or 'module' not in branch:
        raise ValueError(f'each branch must be a dict with a "module" '
                         f'key, got {branch!r}')
    unknown = set(branch) - set(BRANCH_KEYS)
    if unknown:
        raise ValueError(f'unknown branch key(s) {sorted(unknown)} in '
                         f'{branch!r}; allowed: {", ".join(BRANCH_KEYS)}')
    spec = {**dict(call=0, rows='all', pool='cls', tap='output'), **branch}
    if not isinstance(spec['module'], str):
        raise TypeError(f'branch module must be a dotted submodule name, '
                        f'got {spec["module"]!r}')
    check_choice(spec['rows'], 'branch rows', ROWS)
    check_pooling_name(spec['pool'], 'branch pool')
    check_choice(spec['tap'], 'branch tap', TAPS)
    check_int(spec['call'], 'branch call', minimum=0)
    return spec


def first_tensor(output: Any) -> Tensor:
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
    x = first_tensor(output).detach()
    if x.dim() == 3:
        x = pool_token_sequence(x, pool)
    elif x.dim() == 4:
        x = x.mean(dim=(2, 3))
    elif x.dim() != 2:
        raise ValueError(f'cannot turn a module output of shape '
                         f'{tuple(x.shape)} into (N, C) embeddings')
    return x


class BranchTaps:
    """Forward hooks keeping the branches' tensors while armed.

    Unarmed, a tap returns after one attribute check, so the training steps
    that are not sampled pay nothing.

    Args:
        branches: Full branch specifications (:func:`checked_branch`).
    """

    def __init__(self, branches: Sequence[dict]) -> None:
        self.branches = list(branches)
        self.armed = False
        self._records: Dict[tuple, List[Tensor]] = {}
        self._handles: list = []

    @property
    def attached(self) -> bool:
        """Whether the forward hooks are registered on a model."""
        return bool(self._handles)

    def attach(self, model: nn.Module) -> None:
        """Register the forward hooks on ``model``'s branch modules.

        Args:
            model: The unwrapped algorithm (or a copy of it).
        """
        self.detach()  # never tap a module twice
        for name in {b['module'] for b in self.branches}:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f'MatrixInfoHook: {type(model).__name__} has no '
                    f'submodule {name!r} (branches={self.branches})') from None
            self._handles.append(
                module.register_forward_hook(self._recorder(name)))

    def detach(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def clear(self) -> None:
        """Drop the kept tensors."""
        self._records = {}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Keep the tensors of the forward passes inside the block only."""
        self._records, self.armed = {}, True
        try:
            yield
        finally:
            self.armed = False

    def _recorder(self, name: str):
        """Forward hook keeping ``name``'s inputs/outputs while armed."""
        taps = {b['tap'] for b in self.branches if b['module'] == name}

        def record(module: nn.Module, args: Any, output: Any) -> None:
            if self.armed:
                # Clone: later in-place ops of the model must not alter it.
                for tap in taps:
                    kept = first_tensor(args if tap == 'input' else output)
                    self._records.setdefault((name, tap),
                                             []).append(kept.detach().clone())

        return record

    def embeddings(self) -> List[Tensor]:
        """The local (N, C) embeddings of each branch from the kept tensors.

        Returns:
            One tensor per branch, in the order of the branches.
        """
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
