"""Gathering of features across ranks, for any per-rank batch sizes.

Three modes, chosen by the losses' ``gather`` argument:

* ``'global'``: the backward sums every rank's gradient for the local slice
  (as :func:`torch.distributed.nn.functional.all_gather`), so under DDP the
  gradient equals one process's on the whole global batch;
* ``'reference'``: mmpretrain's ``GatherLayer`` (the published U-MAE / M-MAE
  code): only this rank's gradient, an effective ``loss_weight /
  world_size``;
* ``'local'``: no gather; each rank regularises its own batch.

:class:`RowGatherer` sends each rank's rows padded to a per-rank capacity
behind a small header, in one ``all_gather_into_tensor`` per step, with a
device-side mask of the valid rows; the layout (capacity, row shape, dtype)
is agreed on the first gathered call, and rows that later no longer fit it
set :attr:`GatheredRows.refused` on every rank. :func:`gather_rows` (for
``MatrixInfoHook``) returns the concatenated valid rows. Choosing a mode:
docs/usage.md#choosing-gather-read-this-before-changing-gpu-counts; the
slots and why: docs/reliability.md#distributed-regularisers-agree-across-ranks.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from mmae_plugin.utils.validation import check_choice, check_int
from .gather_layout import (HEADER_BYTES, HEADER_WORDS, ROWS, STATUS,
                            RowLayout, agree_layout, describe_ranks,
                            header_tensor, header_words)

GATHER_MODES = ('global', 'reference', 'local')


def check_gather_mode(gather: str) -> str:
    """Return ``gather`` if it is a known mode, else raise a clear error."""
    return check_choice(gather, 'gather', GATHER_MODES)


def check_capacity(capacity: Optional[int],
                   name: str = 'gather_capacity') -> Optional[int]:
    """Return ``capacity`` if it is ``None`` or an int >= 1, else raise."""
    if capacity is None:
        return None
    return check_int(capacity, name, minimum=1)


def is_distributed() -> bool:
    """Whether a process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() \
        and dist.get_world_size() > 1


def exchange_headers(x: Tensor, capacity: Optional[int]) -> List[List[int]]:
    """All-gather every rank's header (one collective, one host read).

    Args:
        x: Local rows.
        capacity: The configured capacity (travels in the header so a
            mismatch across ranks is seen).

    Returns:
        One header per rank, in rank order.
    """
    local = header_tensor(header_words(x, capacity), x.device)
    gathered = torch.empty(
        dist.get_world_size() * HEADER_WORDS,
        dtype=torch.int64,
        device=x.device)
    dist.all_gather_into_tensor(gathered, local)
    return gathered.view(-1, HEADER_WORDS).tolist()


# ------------------------------------------------------------ the collective
def pack_slot(x: Tensor, layout: RowLayout) -> Tensor:
    """This rank's slot: header and rows padded with zeros, as bytes.

    Rows that do not fit ``layout`` are not sent: the slot holds no row and
    its header's status says why.

    Args:
        x: Local rows.
        layout: The agreed layout.

    Returns:
        ``(layout.slot_bytes,)`` uint8 tensor on ``x``'s device.
    """
    status = layout.status_of(x)
    slot = torch.zeros(layout.slot_bytes, dtype=torch.uint8, device=x.device)
    slot[:HEADER_BYTES].copy_(
        header_tensor(header_words(x, layout.capacity, status),
                      x.device).view(torch.uint8))
    if status == 0 and x.numel():
        rows = x.detach().contiguous().view(-1).view(torch.uint8)
        slot[HEADER_BYTES:HEADER_BYTES + rows.numel()].copy_(rows)
    return slot


def _slot_rows(slots: Tensor, layout: RowLayout) -> Tensor:
    """Rows (W * capacity, *row_shape) of gathered slots (W, slot_bytes)."""
    payload = slots[:, HEADER_BYTES:HEADER_BYTES + layout.payload_bytes]
    values = payload.contiguous().view(layout.dtype)
    return values.reshape(-1, *layout.row_shape)


class _SlotAllGather(torch.autograd.Function):
    """One all-gather of the slots; exact backward to the valid rows."""

    @staticmethod
    def forward(ctx, x: Tensor, layout: RowLayout,
                gather: str) -> Tuple[Tensor, Tensor]:
        world, rank = dist.get_world_size(), dist.get_rank()
        slot = pack_slot(x, layout)
        slots = torch.empty(
            world * slot.numel(), dtype=torch.uint8, device=x.device)
        dist.all_gather_into_tensor(slots, slot)
        slots = slots.view(world, -1)
        headers = slots[:, :HEADER_BYTES].contiguous().view(torch.int64)
        rows = _slot_rows(slots, layout)
        ctx.layout, ctx.gather, ctx.rank, ctx.world = (layout, gather, rank,
                                                       world)
        ctx.sent = layout.status_of(x) == 0
        ctx.local_shape = x.shape
        ctx.mark_non_differentiable(headers)
        return rows, headers

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_rows: Tensor, _grad_headers: Tensor):
        layout = ctx.layout
        grad_rows = grad_rows.contiguous()
        if ctx.gather == 'reference':
            # GatherLayer: this rank's own gradient for its slice, no
            # collective.
            mine = grad_rows.view(ctx.world, layout.capacity,
                                  *layout.row_shape)[ctx.rank]
        elif dist.get_backend() == dist.Backend.NCCL:
            mine = torch.empty((layout.capacity, *layout.row_shape),
                               dtype=grad_rows.dtype,
                               device=grad_rows.device)
            dist.reduce_scatter_tensor(mine, grad_rows)
        else:
            # Every backend has all_reduce; reduce_scatter is NCCL's (and
            # only recent gloo's). The sum for this rank's slice is the same.
            total = grad_rows.clone()
            dist.all_reduce(total)
            mine = total.view(ctx.world, layout.capacity,
                              *layout.row_shape)[ctx.rank]
        if not ctx.sent:
            return (grad_rows.new_zeros(ctx.local_shape), None, None)
        return mine[:ctx.local_shape[0]], None, None


@dataclass
class GatheredRows:
    """Every rank's slot of one gather, still padded.

    Attributes:
        rows: (W * capacity, ...) rows in rank order; padding rows are zero.
        valid: (W * capacity,) bool, True for the rows some rank sent.
        count: Scalar int64, the number of valid rows.
        refused: Scalar bool, True when some rank's rows did not fit the
            layout and were not sent (its header's status says why).
        headers: (W, :data:`HEADER_WORDS`) int64, every rank's header.
    """

    rows: Tensor
    valid: Tensor
    count: Tensor
    refused: Tensor
    headers: Tensor


def slot_gather(x: Tensor, layout: RowLayout, gather: str) -> GatheredRows:
    """Gather ``x`` of every rank into padded slots: one collective.

    Reads nothing on the host.

    Args:
        x: Local rows (N, ...), ``N <= layout.capacity`` to be sent.
        layout: The layout agreed by every rank.
        gather: ``'global'`` or ``'reference'`` (the backward).

    Returns:
        The padded rows with their mask.
    """
    rows, headers = _SlotAllGather.apply(x, layout, gather)
    sent = headers[:, STATUS] == 0
    counts = torch.where(sent, headers[:, ROWS], 0)
    slot_index = torch.arange(layout.capacity, device=rows.device)
    valid = (slot_index.unsqueeze(0) < counts.unsqueeze(1)).flatten()
    return GatheredRows(
        rows=rows,
        valid=valid,
        count=counts.sum(),
        refused=~sent.all(),
        headers=headers)


class RowGatherer:
    """Gathers rows with one collective per call once the layout is agreed.

    Holds the :class:`RowLayout` of one call site (the regulariser's
    features): agreed on the first call under a process group and reused
    while that group lives.

    Args:
        capacity: Rows reserved per rank, e.g. the per-GPU batch size;
            ``None``: the largest per-rank row count of the first call.
        what: What the rows are, for error messages.
    """

    def __init__(self,
                 capacity: Optional[int] = None,
                 what: str = 'features') -> None:
        self.capacity = check_capacity(capacity)
        self.what = what
        # The group's id, not the group: a module holding a ProcessGroup
        # could not be deep-copied (EMA) or pickled.
        self._group_key: Optional[Tuple[int, int]] = None
        self._layout: Optional[RowLayout] = None

    @property
    def layout(self) -> Optional[RowLayout]:
        """The agreed layout, ``None`` before the first gathered call."""
        return self._layout

    def _layout_for(self, x: Tensor) -> Optional[RowLayout]:
        """The layout under the current group, agreed on first use."""
        key = (id(dist.group.WORLD), dist.get_world_size())
        if self._group_key != key or self._layout is None:
            headers = exchange_headers(x, self.capacity)
            self._layout = agree_layout(headers, self.capacity, self.what)
            self._group_key = key
        return self._layout

    def __call__(self, x: Tensor, gather: str) -> Optional[GatheredRows]:
        """Gather ``x`` of every rank (call only when distributed).

        Args:
            x: Local rows (N, ...).
            gather: ``'global'`` or ``'reference'``.

        Returns:
            The padded rows, or ``None`` when no rank has a row yet and no
            capacity is configured (every rank returns ``None`` then).
        """
        layout = self._layout_for(x)
        if layout is None:
            return None
        return slot_gather(x, layout, gather)

    def mismatch_message(self, headers: Tensor) -> str:
        """Why some rank's rows were not sent (reads ``headers``: a sync).

        Args:
            headers: :attr:`GatheredRows.headers` of the gather.

        Returns:
            One sentence naming each rank's rows and the agreed layout.
        """
        layout = self._layout
        return (f'the {self.what} of some rank did not fit the gather layout '
                f'agreed at the first gathered step (capacity '
                f'{layout.capacity} rows of {layout.row_shape} '
                f'{str(layout.dtype).replace("torch.", "")} per rank): '
                f'{describe_ranks(headers.tolist())}; set gather_capacity to '
                'the per-GPU batch size and keep the features of every rank '
                'the same width and dtype')


def gather_rows(x: Tensor,
                gather: str = 'global',
                capacity: Optional[int] = None) -> Tensor:
    """Concatenate the rows of ``x`` from every rank (counts may differ).

    Agrees the layout first (a header all-gather, read on the host), then
    gathers the padded slots and cuts the padding: two collectives, one
    host read. Every rank returns the same rows or raises the same error.

    Args:
        x: Local (N_rank, ...) tensor.
        gather: ``'global'`` or ``'reference'``, the backward (see the module
            docstring); under ``torch.no_grad`` both are a plain all-gather.
        capacity: Rows reserved per rank (``None``: the largest count).

    Returns:
        (sum N_rank, ...) tensor, rank 0's rows first; ``x`` itself when not
        distributed.

    Raises:
        ValueError: Row shapes or dtypes differ across ranks.
    """
    if not is_distributed():
        return x
    capacity = check_capacity(capacity, 'capacity')
    headers = exchange_headers(x, capacity)
    layout = agree_layout(headers, capacity)
    if layout is None:  # no rank has a row
        return x
    gathered = slot_gather(x, layout, gather)
    parts = gathered.rows.split(layout.capacity)
    return torch.cat(
        [part[:int(words[ROWS])] for part, words in zip(parts, headers)],
        dim=0)


def gather_features(features: Tensor, gather: str) -> Tensor:
    """Concatenate ``features`` (B, d) of all ranks along the batch axis.

    Args:
        features: This rank's features.
        gather: One of :data:`GATHER_MODES`.

    Returns:
        (sum of B over ranks, d) features in rank order, or ``features``
        itself when not distributed or when ``gather='local'``.
    """
    check_gather_mode(gather)
    if gather == 'local':
        return features
    return gather_rows(features, gather)
