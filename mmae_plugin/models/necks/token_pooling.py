"""Pooling of a ViT's output tokens into one feature per image."""
from typing import Sequence, Tuple

from mmengine.model import BaseModule
from mmpretrain.registry import MODELS
from torch import Tensor

# The one pooling vocabulary and definition (see mmae_plugin.matrix_info.
# pooling): 'cls', 'mean' (of the patch tokens), 'cls+mean'.
from mmae_plugin.matrix_info.pooling import (POOLINGS, check_pooling_name,
                                             pool_token_sequence)

#: The poolings each ``VisionTransformer.out_type`` can serve: a CLS feature
#: (B, C) is already pooled, a feature map (B, C, H, W) has no CLS token.
POOLINGS_OF_OUT_TYPE = {
    'cls_token': ('cls', ),
    'featmap': ('mean', ),
    'avg_featmap': (),
    'raw': POOLINGS,
}


def check_pooling(pooling: str, out_type: str = 'raw') -> None:
    """Raise ``ValueError`` unless ``pooling`` works on ``out_type`` output.

    Args:
        pooling: One of :data:`POOLINGS`.
        out_type: The backbone's ``out_type`` (``VisionTransformer``).
    """
    check_pooling_name(pooling)
    allowed = POOLINGS_OF_OUT_TYPE.get(out_type, POOLINGS)
    if pooling not in allowed:
        raise ValueError(
            f'pooling={pooling!r} needs the backbone\'s tokens, but its '
            f'out_type={out_type!r} gives only {allowed or "its own pooling"};'
            " set the backbone's out_type='raw'")


def pool_tokens(feats: Tensor,
                pooling: str,
                num_extra_tokens: int = 1) -> Tensor:
    """One (B, C) or (B, 2C) feature per image from a ViT's output.

    Args:
        feats: ``(B, T, C)`` tokens (``out_type='raw'``), the first
            ``num_extra_tokens`` of which are the CLS (and other extra)
            tokens; or an already reduced output: ``(B, C)`` CLS feature
            (``'cls_token'``) or ``(B, C, H, W)`` patch map (``'featmap'``).
        pooling: One of :data:`POOLINGS`.
        num_extra_tokens: Leading non-patch tokens of ``(B, T, C)`` input.

    Returns:
        The pooled features.
    """
    out_type = {2: 'cls_token', 3: 'raw', 4: 'featmap'}.get(feats.dim())
    if out_type is None:
        raise ValueError('expected (B, C), (B, T, C) or (B, C, H, W) '
                         f'features, got shape {tuple(feats.shape)}')
    check_pooling(pooling, out_type)
    if out_type == 'cls_token':
        return feats
    if out_type == 'featmap':
        return feats.mean(dim=(2, 3))
    return pool_token_sequence(feats, pooling, num_extra_tokens)


@MODELS.register_module()
class TokenPoolingNeck(BaseModule):
    """Pools a ViT's raw tokens (``out_type='raw'``) for a classifier head.

    Put it before mmpretrain's ``ClsBatchNormNeck`` (a list of neck configs
    builds a ``Sequential``) to linear-probe ``'cls+mean'`` features::

        backbone=dict(type='VisionTransformer', out_type='raw', ...),
        neck=[dict(type='TokenPoolingNeck', pooling='cls+mean'),
              dict(type='ClsBatchNormNeck', input_features=2 * C)],
        head=dict(type='VisionTransformerClsHead', in_channels=2 * C, ...)

    Args:
        pooling: One of :data:`POOLINGS`.
        num_extra_tokens: Leading non-patch tokens (1: the CLS token).
        init_cfg: Initialisation config (the neck has no parameters).
    """

    def __init__(self,
                 pooling: str = 'cls+mean',
                 num_extra_tokens: int = 1,
                 init_cfg=None) -> None:
        super().__init__(init_cfg)
        check_pooling(pooling)
        self.pooling = pooling
        self.num_extra_tokens = num_extra_tokens

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        """Pool every output stage of the backbone.

        Args:
            inputs: The backbone's outputs, one (B, T, C) tensor per stage.

        Returns:
            The pooled features, one per stage.
        """
        return tuple(
            pool_tokens(x, self.pooling, self.num_extra_tokens)
            for x in inputs)
