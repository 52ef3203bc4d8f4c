"""Matrix-based Renyi entropy, joint entropy and mutual information.

Definitions 1-3 of the information-flow paper, for PSD ``K`` with unit
diagonal: ``H_a(K) = log tr((K / n)^a) / (1 - a)`` (von Neumann at
``a = 1``), ``H_a(K1, K2) = H_a(K1 o K2)`` (Hadamard product) and
``I_a(K1; K2) = H_a(K1) + H_a(K2) - H_a(K1 o K2)``. Other diagonals are
normalised by the trace. ``K`` may be dense or a
:class:`~mmae_plugin.matrix_info.kernels.FactoredPSD` (computed on the
cheaper side). Natural logarithms.
"""
from typing import Optional

import torch
from torch import Tensor

from .kernels import FactoredPSD, PSDInput
from .spectrum import (check_psd_by_cholesky, prepare_input, prepared_size,
                       prepared_spectrum, purity, renyi_entropy)
from .validation import check_alpha, check_same_size


def _hadamard(p1: PSDInput, p2: PSDInput) -> PSDInput:
    """``K1 o K2`` of prepared matrices on its cheaper representation."""
    if isinstance(p1, FactoredPSD) and isinstance(p2, FactoredPSD) and \
            p1.inner_size * p2.inner_size < p1.size:
        rows = torch.einsum('ir,is->irs', p1.factor, p2.factor)
        return FactoredPSD(rows.reshape(p1.size, -1))
    dense1 = p1.dense() if isinstance(p1, FactoredPSD) else p1
    dense2 = p2.dense() if isinstance(p2, FactoredPSD) else p2
    return dense1 * dense2


def _prepare_pair(K1: PSDInput, K2: PSDInput, dtype: Optional[torch.dtype]):
    """Prepare two inputs and check that their sizes match."""
    p1, p2 = prepare_input(K1, 'K1', dtype), prepare_input(K2, 'K2', dtype)
    check_same_size(prepared_size(p1), prepared_size(p2))
    return p1, p2


def _check_psd_cheaply(prepared: PSDInput, K: PSDInput, name: str) -> None:
    """Cholesky-based PSD check of a dense input (factors are PSD)."""
    if not isinstance(prepared, FactoredPSD):
        check_psd_by_cholesky(prepared, name, K.dtype)


def matrix_entropy(K: PSDInput,
                   alpha: float = 1.0,
                   dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix-based Renyi entropy ``H_alpha(K)`` (Definition 1), in nats.

    ``alpha = 2`` needs no eigendecomposition: ``-log ||K||_F^2 / (tr K)^2``.
    Every positive finite ``alpha`` is computed stably in log space (the
    limit ``alpha -> inf`` is the min-entropy ``-log max p``). The zero
    matrix has no density matrix and is refused.

    Args:
        K: PSD matrix (n, n), dense or factored; normalised by its trace.
        alpha: Positive order; 1 is the von Neumann entropy.
        dtype: Compute dtype (float64 by default, whatever ``K``'s dtype).

    Returns:
        Scalar tensor in ``[0, log n]``, differentiable.
    """
    alpha = check_alpha(alpha)
    if alpha == 2.0:
        return -torch.log(purity(K, 'K', dtype))
    prepared = prepare_input(K, 'K', dtype)
    input_dtype = None if isinstance(K, FactoredPSD) else K.dtype
    return renyi_entropy(prepared_spectrum(prepared, 'K', input_dtype), alpha)


def hadamard_product(K1: PSDInput,
                     K2: PSDInput,
                     dtype: Optional[torch.dtype] = None) -> PSDInput:
    """``K1 o K2`` on its cheaper representation.

    For factors ``F1`` (n, r1) and ``F2`` (n, r2) the product is ``W W^T`` with
    the row-wise Kronecker (Khatri-Rao) factor ``W`` (n, r1 r2); it is kept
    factored only when ``r1 r2 < n``, otherwise it is formed densely (the
    product of two d x d covariances has no small side).

    Args:
        K1: First PSD matrix, dense or factored.
        K2: Second PSD matrix of the same size.
        dtype: Compute dtype (float64 by default).

    Returns:
        The Hadamard product, dense (n, n) or :class:`FactoredPSD`.
    """
    p1, p2 = _prepare_pair(K1, K2, dtype)
    _check_psd_cheaply(p1, K1, 'K1')
    _check_psd_cheaply(p2, K2, 'K2')
    return _hadamard(p1, p2)


def matrix_joint_entropy(K1: PSDInput,
                         K2: PSDInput,
                         alpha: float = 1.0,
                         dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix-based joint entropy ``H_alpha(K1, K2) = H_alpha(K1 o K2)``.

    For unit-diagonal inputs ``max(H(K1), H(K2)) <= H(K1, K2) <= H(K1) +
    H(K2)`` (Proposition 2). The Hadamard product is bilinear, so normalising
    the inputs by their traces first would not change the result.

    Args:
        K1: First PSD matrix (n, n), dense or factored.
        K2: Second PSD matrix (n, n), dense or factored.
        alpha: Positive order; 1 is von Neumann.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor, differentiable.
    """
    alpha = check_alpha(alpha)
    # The product of PSD matrices is PSD (Schur), so only the inputs are
    # checked, by Cholesky, which is cheaper than their eigenvalues.
    product = hadamard_product(K1, K2, dtype)
    return renyi_entropy(prepared_spectrum(product, 'K1 o K2'), alpha)


def matrix_mutual_information(K1: PSDInput,
                              K2: PSDInput,
                              alpha: float = 1.0,
                              dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix-based mutual information (Definition 2).

    ``I_alpha(K1; K2) = H_alpha(K1) + H_alpha(K2) - H_alpha(K1 o K2)``; at most
    ``log n`` for unit-diagonal inputs (Proposition 1).

    Args:
        K1: First PSD matrix (n, n), dense or factored.
        K2: Second PSD matrix (n, n), dense or factored.
        alpha: Positive order; 1 is von Neumann.
        dtype: Compute dtype (float64 by default).

    Returns:
        Scalar tensor, differentiable.
    """
    alpha = check_alpha(alpha)
    p1, p2 = _prepare_pair(K1, K2, dtype)
    # The eigenvalues needed for H(K1), H(K2) also validate definiteness.
    dtype1 = None if isinstance(K1, FactoredPSD) else K1.dtype
    dtype2 = None if isinstance(K2, FactoredPSD) else K2.dtype
    spectrum1 = prepared_spectrum(p1, 'K1', dtype1)
    spectrum2 = prepared_spectrum(p2, 'K2', dtype2)
    joint = prepared_spectrum(_hadamard(p1, p2), 'K1 o K2')
    return renyi_entropy(spectrum1, alpha) + \
        renyi_entropy(spectrum2, alpha) - renyi_entropy(joint, alpha)
