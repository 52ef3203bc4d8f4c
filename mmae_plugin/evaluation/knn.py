"""Weighted k-nearest-neighbour classification of frozen features (pure torch).

The protocol of InstDisc (Wu et al., 2018) and DINO (Caron et al., 2021):
cosine similarity to every training feature, the ``k`` most similar
neighbours vote for their class with weight ``exp(similarity / T)``.

Neighbours, similarities, votes and scores are float64's
(:data:`KNN_DTYPE`) with autocast off. :class:`NeighbourBank` searches the
bank in float32 for ``2 k + 16`` candidates per query, re-ranks them in
float64 and searches again in float64 only the queries whose neighbours the
float32 bound (:func:`search_error_bound`) cannot prove; equal similarities
are ordered by bank index. Memory beyond the bank is about 0.3 GiB at any
bank size. Why float64, the bound and measured memory:
docs/evaluation.md#knn-memory-and-precision.
"""
import contextlib
import math
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from mmae_plugin.utils.validation import check_int, check_real

#: Query rows and bank rows compared at once in the float32 search: a
#: (QUERY_CHUNK, BANK_CHUNK) float32 block (256 MiB).
BANK_CHUNK = 65536
QUERY_CHUNK = 1024
#: Bank rows converted to float64 at once (norms, exact search).
EXACT_BANK_CHUNK = 16384
#: Candidate rows gathered and re-ranked in float64 at once.
RERANK_ROWS = 16384
#: The dtype of every returned similarity, vote and score.
KNN_DTYPE = torch.float64
#: The dtype of the search for candidates.
SEARCH_DTYPE = torch.float32
#: Norm below which a row counts as zero (``F.normalize``'s ``eps``).
NORM_EPS = 1e-12
#: Row norms within which the float32 products of raw bank rows neither
#: overflow nor lose more than 1e-24 to underflow (in cosine units); a
#: bank with a non-zero row outside is searched in float64 throughout.
SEARCH_NORM_RANGE = (1e-18, 1e18)


def check_knn_args(k: int, temperature: float, num_classes: int) -> None:
    """Raise naming the first invalid kNN argument.

    ``k`` and ``num_classes`` must be integers >= 1, ``temperature`` a
    finite real number > 0: a ``TypeError`` for a value of the wrong type
    (a bool, a float ``k``), a ``ValueError`` for one out of range.
    """
    check_int(k, 'k', minimum=1)
    check_real(temperature, 'temperature', minimum=0, strict=True)
    check_int(num_classes, 'num_classes', minimum=1)


def full_precision_region(
        device: torch.device) -> contextlib.AbstractContextManager:
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


@contextlib.contextmanager
def ieee_float32_matmul(device: torch.device) -> Iterator[None]:
    """Run float32 matrix products in IEEE float32 (no TF32 or bfloat16).

    :func:`search_error_bound` holds for IEEE float32 products only; a
    process that allowed TF32 (``torch.backends.cuda.matmul``) or bfloat16
    (``torch.backends.mkldnn.matmul``) gets it back on leaving.

    Args:
        device: The device the products run on.
    """
    backend = (
        torch.backends.cuda.matmul if device.type == 'cuda' else getattr(
            torch.backends.mkldnn, 'matmul', None))
    if hasattr(backend, 'fp32_precision'):  # torch >= 2.9
        previous = backend.fp32_precision
        backend.fp32_precision = 'ieee'
        try:
            yield
        finally:
            backend.fp32_precision = previous
        return
    # Older torch: only the process-wide setting (the two APIs may not be
    # mixed, so the new one is used wherever it exists).
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision('highest')
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def search_error_bound(dim: int) -> float:
    """Bound on the difference of a float32 and a float64 cosine.

    A dot product of ``d`` terms is within ``gamma_d |q| |b|`` of the exact
    one in any summation order (Higham, Accuracy and Stability of Numerical
    Algorithms, eq. 3.5), ``gamma_d ~ d u``; the normalisations and the
    float32 rounding of the inputs add about ``(d + 4) u`` more. Four
    times ``(d + 4) (u_32 + u_64)`` covers both computations with room.

    Args:
        dim: Feature dimension d.

    Returns:
        The bound (1.8e-4 at d = 768).
    """
    unit_roundoff = (torch.finfo(torch.float32).eps +
                     torch.finfo(torch.float64).eps) / 2
    return 4.0 * (dim + 4) * unit_roundoff


def candidate_count(k: int, num_rows: int) -> int:
    """Candidates per query the float32 search keeps for ``k`` neighbours.

    Args:
        k: Neighbours wanted.
        num_rows: Rows in the bank.

    Returns:
        ``min(2 k + 16, num_rows)``.
    """
    return min(2 * k + 16, num_rows)


class NeighbourBank:
    """A kNN bank prepared once: its rows' norms, float32 search, float64
    re-rank (see the module's docstring).

    Args:
        rows: Bank features (N, d); kept, not copied.
        labels: Integer labels (N,) of the rows, for :meth:`class_scores`.
    """

    def __init__(self, rows: Tensor, labels: Optional[Tensor] = None) -> None:
        if labels is not None and rows.shape[0] != labels.shape[0]:
            raise ValueError(
                f'bank has {rows.shape[0]} rows but bank_labels has '
                f'{labels.shape[0]}')
        self.rows = rows
        self.labels = None if labels is None else labels.to(rows.device)
        with full_precision_region(rows.device):
            norms = torch.cat([
                torch.linalg.vector_norm(
                    rows[start:start + EXACT_BANK_CHUNK].to(KNN_DTYPE), dim=1)
                for start in range(0, rows.shape[0], EXACT_BANK_CHUNK)
            ])
        #: 1 / norm of every row (0 for an all-zero row), float32.
        self.inverse_norms = norms.clamp_min(NORM_EPS).reciprocal().to(
            SEARCH_DTYPE)
        self.error_bound = search_error_bound(rows.shape[1])
        low, high = SEARCH_NORM_RANGE
        if bool(((norms > 0) & ((norms < low) | (norms > high))).any()):
            # Evaluation, not a training step: one host read per bank.
            self.error_bound = math.inf  # every query searched in float64
        #: Queries searched again in float64 over the whole bank so far.
        self.exact_queries = 0

    def top_k(self, query: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        """Cosine similarities and indices of each query's ``k`` nearest rows.

        Args:
            query: Features (B, d).
            k: Neighbours kept; ``min(k, N)`` are returned.

        Returns:
            ``(similarity, index)``, both (B, min(k, N)), most similar first
            (equal similarities by index); similarities in
            :data:`KNN_DTYPE`, equal to a float64 search's.
        """
        k = min(k, self.rows.shape[0])
        with full_precision_region(query.device), \
                ieee_float32_matmul(query.device):
            parts = [
                self._top_k_of_chunk(query[start:start + QUERY_CHUNK], k)
                for start in range(0, query.shape[0], QUERY_CHUNK)
            ]
        return (torch.cat([sim for sim, _ in parts]),
                torch.cat([idx for _, idx in parts]))

    def class_scores(self,
                     query: Tensor,
                     num_classes: int,
                     k: int = 20,
                     temperature: float = 0.07) -> Tensor:
        """Class scores of temperature-weighted kNN voting.

        Args:
            query: Features (B, d) to classify.
            num_classes: Number of classes.
            k: Number of neighbours that vote.
            temperature: T of the vote weight ``exp(cos / T)``.

        Returns:
            (B, num_classes) float64 scores that sum to 1 per row; the
            argmax is the predicted class.
        """
        check_knn_args(k, temperature, num_classes)
        if self.labels is None:
            raise ValueError('class_scores needs a bank built with labels')
        sim, idx = self.top_k(query, k)
        with full_precision_region(query.device):
            # Subtracting each row's maximum leaves the normalised votes
            # unchanged and keeps exp() finite at small temperatures.
            weights = torch.exp((sim - sim[:, :1]) / temperature)
            votes = torch.zeros(
                query.shape[0],
                num_classes,
                dtype=KNN_DTYPE,
                device=query.device)
            votes.scatter_add_(1, self.labels.to(query.device)[idx], weights)
            return votes / votes.sum(dim=1, keepdim=True)

    def _top_k_of_chunk(self, query: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        """:meth:`top_k` of at most :data:`QUERY_CHUNK` queries."""
        count = candidate_count(k, self.rows.shape[0])
        search_sim, idx = self._search(query, count)
        sim, idx = self._rerank(query, idx)
        sim, idx = sim[:, :k], idx[:, :k]
        if count == self.rows.shape[0]:
            return sim, idx
        # Every row left out has a float32 cosine of at most the last
        # candidate's, so a float64 one of at most that plus the bound.
        certain = sim[:, -1] > search_sim[:, -1] + self.error_bound
        # Evaluation, not a training step: this host read is affordable.
        redo = (~certain).nonzero().flatten()
        if redo.numel():
            self.exact_queries += redo.numel()
            sim[redo], idx[redo] = self._exact_top_k(query[redo], k)
        return sim, idx

    def _search(self, query: Tensor, count: int) -> Tuple[Tensor, Tensor]:
        """float32 cosines and indices of ``count`` candidates per query."""
        # Normalised in float64: a float32 norm of tiny or huge queries
        # would under- or overflow.
        query = F.normalize(query.to(KNN_DTYPE), dim=1).to(SEARCH_DTYPE)
        # One block for every chunk of the bank: two alive at once would
        # double the search's memory.
        block = query.new_empty(query.shape[0] *
                                min(BANK_CHUNK, self.rows.shape[0]))
        best_sim, best_idx = None, None
        for start in range(0, self.rows.shape[0], BANK_CHUNK):
            rows = self.rows[start:start + BANK_CHUNK].to(SEARCH_DTYPE)
            sim = block[:query.shape[0] * rows.shape[0]].view(
                query.shape[0], rows.shape[0])
            torch.matmul(query, rows.T, out=sim)
            sim.mul_(self.inverse_norms[start:start + BANK_CHUNK])
            best_sim, best_idx = _merge_top(best_sim, best_idx, sim, start,
                                            count)
        return best_sim, best_idx

    def _rerank(self, query: Tensor, idx: Tensor) -> Tuple[Tensor, Tensor]:
        """float64 cosines of the candidates ``idx``, best first, equal
        ones by index."""
        query = F.normalize(query.to(KNN_DTYPE), dim=1)
        step = max(1, RERANK_ROWS // idx.shape[1])
        sims = []
        for start in range(0, query.shape[0], step):
            block = idx[start:start + step]
            rows = F.normalize(self.rows[block].to(KNN_DTYPE), dim=2)
            sims.append(
                (rows @ query[start:start + step].unsqueeze(2)).squeeze(2))
            del rows  # before the next block's rows are gathered
        return _sort_by_similarity_then_index(torch.cat(sims), idx)

    def _exact_top_k(self, query: Tensor, k: int) -> Tuple[Tensor, Tensor]:
        """The float64 search over the whole bank, for queries whose
        candidates could miss a neighbour."""
        query = F.normalize(query.to(KNN_DTYPE), dim=1)
        best_sim, best_idx = None, None
        for start in range(0, self.rows.shape[0], EXACT_BANK_CHUNK):
            rows = F.normalize(
                self.rows[start:start + EXACT_BANK_CHUNK].to(KNN_DTYPE), dim=1)
            best_sim, best_idx = _merge_top(best_sim, best_idx, query @ rows.T,
                                            start, k)
            del rows  # before the next chunk is converted
        return _sort_by_similarity_then_index(best_sim, best_idx)


def _merge_top(best_sim: Optional[Tensor], best_idx: Optional[Tensor],
               sim: Tensor, offset: int, count: int) -> Tuple[Tensor, Tensor]:
    """The ``count`` largest of the kept ones and a new block's."""
    sim, idx = sim.topk(min(count, sim.shape[1]), dim=1)
    idx = idx + offset
    if best_sim is None:
        return sim, idx
    sim = torch.cat([best_sim, sim], dim=1)
    idx = torch.cat([best_idx, idx], dim=1)
    sim, order = sim.topk(min(count, sim.shape[1]), dim=1)
    return sim, idx.gather(1, order)


def _sort_by_similarity_then_index(sim: Tensor,
                                   idx: Tensor) -> Tuple[Tensor, Tensor]:
    """Rows sorted by decreasing similarity, equal ones by index."""
    idx, by_index = idx.sort(dim=1)
    sim, order = sim.gather(1, by_index).sort(
        dim=1, descending=True, stable=True)
    return sim, idx.gather(1, order)


def top_k_neighbours(query: Tensor, bank: Tensor, k: int) -> tuple:
    """Cosine similarities and indices of each query's ``k`` nearest rows.

    Prepares the bank for this call; to query one bank many times, build a
    :class:`NeighbourBank` once.

    Args:
        query: Features (B, d).
        bank: Features (N, d) to search.
        k: Neighbours kept; ``min(k, N)`` are returned.

    Returns:
        ``(similarity, index)``, both (B, min(k, N)), most similar first;
        similarities in :data:`KNN_DTYPE` (float64), computed with autocast
        off.
    """
    return NeighbourBank(bank).top_k(query, k)


def knn_class_scores(query: Tensor,
                     bank: Tensor,
                     bank_labels: Tensor,
                     num_classes: int,
                     k: int = 20,
                     temperature: float = 0.07) -> Tensor:
    """Class scores of temperature-weighted kNN voting.

    Prepares the bank for this call; to query one bank many times, build a
    :class:`NeighbourBank` once and call its :meth:`~NeighbourBank.
    class_scores`.

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
    return NeighbourBank(bank,
                         bank_labels).class_scores(query, num_classes, k,
                                                   temperature)
