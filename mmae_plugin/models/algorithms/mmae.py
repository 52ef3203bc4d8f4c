"""M-MAE and U-MAE: MAE with a regulariser on the encoder's batch features."""
from typing import Dict, List, Optional

from mmpretrain.models import MAE
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from torch import Tensor

FEATURES = ('cls', 'mean_visible')


@MODELS.register_module()
class MMAE(MAE):
    """MAE whose loss adds a regulariser of the encoder representations.

    With ``regularizer=dict(type='TCRLoss')`` this is M-MAE (Zhang et al.,
    matrix information theory for SSL); with ``UniformityLoss`` it is U-MAE;
    with ``None`` its loss is mmpretrain's ``MAE`` loss, bit for bit. The
    reconstruction and the regulariser are returned as separate keys
    (``loss_rec`` and the regulariser's ``loss_name``) so logs show both; the
    runner sums them.

    Args:
        backbone: Config of the encoder (``MAEViT``).
        neck: Config of the decoder (``MAEPretrainDecoder``).
        head: Config of the reconstruction head (``MAEPretrainHead``).
        regularizer: Config of a batch-feature loss, or ``None``.
        feature: Which representation is regularised: ``'cls'``, the CLS
            token of the masked encoder pass (as the reference code), or
            ``'mean_visible'``, the mean of the visible patch tokens. Both are
            taken after the encoder's final norm.
        **kwargs: Other arguments of :class:`mmpretrain.models.MAE`.
    """

    def __init__(self, backbone: dict, neck: dict, head: dict,
                 regularizer: Optional[dict] = None, feature: str = 'cls',
                 **kwargs) -> None:
        if feature not in FEATURES:
            raise ValueError(
                f'feature must be one of {FEATURES}, got {feature!r}')
        super().__init__(backbone=backbone, neck=neck, head=head, **kwargs)
        self.feature = feature
        self.regularizer = MODELS.build(regularizer) \
            if regularizer is not None else None

    def pool(self, latent: Tensor) -> Tensor:
        """Representation (B, C) of the masked encoder output (B, 1 + L, C)."""
        if self.feature == 'cls':
            return latent[:, 0]
        return latent[:, 1:].mean(dim=1)

    def loss(self, inputs: Tensor, data_samples: List[DataSample],
             **kwargs) -> Dict[str, Tensor]:
        """Reconstruction loss plus the regulariser.

        Args:
            inputs: Images (B, C, H, W).
            data_samples: Unused; kept for mmpretrain's interface.

        Returns:
            ``loss_rec`` and, with a regulariser, its ``loss_name`` key.
        """
        latent, mask, ids_restore = self.backbone(inputs)
        pred = self.neck(latent, ids_restore)
        losses = dict(loss_rec=self.head.loss(pred, inputs, mask))
        if self.regularizer is not None:
            losses[self.regularizer.loss_name] = self.regularizer(
                self.pool(latent))
        return losses
