"""Quantities tracked while training the one-layer ViT.

* Area attention mass ``[k, j]``: the attention mass masked queries of area
  ``k`` put on visible patches of area ``j`` (rows sum to 1); its diagonal
  is the own-area attention (the paper's attention correlation).
* Reconstruction error: the MAE loss on a fixed evaluation batch.
* Feature coefficient ``beta_k = sum <y_p, v_k> z_k / sum z_k^2`` of the
  masked queries' outputs in area ``k`` (1: feature fully reconstructed).
* Feature-position correlation ``[k, j]``: mean over positions ``p`` of area
  ``k`` of ``e_p^T Q [v_j; 0]``; position correlation ``[k, j]``: mean of
  ``e_p^T Q e_q`` over ``p`` in area ``k``, ``q != p`` in area ``j``.
* Own-area ceiling: ``1 - C(P - |D_k|, V) / C(P - 1, V)``, the best
  expected own-area attention with ``V`` visible patches.

Definitions and why: docs/theory.md#tracked-quantities-metricspy.
"""
from math import comb
from typing import Dict

import torch

from .model import OneLayerAttention


def area_attention_mass(attention: torch.Tensor, visible: torch.Tensor,
                        area_index: torch.Tensor,
                        num_areas: int) -> torch.Tensor:
    """Mean attention mass from masked queries of each area to each area.

    Args:
        attention (torch.Tensor): ``(B, P, P)`` attention probabilities.
        visible (torch.Tensor): ``(B, P)`` bool visibility mask.
        area_index (torch.Tensor): ``(P,)`` area id per patch.
        num_areas (int): Number of areas ``K``.

    Returns:
        torch.Tensor: ``(K, K)``; entry ``[k, j]`` is the mass that masked
        queries of area ``k`` put on visible keys of area ``j``, averaged
        over all (sample, masked query) pairs of area ``k``. Rows sum to 1
        (NaN for an area that never has a masked query).
    """
    key_area = torch.nn.functional.one_hot(area_index,
                                           num_areas).to(attention.dtype)
    # Masked keys carry zero probability already, so no extra key masking.
    mass = attention @ key_area  # (B, P, K): per query, mass on each area
    # (B, P, K): 1 where the query is masked and belongs to area k.
    query_weight = (~visible).to(attention.dtype).unsqueeze(-1) * key_area
    total = torch.einsum('bpk,bpj->kj', query_weight, mass)
    counts = query_weight.sum(dim=(0, 1)).unsqueeze(1)
    return total / counts


def own_area_attention(attention: torch.Tensor, visible: torch.Tensor,
                       area_index: torch.Tensor,
                       num_areas: int) -> torch.Tensor:
    """Own-area attention of masked queries, one value per area.

    Args:
        attention (torch.Tensor): ``(B, P, P)`` attention probabilities.
        visible (torch.Tensor): ``(B, P)`` bool visibility mask.
        area_index (torch.Tensor): ``(P,)`` area id per patch.
        num_areas (int): Number of areas ``K``.

    Returns:
        torch.Tensor: ``(K,)`` diagonal of :func:`area_attention_mass`.
    """
    return torch.diagonal(
        area_attention_mass(attention, visible, area_index, num_areas))


def own_area_attention_ceiling(area_size: int, num_patches: int,
                               num_visible: int) -> float:
    """Largest achievable expected own-area attention of a masked query.

    Args:
        area_size (int): Patches in the query's area, ``|D_k| >= 1``.
        num_patches (int): Patches per sample ``P``.
        num_visible (int): Visible patches per sample ``V < P`` (uniformly
            random subset).

    Returns:
        float: Probability that at least one other patch of the area is
        visible, given that the query is masked.
    """
    if not 1 <= area_size <= num_patches:
        raise ValueError(f'area_size={area_size!r} is invalid: expected an '
                         f'integer in [1, {num_patches}].')
    if not 1 <= num_visible < num_patches:
        raise ValueError(f'num_visible={num_visible!r} is invalid: expected '
                         f'an integer in [1, {num_patches - 1}].')
    none_visible = comb(num_patches - area_size, num_visible) / comb(
        num_patches - 1, num_visible)
    return 1.0 - none_visible


def feature_coefficients(outputs: torch.Tensor, visible: torch.Tensor,
                         weights: torch.Tensor, features: torch.Tensor,
                         area_index: torch.Tensor) -> torch.Tensor:
    """How much of its own area's feature a masked query reconstructs.

    Args:
        outputs (torch.Tensor): ``(B, P, d)`` model outputs.
        visible (torch.Tensor): ``(B, P)`` bool visibility mask.
        weights (torch.Tensor): ``(B, K)`` per-sample area weights ``z``.
        features (torch.Tensor): ``(K, d)`` orthonormal area features.
        area_index (torch.Tensor): ``(P,)`` area id per patch.

    Returns:
        torch.Tensor: ``(K,)`` coefficients ``beta_k`` (module docstring).
    """
    own_feature = features[area_index]  # (P, d)
    projection = (outputs * own_feature.unsqueeze(0)).sum(-1)  # (B, P)
    own_weight = weights[:, area_index]  # (B, P)
    masked = (~visible).to(outputs.dtype)
    num_areas = features.shape[0]
    area_onehot = torch.nn.functional.one_hot(area_index, num_areas).to(
        outputs.dtype)  # (P, K)
    numerator = ((projection * own_weight * masked) @ area_onehot).sum(0)
    denominator = ((own_weight.pow(2) * masked) @ area_onehot).sum(0)
    return numerator / denominator


def position_pair_average(matrix: torch.Tensor, area_index: torch.Tensor,
                          num_areas: int) -> torch.Tensor:
    """Mean of a ``(P, P)`` position matrix over pairs of areas, ``p != q``.

    Args:
        matrix (torch.Tensor): ``(P, P)`` entries ``[p, q]``.
        area_index (torch.Tensor): ``(P,)`` area id per patch.
        num_areas (int): Number of areas ``K``.

    Returns:
        torch.Tensor: ``(K, K)``; ``[k, j]`` is the mean of ``matrix[p, q]``
        over ``p`` in area ``k`` and ``q != p`` in area ``j`` (a masked
        query is never its own visible key, so ``p == q`` is left out).
    """
    onehot = torch.nn.functional.one_hot(area_index,
                                         num_areas).to(matrix.dtype)
    off_diagonal = 1.0 - torch.eye(matrix.shape[0], dtype=matrix.dtype)
    total = onehot.T @ (matrix * off_diagonal) @ onehot
    counts = onehot.T @ off_diagonal @ onehot
    return total / counts


def attention_correlations(
        model: OneLayerAttention, features: torch.Tensor,
        area_index: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Area means of the FP and of the position-position correlations.

    Args:
        model (OneLayerAttention): The attention model.
        features (torch.Tensor): ``(K, d)`` area features.
        area_index (torch.Tensor): ``(P,)`` area id per patch.

    Returns:
        dict[str, torch.Tensor]: ``feature_position_correlation`` and
        ``position_correlation``, each ``(K, K)`` (module docstring).
    """
    d, num_areas = model.feature_dim, features.shape[0]
    qk = model.qk.detach()
    fp = qk[d:, :d] @ features.to(qk.dtype).T  # (P, K)
    onehot = torch.nn.functional.one_hot(area_index, num_areas).to(qk.dtype)
    fp_area = onehot.T @ fp / onehot.sum(0).unsqueeze(1)
    return dict(
        feature_position_correlation=fp_area,
        position_correlation=position_pair_average(qk[d:, d:], area_index,
                                                   num_areas))


@torch.no_grad()
def evaluate(model: OneLayerAttention, patches: torch.Tensor,
             weights: torch.Tensor, visible: torch.Tensor,
             features: torch.Tensor,
             area_index: torch.Tensor) -> Dict[str, torch.Tensor]:
    """All tracked quantities on one fixed evaluation batch.

    Args:
        model (OneLayerAttention): The attention model.
        patches (torch.Tensor): ``(B, P, d)`` patches.
        weights (torch.Tensor): ``(B, K)`` per-sample area weights.
        visible (torch.Tensor): ``(B, P)`` bool visibility mask.
        features (torch.Tensor): ``(K, d)`` area features.
        area_index (torch.Tensor): ``(P,)`` area id per patch.

    Returns:
        dict[str, torch.Tensor]: ``own_area_attention`` ``(K,)``,
        ``area_attention_mass`` ``(K, K)``, ``reconstruction_error``
        (scalar), ``feature_coefficient`` ``(K,)`` and the ``(K, K)``
        correlations of :func:`attention_correlations`.
    """
    outputs, attention = model(patches, visible)
    num_areas = features.shape[0]
    mass = area_attention_mass(attention, visible, area_index, num_areas)
    masked = (~visible).to(patches.dtype)
    error = (
        (outputs - patches).pow(2).sum(-1) * masked).sum(1) / masked.sum(1)
    return dict(
        own_area_attention=torch.diagonal(mass).clone(),
        area_attention_mass=mass,
        reconstruction_error=error.mean(),
        feature_coefficient=feature_coefficients(outputs, visible, weights,
                                                 features, area_index),
        **attention_correlations(model, features, area_index))
