"""Head of spectral contrastive learning: the loss of two projections."""
from typing import Optional, Union

from mmengine.model import BaseModule
from mmpretrain.registry import MODELS
from torch import Tensor


@MODELS.register_module()
class SpectralContrastiveHead(BaseModule):
    """Apply a two-view loss to the projections of the two views.

    Shaped like mmpretrain's ``LatentCrossCorrelationHead`` minus its
    batch normalisation: the spectral loss acts on the projections
    themselves (standardising them would change the objective).

    Args:
        loss: Config of the loss module, called as ``loss(z1, z2)``;
            ``dict(type='SpectralContrastiveLoss')`` by default.
        init_cfg: Initialisation config (the head has no parameters).
    """

    def __init__(self,
                 loss: Optional[dict] = None,
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg)
        self.loss_module = MODELS.build(
            dict(type='SpectralContrastiveLoss') if loss is None else loss)

    def loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The loss of one batch of positive pairs.

        Args:
            z1: Projections of view 1 (B, d).
            z2: Projections of view 2 (B, d), row-aligned with ``z1``.

        Returns:
            Scalar loss.
        """
        return self.loss_module(z1, z2)
