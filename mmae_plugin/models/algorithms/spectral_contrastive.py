"""Spectral contrastive learning (HaoChen et al., NeurIPS 2021) in mmpretrain.
"""
from typing import Dict, List, Optional

import torch
from mmpretrain.models import BaseSelfSupervisor
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

# The head and loss this algorithm's configs name: importing the algorithm
# registers them.
from mmae_plugin.models.heads import SpectralContrastiveHead  # noqa: F401
from mmae_plugin.models.losses.spectral_contrastive_loss import \
    SpectralContrastiveLoss  # noqa: F401


@MODELS.register_module()
class SpectralContrastive(BaseSelfSupervisor):
    """Siamese network trained with the spectral contrastive loss.

    The forward is Barlow Twins' (one shared backbone and projector, run on
    view 1 then on view 2, so ``MatrixInfoHook`` taps ``neck`` calls 0 and
    1), with ``SpectralContrastiveHead`` instead of the cross-correlation
    head. In distributed training each rank's loss uses its own batch: the
    off-diagonal estimator is unbiased for any batch size, so no
    all-gather is needed (the authors' code is single-process too).
    """

    def loss(self,
             inputs: List[torch.Tensor],
             data_samples: Optional[List[DataSample]] = None,
             **kwargs) -> Dict[str, torch.Tensor]:
        """The loss of one batch of two-view inputs.

        Args:
            inputs: The two views, each (B, C, H, W).
            data_samples: Unused (self-supervised).

        Returns:
            ``dict(loss=...)``.
        """
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise ValueError('SpectralContrastive needs two views per image '
                             '(a MultiView pipeline with num_views=2)')
        z1 = self.neck(self.backbone(inputs[0]))[0]
        z2 = self.neck(self.backbone(inputs[1]))[0]
        return dict(loss=self.head.loss(z1, z2))
