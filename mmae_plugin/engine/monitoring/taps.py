"""What :class:`~.MatrixInfoHook` taps: branch specifications and taps.

A branch names the submodule whose output (or input) is an embedding the
loss uses, which call of it within one training step, which tensor of a
tuple output, which rows and how token outputs are pooled.
:func:`checked_branch` validates one; :class:`BranchTaps` holds the PyTorch
forward hooks that keep those tensors from the training forward pass itself
(no second forward). The defaults of each algorithm are in
:mod:`.branches`.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import Tensor, nn

from mmae_plugin.matrix_info.pooling import (check_pooling_name,
                                             pool_token_sequence)
from mmae_plugin.utils.validation import check_choice, check_int, check_keys
# default_branches stays importable from here (its former home).
from .branches import default_branches  # noqa: F401

#: Row selections: every row, view 1 / view 2 of an interleaved batch, or
#: every row in an order the model permuted (MoCo's batch shuffle).
ROWS = ('all', 'even', 'odd', 'shuffled')
TAPS = ('output', 'input')
BRANCH_KEYS = ('module', 'call', 'rows', 'pool', 'tap', 'index', 'block',
               'extra_tokens', 'token_mask')
#: Keys every branch has once checked, with their defaults.
BRANCH_DEFAULTS = dict(call=0, rows='all', pool='cls', tap='output')
#: Keys a branch has only where they are set, with their defaults.
OPTIONAL_DEFAULTS = dict(index=(), block=None, extra_tokens=1, token_mask=None)


# --------------------------------------------------------------------------
# branch specifications
# --------------------------------------------------------------------------
def check_row_pairing(branches: Sequence[dict], kernel: str) -> None:
    """Refuse row-paired quantities on branches whose rows are permuted.

    Args:
        branches: Full branch specifications.
        kernel: The hook's kernel; ``'gram'`` pairs row i with row i.
    """
    shuffled = any(b['rows'] == 'shuffled' for b in branches)
    if kernel == 'gram' and len(branches) == 2 and shuffled:
        raise ValueError(
            "MatrixInfoHook: a branch with rows='shuffled' (MoCo v2 and "
            'DenseCL keys are batch-shuffled) cannot be paired row by row '
            "with kernel='gram'; use kernel='covariance', whose quantities "
            'do not depend on the order of the rows')


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
        branch: A dict with ``module`` and optionally the other
            :data:`BRANCH_KEYS`.

    Returns:
        The specification with the :data:`BRANCH_DEFAULTS` filled (the
        :data:`OPTIONAL_DEFAULTS` apply where unset: :func:`option`).
    """
    spec = {
        **BRANCH_DEFAULTS,
        **check_keys(branch, 'branch', 'module', BRANCH_KEYS)
    }
    if not isinstance(spec['module'], str):
        raise TypeError(f'branch module must be a dotted submodule name, '
                        f'got {spec["module"]!r}')
    check_choice(spec['rows'], 'branch rows', ROWS)
    check_pooling_name(spec['pool'], 'branch pool')
    check_choice(spec['tap'], 'branch tap', TAPS)
    check_int(spec['call'], 'branch call', minimum=0)
    if 'index' in spec:
        spec['index'] = checked_index(spec['index'])
    if 'block' in spec:
        spec['block'] = checked_block(spec['block'])
    extra = check_int(
        option(spec, 'extra_tokens'), 'branch extra_tokens', minimum=0)
    if spec['pool'] != 'mean' and extra < 1:
        raise ValueError(f'branch pool={spec["pool"]!r} needs a CLS token, '
                         f'but extra_tokens=0 in {branch!r}')
    if option(spec, 'token_mask') is not None:
        check_int(spec['token_mask'], 'branch token_mask')
        if spec['pool'] != 'mean':
            raise ValueError(f'branch token_mask needs pool=\'mean\', got '
                             f'{spec["pool"]!r} in {branch!r}')
    return spec


def option(spec: dict, key: str) -> Any:
    """An optional branch key's value, or its default if unset."""
    return spec.get(key, OPTIONAL_DEFAULTS[key])


def checked_index(index: Any) -> Tuple[int, ...]:
    """The ``index`` of a branch as a tuple of ints (outermost first)."""
    if not isinstance(index, (list, tuple)):
        index = (index, )
    return tuple(check_int(i, 'branch index') for i in index)


def checked_block(block: Any) -> Optional[Tuple[int, int]]:
    """The ``block`` of a branch, ``(i, n)`` with ``0 <= i < n``, or None."""
    if block is None:
        return None
    if not isinstance(block, (list, tuple)) or len(block) != 2:
        raise ValueError(f'branch block must be None or (index, count), '
                         f'got {block!r}')
    count = check_int(block[1], 'branch block count', minimum=1)
    position = check_int(block[0], 'branch block index', minimum=0)
    if position >= count:
        raise ValueError(f'branch block index must be < its count, got '
                         f'{block!r}')
    return position, count


# --------------------------------------------------------------------------
# from a module's output to (N, C) embeddings
# --------------------------------------------------------------------------
def first_tensor(output: Any, index: Sequence[int] = ()) -> Tensor:
    """The tensor at ``index`` of a (nested) tuple/list output.

    Args:
        output: A tensor or a nested tuple/list of them.
        index: Positions to follow, outermost first; past them, the first
            element is followed until a tensor.

    Returns:
        The tensor.
    """
    for position in index:
        if not isinstance(output, (tuple, list)):
            raise TypeError(f'a tapped module returned '
                            f'{type(output).__name__}, which branch index '
                            f'{tuple(index)} cannot index')
        try:
            output = output[position]
        except IndexError:
            raise ValueError(f'branch index {tuple(index)} is out of range '
                             f'of the tapped output') from None
    while isinstance(output, (tuple, list)):
        if not output:
            raise ValueError('a tapped module returned an empty sequence')
        output = output[0]
    if not isinstance(output, Tensor):
        raise TypeError(f'a tapped module returned {type(output).__name__}, '
                        f'expected a tensor or a tuple starting with one')
    return output


def own_token_mean(tokens: Tensor, mask: Tensor) -> Tensor:
    """Mean of each row's tokens where ``mask`` is 0 (MixMIM's own ones).

    Args:
        tokens: (N, L, C).
        mask: (1 or N, L) or (1 or N, L, 1); non-zero marks a token of
            another sample.

    Returns:
        (N, C).
    """
    keep = (mask == 0).to(tokens.dtype).reshape(mask.shape[0], -1, 1)
    keep = keep.expand(tokens.shape[0], tokens.shape[1], 1)
    return (tokens * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1)


def to_embeddings(output: Any,
                  pool: str,
                  extra_tokens: int = 1,
                  mask: Optional[Tensor] = None) -> Tensor:
    """Turn a module output into one embedding row per sample (N, C).

    Args:
        output: Tensor or tuple; its first tensor is used. (N, C) is kept,
            (N, L, C) tokens are pooled by
            :func:`~mmae_plugin.matrix_info.pooling.pool_token_sequence`
            (``extra_tokens`` leading non-patch tokens), (N, C, H, W) maps
            are averaged over space.
        pool: One of :data:`~mmae_plugin.matrix_info.pooling.POOLINGS`.
        extra_tokens: Leading non-patch tokens (1: the CLS).
        mask: Token mask of a branch with ``token_mask`` (see
            :func:`own_token_mean`); only with ``pool='mean'``.

    Returns:
        Detached (N, C) (or (N, 2C) for ``'cls+mean'``) tensor.
    """
    x = first_tensor(output).detach()
    if x.dim() == 3 and mask is not None:
        x = own_token_mean(x[:, extra_tokens:], mask)
    elif x.dim() == 3:
        x = pool_token_sequence(x, pool, extra_tokens)
    elif x.dim() == 4:
        x = x.mean(dim=(2, 3))
    elif x.dim() != 2:
        raise ValueError(f'cannot turn a module output of shape '
                         f'{tuple(x.shape)} into (N, C) embeddings')
    return x


def select_rows(z: Tensor, rows: str, block: Optional[tuple]) -> Tensor:
    """The rows of a branch: its ``block`` of ``z``, then ``rows`` of it.

    Args:
        z: (M, C) embeddings of one call.
        rows: One of :data:`ROWS`.
        block: ``(i, n)``: the i-th of n equal consecutive blocks (SwAV's
            crops are stacked crop by crop), or None for all rows.

    Returns:
        The selected rows.
    """
    if block is not None:
        position, count = block
        if z.shape[0] % count:
            raise ValueError(f'branch block {block} needs a multiple of '
                             f'{count} rows, got {z.shape[0]}')
        size = z.shape[0] // count
        z = z[position * size:(position + 1) * size]
    if rows == 'even':
        return z[0::2]
    if rows == 'odd':
        return z[1::2]
    return z


def record_key(spec: dict) -> tuple:
    """What a branch needs kept of its module: where, which tensor(s)."""
    return (spec['module'], spec['tap'], option(spec, 'index'),
            option(spec, 'token_mask'))


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
        self._records: Dict[tuple, List[tuple]] = {}
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
        keys = {record_key(b) for b in self.branches if b['module'] == name}

        def record(module: nn.Module, args: Any, output: Any) -> None:
            if self.armed:
                # Clone: later in-place ops of the model must not alter it.
                for key in keys:
                    _, tap, index, token_mask = key
                    kept = first_tensor(args if tap == 'input' else output,
                                        index).detach().clone()
                    mask = None if token_mask is None else first_tensor(
                        output, (token_mask, )).detach().clone()
                    self._records.setdefault(key, []).append((kept, mask))

        return record

    def embeddings(self) -> List[Tensor]:
        """The local (N, C) embeddings of each branch from the kept tensors.

        Returns:
            One tensor per branch, in the order of the branches.
        """
        embeddings = []
        for spec in self.branches:
            calls = self._records.get(record_key(spec), [])
            if spec['call'] >= len(calls):
                raise RuntimeError(
                    f'MatrixInfoHook expected call {spec["call"]} of '
                    f'{spec["module"]!r} in the training step but saw '
                    f'{len(calls)} call(s); set branches= to match the '
                    f'model\'s forward')
            kept, mask = calls[spec['call']]
            z = to_embeddings(kept, spec['pool'], option(spec, 'extra_tokens'),
                              mask)
            embeddings.append(
                select_rows(z, spec['rows'], option(spec, 'block')))
        return embeddings
