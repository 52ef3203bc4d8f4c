"""Shared parts of the batch-level feature regularisers (TCR, uniformity)."""
import logging
from abc import abstractmethod

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch import Tensor

from mmae_plugin.matrix_info import check_features
from mmae_plugin.matrix_info.coding_rate import unit_rows
from mmae_plugin.matrix_info.validation import (check_finite_result,
                                                check_init_cfg, check_real)
from ..utils import check_gather_mode, gather_features

#: Largest weight whose float32 loss can be finite for a non-zero term.
MAX_LOSS_WEIGHT = float(torch.finfo(torch.float32).max)


class FeatureRegularizer(BaseModule):
    """Base of losses on the l2-normalised features of the whole batch.

    Subclasses implement :meth:`value` on the normalised, gathered features;
    this class validates arguments and input, gathers across ranks and runs
    the arithmetic in float64 with autocast disabled (the reference runs took
    the Gram matrix under fp16 autocast; we do not). Rows are normalised at
    any scale (:func:`~mmae_plugin.matrix_info.coding_rate.unit_rows`);
    an all-zero row is refused.

    A batch of fewer than 2 samples (after the gather), e.g. the last batch
    of an epoch with ``drop_last=False``, has no batch statistics: the term
    is skipped for that step with a logged warning and a zero that keeps the
    autograd graph (and, under DDP, the gather's collectives) is returned.

    Args:
        gather: How features of other ranks enter the loss: ``'global'``,
            ``'reference'`` or ``'local'``
            (see :mod:`mmae_plugin.models.utils.gather`).
        loss_weight: Weight of the term, a real number in
            [0, float32 max].
        init_cfg: mmengine initialisation config (None, a dict or a list).
    """

    #: key under which :class:`~mmae_plugin.models.MMAE` logs the term.
    loss_name = 'loss_reg'

    def __init__(self, gather: str = 'global', loss_weight: float = 0.01,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=check_init_cfg(init_cfg))
        self.gather = check_gather_mode(gather)
        self.loss_weight = check_real(loss_weight, 'loss_weight', minimum=0,
                                      maximum=MAX_LOSS_WEIGHT)

    @abstractmethod
    def value(self, zn: Tensor) -> Tensor:
        """The unweighted term on unit-norm rows ``zn`` (N, d), float64."""

    def forward(self, features: Tensor) -> Tensor:
        """Weighted regulariser of this batch of features.

        Args:
            features: (B, d) features of this rank; gathered per ``gather``.

        Returns:
            Scalar float32 loss.
        """
        check_features(features, name='features')
        z = gather_features(features, self.gather)
        if z.shape[0] < 2:
            print_log(
                f'{type(self).__name__} skipped for this step: it needs at '
                f'least 2 samples in the (gathered) batch, got {z.shape[0]} '
                '(a last batch with drop_last=False?)',
                logger='current', level=logging.WARNING)
            return (z.sum() * 0.0).float()
        with torch.autocast(device_type=z.device.type, enabled=False):
            zn = unit_rows(z.to(torch.float64), name='features')
            term = self.value(zn)
            loss = (self.loss_weight * term).float()
        if not bool(torch.isfinite(loss.detach())):
            check_finite_result(
                loss, f'{type(self).__name__} loss',
                f'loss_weight={self.loss_weight!r} times the term '
                f'{term.item():.6g} overflows float32; use a smaller '
                'loss_weight')
        return loss
