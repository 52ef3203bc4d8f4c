"""Differentiable gathering of features across ranks.

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
"""
import torch
import torch.distributed as dist
from mmpretrain.models.selfsup.simclr import GatherLayer
from torch import Tensor
from torch.distributed.nn.functional import all_gather

from mmae_plugin.matrix_info.validation import check_choice

GATHER_MODES = ('global', 'reference', 'local')


def check_gather_mode(gather: str) -> str:
    """Return ``gather`` if it is a known mode, else raise a clear error."""
    return check_choice(gather, 'gather', GATHER_MODES)


def gather_features(features: Tensor, gather: str) -> Tensor:
    """Concatenate ``features`` (B, d) of all ranks along the batch axis.

    Args:
        features: This rank's features.
        gather: One of :data:`GATHER_MODES`.

    Returns:
        (W * B, d) features in rank order, or ``features`` itself when not
        distributed or when ``gather='local'``.
    """
    check_gather_mode(gather)
    if gather == 'local' or not dist.is_available() \
            or not dist.is_initialized() or dist.get_world_size() == 1:
        return features
    if gather == 'global':
        return torch.cat(all_gather(features.contiguous()), dim=0)
    return torch.cat(GatherLayer.apply(features.contiguous()), dim=0)
