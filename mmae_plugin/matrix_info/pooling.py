"""One feature per image from a ViT's output tokens: the one vocabulary.

Every part of the plugin that pools tokens (``MMAE``, ``MatrixInfoHook``,
``TokenPoolingNeck``, ``KNNClassifier``) calls :func:`pool_token_sequence`
with one of :data:`POOLINGS`: ``'cls'`` (token 0, the MAE paper's
linear-probe feature), ``'mean'`` (the mean of the patch tokens after the
``num_extra_tokens`` leading ones: in MAE's masked pass the visible
patches, formerly ``'mean_visible'``) or ``'cls+mean'`` (both
concatenated, (B, 2C), DINO's ViT-B linear feature). Pure PyTorch.
"""
import torch
from torch import Tensor

from ..utils.validation import check_choice

POOLINGS = ('cls', 'mean', 'cls+mean')

#: Former names, refused with the name that replaced them.
RENAMED_POOLINGS = {'mean_visible': 'mean'}


def check_pooling_name(pooling, name: str = 'pooling') -> str:
    """Return ``pooling`` if it is one of :data:`POOLINGS`, else raise.

    Args:
        pooling: Candidate pooling.
        name: Parameter name used in the error message.

    Returns:
        ``pooling``.
    """
    if isinstance(pooling, str) and pooling in RENAMED_POOLINGS:
        raise ValueError(
            f'{name}={pooling!r} was renamed {RENAMED_POOLINGS[pooling]!r} '
            '(the mean of the patch tokens the encoder returns: the visible '
            f'ones in a masked pass); allowed: {POOLINGS}')
    return check_choice(pooling, name, POOLINGS)


def pool_token_sequence(tokens: Tensor,
                        pooling: str,
                        num_extra_tokens: int = 1) -> Tensor:
    """Pool (B, T, C) tokens into (B, C), or (B, 2C) for ``'cls+mean'``.

    Args:
        tokens: Encoder output tokens (B, T, C); the first
            ``num_extra_tokens`` are the CLS (and other non-patch) tokens.
        pooling: One of :data:`POOLINGS`.
        num_extra_tokens: Leading non-patch tokens (>= 1 for ``'cls'`` and
            ``'cls+mean'``).

    Returns:
        The pooled features, differentiable, in the tokens' dtype.
    """
    check_pooling_name(pooling)
    if not isinstance(tokens, Tensor) or tokens.dim() != 3:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else \
            type(tokens).__name__
        raise ValueError(f'tokens must be a (B, T, C) tensor, got {shape}')
    if pooling != 'mean' and num_extra_tokens < 1:
        raise ValueError(f'pooling={pooling!r} needs a CLS token, but '
                         f'num_extra_tokens={num_extra_tokens!r}')
    if pooling != 'cls' and tokens.shape[1] <= num_extra_tokens:
        raise ValueError(
            f'pooling={pooling!r} needs at least one patch token, but the '
            f'{tokens.shape[1]} token(s) are all extra tokens '
            f'(num_extra_tokens={num_extra_tokens})')
    if pooling == 'cls':
        return tokens[:, 0]
    patch_mean = tokens[:, num_extra_tokens:].mean(dim=1)
    if pooling == 'mean':
        return patch_mean
    return torch.cat([tokens[:, 0], patch_mean], dim=1)
