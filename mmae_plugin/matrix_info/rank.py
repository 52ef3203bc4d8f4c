"""Effective rank and RankMe of a matrix or a batch of representations.

Both are ``exp`` of the Shannon entropy of the l1-normalised singular
values: the effective rank of Roy & Vetterli (2007) and RankMe (Garrido et
al., ICML 2023, which adds ``eps`` to every probability). Both are 0 for
the zero matrix. On raw features (B, d) they give ``rankme_raw``; the
kernel-named effective ranks (``erank_gram``, ``erank_cov``) are in
:mod:`.representation`.
"""
from typing import Optional

import torch
from torch import Tensor

from ..utils.validation import check_non_negative
from .spectrum import shannon_entropy
from .validation import check_tensor, to_compute_dtype


def _singular_values(x: Tensor, name: str,
                     dtype: Optional[torch.dtype]) -> Tensor:
    """Singular values of a finite 2-D tensor in the compute dtype.

    Args:
        x: Matrix of any shape (m, n) and floating dtype.
        name: Parameter name used in error messages.
        dtype: Compute dtype (float64 by default).

    Returns:
        Singular values (min(m, n),), descending.
    """
    check_tensor(x, name)
    # svdvals' backward is U diag(g) V^T: finite even at repeated values.
    return torch.linalg.svdvals(to_compute_dtype(x, dtype))


def effective_rank(x: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Effective rank ``exp(-sum p log p)``, ``p = s / sum(s)``.

    ``s`` are the singular values of ``x``: for features (B, d) this is the
    effective dimension of the representation, for a PSD matrix the
    exponential of the Shannon entropy of its normalised eigenvalues. Equals
    n for ``I_n``, 1 for any rank-1 matrix, and 0 for the zero matrix.

    Args:
        x: Matrix (m, n), any floating dtype.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor in ``[1, min(m, n)]`` (0 for the zero matrix).
    """
    s = _singular_values(x, 'x', dtype)
    total = s.sum()
    if float(total.detach()) == 0:
        return total * 0
    return torch.exp(shannon_entropy(s / total))


def rankme(z: Tensor,
           eps: float = 1e-7,
           dtype: Optional[torch.dtype] = None) -> Tensor:
    """RankMe: ``exp(-sum p log p)`` with ``p = s / ||s||_1 + eps``.

    Meant for raw (un-normalised, uncentred) embeddings, ideally of many
    samples (the RankMe paper uses about 25k).

    Args:
        z: Embeddings (B, d), any floating dtype.
        eps: Non-negative constant added to each probability.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor; 0 for the zero matrix (its rank), as
        :func:`effective_rank`.
    """
    eps = check_non_negative(eps, 'eps')
    s = _singular_values(z, 'z', dtype)
    total = s.sum()
    if float(total.detach()) == 0:
        return total * 0
    return torch.exp(shannon_entropy(s / total + eps))
