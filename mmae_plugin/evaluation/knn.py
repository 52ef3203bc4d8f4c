"""Weighted k-nearest-neighbour classification of frozen features (pure torch).

The protocol of InstDisc (Wu et al., 2018) and DINO (Caron et al., 2021):
cosine similarity to every training feature, the ``k`` most similar
neighbours vote for their class with weight ``exp(similarity / T)``.

Precision: similarities, votes and scores are float64 (:data:`KNN_DTYPE`)
with autocast off, whatever the features' dtype. On near-collinear features
(an MAE CLS token's cosines crowd near 1) float32 rounding decides which
neighbours tie at the k-th place: the shipped M-MAE encoder's kNN accuracy
was 76.52 with float32 similarities and is 76.65 in float64. Autocast must
be off too: under ``tools/test.py --amp`` the matrix product would otherwise
run in half precision whatever the inputs' dtype (``.float()`` alone is
undone by autocast), and in bfloat16 the top-20 neighbour sets changed for
about a quarter of the queries.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from mmae_plugin.utils.validation import check_int, check_real

#: Neighbour bank rows and queries compared at once: memory is bounded by
#: a (QUERY_CHUNK, BANK_CHUNK) float64 block (512 MiB).
BANK_CHUNK = 65536
QUERY_CHUNK = 1024
#: The dtype of every similarity, vote and score.
KNN_DTYPE = torch.float64


def check_knn_args(k: int, temperature: float, num_classes: int) -> None:
    """Raise naming the first invalid kNN argument.

    ``k`` and ``num_classes`` must be integers >= 1, ``temperature`` a
    finite real number > 0: a ``TypeError`` for a value of the wrong type
    (a bool, a float ``k``), a ``ValueError`` for one out of range.
    """
    check_int(k, 'k', minimum=1)
    check_real(temperature, 'temperature', minimum=0, strict=True)
    check_int(num_classes, 'num_classes', minimum=1)


def full_precision_region(device: torch.device
                          ) -> contextlib.AbstractContextManager:
    """A context with autocast off for ``device``'s type (if it has one).

    Args:
        device: The device the computation runs on.

    Returns:
        ``torch.autocast(device.type, enabled=False)``, or a no-op context
        for device types without autocast.
    """
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def top_k_neighbours(query: Tensor, bank: Tensor,
                     k: int) -> tuple:
    """Cosine similarities and indices of each query's ``k`` nearest rows.

    Args:
        query: Features (B, d).
        bank: Features (N, d) to search.
        k: Neighbours kept; ``min(k, N)`` are returned.

    Returns:
        ``(similarity, index)``, both (B, min(k, N)), most similar first;
        similarities in :data:`KNN_DTYPE` (float64), computed with autocast
        off.
    """
    with full_precision_region(query.device):
        parts = [_top_k_neighbours_full_precision(
            query[start:start + QUERY_CHUNK], bank, k)
            for start in range(0, query.shape[0], QUERY_CHUNK)]
    return (torch.cat([sim for sim, _ in parts]),
            torch.cat([idx for _, idx in parts]))


def _top_k_neighbours_full_precision(query: Tensor, bank: Tensor,
                                     k: int) -> tuple:
    query = F.normalize(query.to(KNN_DTYPE), dim=1)
    bank = F.normalize(bank.to(KNN_DTYPE), dim=1)
    k = min(k, bank.shape[0])
    best_sim, best_idx = None, None
    for start in range(0, bank.shape[0], BANK_CHUNK):
        sim = query @ bank[start:start + BANK_CHUNK].T
        sim, idx = sim.topk(min(k, sim.shape[1]), dim=1)
        idx = idx + start
        if best_sim is not None:
            sim = torch.cat([best_sim, sim], dim=1)
            idx = torch.cat([best_idx, idx], dim=1)
            sim, order = sim.topk(k, dim=1)
            idx = idx.gather(1, order)
        best_sim, best_idx = sim, idx
    return best_sim, best_idx


def knn_class_scores(query: Tensor, bank: Tensor, bank_labels: Tensor,
                     num_classes: int, k: int = 20,
                     temperature: float = 0.07) -> Tensor:
    """Class scores of temperature-weighted kNN voting.

    Args:
        query: Features (B, d) to classify.
        bank: Training features (N, d).
        bank_labels: Integer labels (N,) of ``bank``, in ``[0, num_classes)``.
        num_classes: Number of classes.
        k: Number of neighbours that vote.
        temperature: T of the vote weight ``exp(cos / T)``.

    Returns:
        (B, num_classes) float64 scores that sum to 1 per row; the argmax
        is the predicted class.
    """
    check_knn_args(k, temperature, num_classes)
    if bank.shape[0] != bank_labels.shape[0]:
        raise ValueError(
            f'bank has {bank.shape[0]} rows but bank_labels has '
            f'{bank_labels.shape[0]}')
    with full_precision_region(query.device):
        sim, idx = top_k_neighbours(query, bank, k)
        # Subtracting each row's maximum leaves the normalised votes
        # unchanged and keeps exp() finite at small temperatures.
        weights = torch.exp((sim - sim[:, :1]) / temperature)
        labels = bank_labels.to(query.device)[idx]
        votes = torch.zeros(query.shape[0], num_classes, dtype=KNN_DTYPE,
                            device=query.device)
        votes.scatter_add_(1, labels, weights)
        return votes / votes.sum(dim=1, keepdim=True)
