"""Weighted kNN with float64 similarities (pure torch).

The protocol of :mod:`mmae_plugin.evaluation.knn` (cosine similarity, the
``k`` most similar training rows vote with weight ``exp(cos / T)``), with
the similarities and votes in float64: on near-collinear features (an MAE
CLS token's cosine similarities crowd near 1) float32 rounding changes
which neighbours tie at the k-th place, and so the accuracy, by a few
hundredths of a point between otherwise equal computations.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from mmae_plugin.evaluation.knn import check_knn_args

#: Queries compared at once: bounds memory at QUERY_CHUNK x N float64.
QUERY_CHUNK = 512


@torch.no_grad()
def knn_scores_float64(query: Tensor, bank: Tensor, bank_labels: Tensor,
                       num_classes: int, k: int = 20,
                       temperature: float = 0.07) -> Tensor:
    """Class scores (B, num_classes) of temperature-weighted kNN voting.

    Args:
        query: Features (B, d) to classify.
        bank: Training features (N, d).
        bank_labels: Integer labels (N,) of ``bank``.
        num_classes: Number of classes.
        k: Neighbours that vote (``min(k, N)``).
        temperature: T of the vote weight ``exp(cos / T)``.

    Returns:
        float64 scores that sum to 1 per row.
    """
    check_knn_args(k, temperature, num_classes)
    if bank.shape[0] != bank_labels.shape[0]:
        raise ValueError(f'bank has {bank.shape[0]} rows but bank_labels '
                         f'has {bank_labels.shape[0]}')
    bank = F.normalize(bank.double(), dim=1)
    query = F.normalize(query.double(), dim=1)
    labels = bank_labels.long().to(bank.device)
    k = min(k, bank.shape[0])
    scores = []
    for start in range(0, query.shape[0], QUERY_CHUNK):
        sim, idx = (query[start:start + QUERY_CHUNK] @ bank.T).topk(k, dim=1)
        # The row maximum cancels in the normalised votes; exp stays finite.
        weights = torch.exp((sim - sim[:, :1]) / temperature)
        votes = torch.zeros(sim.shape[0], num_classes, dtype=torch.float64,
                            device=sim.device)
        votes.scatter_add_(1, labels[idx], weights)
        scores.append(votes / votes.sum(dim=1, keepdim=True))
    return torch.cat(scores)
