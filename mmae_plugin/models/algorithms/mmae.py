"""M-MAE and U-MAE: MAE with a regulariser on the encoder's batch features."""
from typing import Dict, List, Optional, Union

from mmpretrain.models import MAE
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from torch import Tensor

from mmae_plugin.matrix_info.pooling import (POOLINGS, check_pooling_name,
                                             pool_token_sequence)
from mmae_plugin.utils.validation import (check_bool, check_config,
                                          check_init_cfg, check_real)
from ..losses import FeatureRegularizer

#: The regularised feature: one of the plugin's token poolings.
FEATURES = POOLINGS
#: Logged every step with a regulariser: its ``skip_code``, 0 when applied
#: (no ``'loss'`` in the name, so mmengine logs it without adding it);
#: ``RegularizerSkipHook`` reports it.
SKIP_KEY = 'reg_skipped'


@MODELS.register_module()
class MMAE(MAE):
    """MAE whose loss adds a regulariser of the encoder representations.

    ``regularizer=dict(type='TCRLoss')`` gives M-MAE, ``UniformityLoss`` U-MAE,
    ``None`` mmpretrain's ``MAE`` loss (same value and gradients). It logs
    ``loss_rec``, the regulariser's ``loss_name`` and ``reg_skipped`` (for
    ``RegularizerSkipHook``). ``backbone.mask_ratio`` must mask at least one
    patch and leave one visible. Use (more: docs/usage.md#components)::

        model = dict(type='MMAE', backbone=..., neck=..., head=...,
                     regularizer=dict(type='TCRLoss', loss_weight=0.01))

    Args:
        backbone: Config of the encoder (``MAEViT``).
        neck: Config of the decoder (``MAEPretrainDecoder``).
        head: Config of the reconstruction head (``MAEPretrainHead``).
        regularizer: Config of a :class:`FeatureRegularizer` (``TCRLoss``,
            ``UniformityLoss``), or ``None``.
        feature: Which representation is regularised, a pooling of the
            masked encoder pass's tokens after the encoder's final norm
            (:mod:`mmae_plugin.matrix_info.pooling`): ``'cls'`` (the CLS
            token, as the reference code), ``'mean'`` (the mean of the visible
            patch tokens; formerly ``'mean_visible'``) or ``'cls+mean'``.
        final_norm_twice: Apply the encoder's final LayerNorm a second time to
            the pooled feature, as the published M-MAE / U-MAE code does.
            Every shipped config keeps the default ``False`` (normed once).
        init_cfg: mmengine initialisation config.
        **kwargs: Other arguments of :class:`mmpretrain.models.MAE`.
    """

    def __init__(self,
                 backbone: dict,
                 neck: dict,
                 head: dict,
                 regularizer: Optional[dict] = None,
                 feature: str = 'cls',
                 final_norm_twice: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 **kwargs) -> None:
        for name, cfg in (('backbone', backbone), ('neck', neck), ('head',
                                                                   head)):
            check_config(cfg, name)
        check_config(regularizer, 'regularizer', optional=True)
        check_pooling_name(feature, 'feature')
        check_bool(final_norm_twice, 'final_norm_twice')
        super().__init__(
            backbone=backbone,
            neck=neck,
            head=head,
            init_cfg=check_init_cfg(init_cfg),
            **kwargs)
        self.feature = feature
        self.final_norm_twice = final_norm_twice
        check_real(self.backbone.mask_ratio, 'backbone.mask_ratio')
        self._check_feature_is_defined()
        self._check_mask_ratio()
        self.regularizer = self._build_regularizer(regularizer)

    def _check_feature_is_defined(self) -> None:
        """Refuse settings whose pooled feature cannot be computed."""
        if self.feature != 'cls':
            mask_ratio = self.backbone.mask_ratio
            num_patches = self.backbone.num_patches
            # MAEViT.random_masking keeps int(L * (1 - mask_ratio)) patches.
            if int(num_patches * (1 - mask_ratio)) < 1:
                raise ValueError(
                    f'feature={self.feature!r} needs at least one visible '
                    f'patch, but backbone.mask_ratio={mask_ratio!r} leaves '
                    'none of '
                    f"the {num_patches} patches visible; use feature='cls' "
                    'or a smaller mask_ratio')
        if self.final_norm_twice and not getattr(self.backbone, 'final_norm',
                                                 False):
            raise ValueError(
                'final_norm_twice=True needs an encoder with a final norm, '
                'but backbone.final_norm is False')
        if self.final_norm_twice and self.feature == 'cls+mean':
            raise ValueError(
                "final_norm_twice=True applies the encoder's C-wide norm to "
                "the feature, but feature='cls+mean' is 2C wide; use "
                "feature='cls' or 'mean'")

    def _check_mask_ratio(self) -> None:
        """Refuse a ``backbone.mask_ratio`` that masks no patch or all.

        ``MAEViT.random_masking`` keeps ``int(L * (1 - mask_ratio))`` of the
        ``L`` patches: with none masked the reconstruction loss (a mean over
        the masked patches) is 0 / 0; with none kept the encoder sees no
        image; a negative ratio asks for more patches than there are.
        """
        ratio = self.backbone.mask_ratio
        num_patches = self.backbone.num_patches
        kept = int(num_patches * (1 - ratio))
        if not (0 < ratio < 1 and 1 <= kept < num_patches):
            raise ValueError(
                f'backbone.mask_ratio must be a number in (0, 1) that masks '
                f'at least one of the {num_patches} patches and leaves at '
                f'least one visible (MAEViT keeps int({num_patches} * (1 - '
                f'mask_ratio)) of them), got {ratio!r}')

    @staticmethod
    def _build_regularizer(
            cfg: Optional[dict]) -> Optional[FeatureRegularizer]:
        if cfg is None:
            return None
        regularizer = MODELS.build(cfg)
        if not isinstance(regularizer, FeatureRegularizer):
            raise TypeError(
                'regularizer must be the config of a FeatureRegularizer '
                f'(TCRLoss, UniformityLoss...), got type={cfg["type"]!r} '
                f'({type(regularizer).__name__})')
        return regularizer

    def pool(self, latent: Tensor) -> Tensor:
        """Representation (B, C) of the masked encoder output (B, 1 + L, C)."""
        pooled = pool_token_sequence(
            latent, self.feature, getattr(self.backbone, 'num_extra_tokens',
                                          1))
        if self.final_norm_twice:
            pooled = self.backbone.norm1(pooled)
        return pooled

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
            losses[SKIP_KEY] = self.regularizer.skip_code
        return losses
