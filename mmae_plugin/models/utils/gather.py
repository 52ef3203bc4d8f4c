"""Gathering of features across ranks, for any per-rank batch sizes.

Three modes, chosen by the losses' ``gather`` argument:

* ``'global'``: :func:`torch.distributed.nn.functional.all_gather`, whose
  backward sums every rank's gradient for the local slice. Under DDP (which
  averages parameter gradients over ranks) the result equals the gradient of
  the loss computed by one process on the whole global batch, so the loss
  weight means the same thing for any number of GPUs.
* ``'reference'``: mmpretrain's ``GatherLayer`` (the gather of the published
  U-MAE / M-MAE code): backward returns the local slice of this rank's
  gradient only. Under DDP the regulariser's gradient is ``1 / world_size``
  of the true one, i.e. the effective weight is ``loss_weight / world_size``.
* ``'local'``: no gather; each rank regularises its own batch.

Ranks may hold different numbers of rows (a sampler with
``round_up=False``, the last batch of an epoch with ``drop_last=False``):
the row counts are exchanged first, every rank pads to the largest, and the
padding is cut off after the all-gather. Collectives need equal shapes
(gloo aborts with "Received data size doesn't match expected size", NCCL
would return garbage). The counts travel over a gloo group on the host, so
learning them costs no device sync.
"""
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mmpretrain.models.selfsup.simclr import GatherLayer
from torch import Tensor
from torch.distributed.nn.functional import all_gather

from mmae_plugin.matrix_info.validation import check_choice

GATHER_MODES = ('global', 'reference', 'local')

#: Host-side gloo groups, one per default process group they were made for.
_HOST_GROUPS: dict = {}


def check_gather_mode(gather: str) -> str:
    """Return ``gather`` if it is a known mode, else raise a clear error."""
    return check_choice(gather, 'gather', GATHER_MODES)


def is_distributed() -> bool:
    """Whether a process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() \
        and dist.get_world_size() > 1


def host_group() -> Optional[dist.ProcessGroup]:
    """A gloo group over all ranks, for small host-side exchanges.

    The default group itself when its backend is gloo; otherwise (NCCL) a
    gloo group made on first use. Every rank reaches the first call at the
    same point of the same program (the first gathered step), as
    ``new_group`` requires.

    Returns:
        The group (``None`` means the default group).
    """
    if dist.get_backend() == dist.Backend.GLOO:
        return None
    world = dist.group.WORLD
    if world not in _HOST_GROUPS:
        _HOST_GROUPS[world] = dist.new_group(backend=dist.Backend.GLOO)
    return _HOST_GROUPS[world]


def row_counts(num_rows: int) -> List[int]:
    """Every rank's ``num_rows``, in rank order, exchanged on the host.

    Args:
        num_rows: This rank's number of rows.

    Returns:
        One int per rank.
    """
    local = torch.tensor([num_rows], dtype=torch.int64)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local, group=host_group())
    # A CPU tensor: reading it waits for no device.
    return torch.cat(parts).tolist()


def gather_rows(x: Tensor, gather: str = 'global') -> Tensor:
    """Concatenate the rows of ``x`` from every rank (counts may differ).

    Args:
        x: Local (N_rank, ...) tensor.
        gather: ``'global'`` or ``'reference'``, the backward (see the module
            docstring); under ``torch.no_grad`` both are a plain all-gather.

    Returns:
        (sum N_rank, ...) tensor, rank 0's rows first; ``x`` itself when not
        distributed.
    """
    if not is_distributed():
        return x
    counts = row_counts(x.shape[0])
    longest = max(counts)
    # Differentiable padding: its backward drops the padded rows' gradient.
    padded = x if x.shape[0] == longest else F.pad(
        x, (0, 0) * (x.dim() - 1) + (0, longest - x.shape[0]))
    padded = padded.contiguous()
    if gather == 'global':
        parts = all_gather(padded)
    else:
        parts = GatherLayer.apply(padded)
    return torch.cat([part[:n] for part, n in zip(parts, counts)], dim=0)


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
