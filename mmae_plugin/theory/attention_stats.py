"""Statistics of attention maps: locality, collapse and entropy.

Functions take attention probabilities ``attn`` (..., N_q, N_k), last axis
summing to 1, and reduce the last two axes:

* mean attention distance ``1/N_q sum_q sum_k a_qk dist(q, k)`` in pixels
  between patch centres (Dosovitskiy et al. 2021; Park et al. 2023);
* query-key NMI ``I(Q; K) / sqrt(H(Q) H(K))`` of ``p(q, k) = a_qk / N_q``
  (Park et al., ICLR 2023): 1 for identity attention, 0 for collapse;
* attention entropy: mean over queries of ``-sum_k a_qk log a_qk`` (nats).
"""
from typing import Sequence, Union

import torch

_EPS = 1e-12


def _check_attention(attn: torch.Tensor) -> None:
    if attn.dim() < 2:
        raise ValueError(f'attn.shape={tuple(attn.shape)} is invalid: '
                         'expected (..., N_q, N_k).')


def patch_grid_distances(
        grid_hw: Sequence[int],
        patch_size: Union[float, Sequence[float]] = 1.0) -> torch.Tensor:
    """Pixel distances between the centres of patches on a grid.

    Args:
        grid_hw (Sequence[int]): Grid height and width in patches.
        patch_size (float | Sequence[float]): Patch stride in pixels, one
            value or ``(height, width)``.

    Returns:
        torch.Tensor: ``(H*W, H*W)`` float64 distances, patches in raster
        (row-major) order as ViT patch embeddings flatten them.
    """
    height, width = (int(v) for v in grid_hw)
    if height < 1 or width < 1:
        raise ValueError(f'grid_hw={tuple(grid_hw)} is invalid: expected two '
                         'positive integers.')
    if isinstance(patch_size, (int, float)):
        patch_size = (float(patch_size), float(patch_size))
    step_h, step_w = (float(v) for v in patch_size)
    rows, cols = torch.meshgrid(
        torch.arange(height, dtype=torch.float64) * step_h,
        torch.arange(width, dtype=torch.float64) * step_w,
        indexing='ij')
    centres = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1)
    return torch.cdist(centres, centres)


def mean_attention_distance(attn: torch.Tensor,
                            distances: torch.Tensor) -> torch.Tensor:
    """Attention-weighted distance, averaged over queries.

    Args:
        attn (torch.Tensor): ``(..., N, N)`` attention over patch tokens.
        distances (torch.Tensor): ``(N, N)`` pairwise distances.

    Returns:
        torch.Tensor: ``(...)`` float64 mean distances.
    """
    _check_attention(attn)
    if distances.shape != attn.shape[-2:]:
        raise ValueError(
            f'distances.shape={tuple(distances.shape)} is invalid: expected '
            f'{tuple(attn.shape[-2:])} to match attn.')
    weighted = attn.double() * distances.to(attn.device, torch.float64)
    return weighted.sum(-1).mean(-1)


def attention_entropy(attn: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the attention distributions of the queries.

    Args:
        attn (torch.Tensor): ``(..., N_q, N_k)`` attention probabilities.

    Returns:
        torch.Tensor: ``(...)`` float64 entropies in nats.
    """
    _check_attention(attn)
    attn = attn.double()
    return -torch.special.xlogy(attn, attn).sum(-1).mean(-1)


def query_key_normalized_mutual_information(
        attn: torch.Tensor) -> torch.Tensor:
    """Normalised mutual information between queries and keys.

    Args:
        attn (torch.Tensor): ``(..., N_q, N_k)`` attention probabilities.

    Returns:
        torch.Tensor: ``(...)`` float64 NMI in [0, 1]; 0 where ``H(K)`` or
        ``H(Q)`` is 0 (then the mutual information is 0 as well).
    """
    _check_attention(attn)
    attn = attn.double()
    num_queries = attn.shape[-2]
    key_marginal = attn.mean(-2)
    key_entropy = -torch.special.xlogy(key_marginal, key_marginal).sum(-1)
    conditional_entropy = attention_entropy(attn)
    mutual_information = (key_entropy - conditional_entropy).clamp_min(0.0)
    query_entropy = torch.log(
        torch.tensor(float(num_queries), dtype=torch.float64))
    normaliser = torch.sqrt(query_entropy * key_entropy)
    return torch.where(normaliser > _EPS,
                       mutual_information / normaliser.clamp_min(_EPS),
                       torch.zeros_like(mutual_information))
