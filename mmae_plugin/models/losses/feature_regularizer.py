"""Shared parts of the batch-level feature regularisers (TCR, uniformity)."""
import math
from abc import abstractmethod

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor

from mmae_plugin.matrix_info import check_features
from ..utils import check_gather_mode, gather_features


class FeatureRegularizer(BaseModule):
    """Base of losses on the l2-normalised features of the whole batch.

    Subclasses implement :meth:`value` on the normalised, gathered features;
    this class validates arguments and input, gathers across ranks and runs
    the arithmetic in float64 with autocast disabled (the reference runs took
    the Gram matrix under fp16 autocast; we do not).

    Args:
        gather: How features of other ranks enter the loss: ``'global'``,
            ``'reference'`` or ``'local'``
            (see :mod:`mmae_plugin.models.utils.gather`).
        loss_weight: Non-negative weight of the term.
    """

    #: key under which :class:`~mmae_plugin.models.MMAE` logs the term.
    loss_name = 'loss_reg'

    def __init__(self, gather: str = 'global', loss_weight: float = 0.01,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.gather = check_gather_mode(gather)
        if not (isinstance(loss_weight, (int, float))
                and math.isfinite(loss_weight) and loss_weight >= 0):
            raise ValueError('loss_weight must be a finite number >= 0, '
                             f'got {loss_weight!r}')
        self.loss_weight = float(loss_weight)

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
            raise ValueError(
                f'{type(self).__name__} needs at least 2 samples in the '
                f'(gathered) batch, got {z.shape[0]}')
        with torch.autocast(device_type=z.device.type, enabled=False):
            zn = F.normalize(z.to(torch.float64), dim=1)
            return (self.loss_weight * self.value(zn)).float()
