"""MAE and contrastive (InfoNCE) objectives for the one-layer ViT.

* MAE: ``L = 1/B sum_b 1/|M_b| sum_{p in M_b} ||y_bp - x_bp||^2`` over the
  masked patches ``M_b``.
* CL: two views per sample, representation ``f`` the mean of the output
  tokens (``pooling``: all, masked or visible queries), ``s_ij =
  sim(f_i^(1), f_j^(2)) / tau`` with ``sim`` the dot product (default) or
  cosine, ``L = -1/B sum_i log softmax_j(s_ij)[i]``.

See docs/theory.md#objectives-and-training-objectivespy-trainingpy.
"""
import torch
import torch.nn.functional as F

from ..utils.validation import check_choice, check_real
from .model import OneLayerAttention

POOLINGS = ('all', 'masked', 'visible')
SIMILARITIES = ('dot', 'cosine')


def random_visible_mask(batch_size: int, num_patches: int, mask_ratio: float,
                        generator: torch.Generator) -> torch.Tensor:
    """Uniformly random masks with a fixed number of masked patches.

    Args:
        batch_size (int): Number of masks.
        num_patches (int): Patches per sample.
        mask_ratio (float): Fraction of masked patches, in [0, 1); the count
            ``round(P * ratio)`` is clipped so at least one patch stays
            visible.
        generator (torch.Generator): Source of randomness.

    Returns:
        torch.Tensor: ``(batch_size, num_patches)`` bool, True = visible.
    """
    if not 0.0 <= mask_ratio < 1.0:
        raise ValueError(f'mask_ratio={mask_ratio!r} is invalid: expected a '
                         'float in [0, 1).')
    num_masked = min(round(num_patches * mask_ratio), num_patches - 1)
    ranks = torch.rand(
        batch_size, num_patches,
        generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks >= num_masked


def mae_loss(model: OneLayerAttention, patches: torch.Tensor,
             visible: torch.Tensor) -> torch.Tensor:
    """Mean squared reconstruction error of the masked patches.

    Args:
        model (OneLayerAttention): The attention model.
        patches (torch.Tensor): ``(B, P, d)`` clean patches (the targets).
        visible (torch.Tensor): ``(B, P)`` bool visibility mask; every sample
            needs a masked patch.

    Returns:
        torch.Tensor: Scalar loss (see module docstring).
    """
    masked = ~visible
    if not bool(masked.any(dim=1).all()):
        raise ValueError('visible is invalid for MAE: every sample needs at '
                         'least one masked patch.')
    outputs, _ = model(patches, visible)
    per_patch = (outputs - patches).pow(2).sum(dim=-1)
    weights = masked.to(per_patch.dtype)
    per_sample = (per_patch * weights).sum(1) / weights.sum(1)
    return per_sample.mean()


def view_representation(model: OneLayerAttention,
                        patches: torch.Tensor,
                        visible: torch.Tensor,
                        pooling: str = 'all') -> torch.Tensor:
    """Average-pooled output tokens of one masked view.

    Args:
        model (OneLayerAttention): The attention model.
        patches (torch.Tensor): ``(B, P, d)`` patches.
        visible (torch.Tensor): ``(B, P)`` bool visibility mask of the view.
        pooling (str): Which queries' outputs are averaged: ``'all'`` (the
            ``P`` outputs), ``'masked'`` or ``'visible'`` queries only.

    Returns:
        torch.Tensor: ``(B, d)`` representations.
    """
    check_choice(pooling, 'pooling', POOLINGS)
    outputs, _ = model(patches, visible)
    if pooling == 'all':
        return outputs.mean(dim=1)
    selected = ~visible if pooling == 'masked' else visible
    if not bool(selected.any(dim=1).all()):
        raise ValueError(f'pooling={pooling!r} is invalid for this view: '
                         f'every sample needs at least one {pooling} query.')
    weights = selected.to(outputs.dtype).unsqueeze(-1)
    return (outputs * weights).sum(dim=1) / weights.sum(dim=1)


def infonce_loss(model: OneLayerAttention,
                 patches: torch.Tensor,
                 visible_1: torch.Tensor,
                 visible_2: torch.Tensor,
                 temperature: float,
                 similarity: str = 'dot',
                 pooling: str = 'all') -> torch.Tensor:
    """InfoNCE between two masked views; other samples are the negatives.

    Args:
        model (OneLayerAttention): The attention model.
        patches (torch.Tensor): ``(B, P, d)`` patches, ``B >= 2``.
        visible_1 (torch.Tensor): ``(B, P)`` visibility mask of view 1.
        visible_2 (torch.Tensor): ``(B, P)`` visibility mask of view 2.
        temperature (float): Softmax temperature ``tau > 0``.
        similarity (str): ``'dot'`` (``<f, g>``) or ``'cosine'``
            (``<f, g> / (||f|| ||g||)``).
        pooling (str): See :func:`view_representation`.

    Returns:
        torch.Tensor: Scalar loss (see module docstring).
    """
    check_real(temperature, 'temperature', minimum=0, strict=True)
    check_choice(similarity, 'similarity', SIMILARITIES)
    if patches.shape[0] < 2:
        raise ValueError(f'batch size {patches.shape[0]} is invalid for '
                         'InfoNCE: expected >= 2 (negatives are the other '
                         'samples).')
    f1 = view_representation(model, patches, visible_1, pooling)
    f2 = view_representation(model, patches, visible_2, pooling)
    if similarity == 'cosine':
        f1, f2 = F.normalize(f1, dim=1), F.normalize(f2, dim=1)
    logits = f1 @ f2.T / temperature
    targets = torch.arange(patches.shape[0], device=patches.device)
    return F.cross_entropy(logits, targets)
