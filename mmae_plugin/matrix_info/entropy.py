"""Matrix-based Renyi entropy, joint entropy and mutual information.

Definitions 1-3 of the information-flow paper, for PSD matrices ``K`` with
unit diagonal: ``H_a(K) = log tr((K / n)^a) / (1 - a)``, von Neumann at
``a = 1``; ``H_a(K1, K2) = H_a(K1 o K2)`` (Hadamard product) and
``I_a(K1; K2) = H_a(K1) + H_a(K2) - H_a(K1 o K2)``.

A matrix whose diagonal is not 1 is normalised by its trace, i.e. ``K / n`` is
replaced by the density matrix ``K / tr K``; both agree on unit-diagonal
input. Every argument named ``K`` may be a dense (n, n) tensor or a
:class:`~mmae_plugin.matrix_info.kernels.FactoredPSD` (from the builders with
``factored=True``), in which case the eigendecomposition runs on the cheaper
side of the Gram/covariance duality. All logarithms are natural.
"""
from typing import Optional

import torch
from torch import Tensor

from .kernels import FactoredPSD, PSDInput
from .spectrum import (check_psd_by_cholesky, dense_symmetric,
                       density_spectrum, purity, renyi_entropy)
from .validation import check_alpha, check_same_size, resolve_dtype


def matrix_entropy(K: PSDInput, alpha: float = 1.0,
                   dtype: Optional[torch.dtype] = None) -> Tensor:
    """Matrix-based Renyi entropy ``H_alpha(K)`` (Definition 1), in nats.

    ``alpha = 2`` needs no eigendecomposition: ``-log ||K||_F^2 / (tr K)^2``.

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
    p, _ = density_spectrum(K, 'K', dtype)
    return renyi_entropy(p, alpha)


def hadamard_product(K1: PSDInput, K2: PSDInput,
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
    compute = resolve_dtype(dtype)
    if isinstance(K1, FactoredPSD) and isinstance(K2, FactoredPSD):
        check_same_size(K1.size, K2.size)
        if K1.inner_size * K2.inner_size < K1.size:
            f1, f2 = K1.factor.to(compute), K2.factor.to(compute)
            rows = torch.einsum('ir,is->irs', f1, f2)
            return FactoredPSD(rows.reshape(K1.size, -1))
    dense1 = _validated_dense(K1, 'K1', dtype)
    dense2 = _validated_dense(K2, 'K2', dtype)
    check_same_size(dense1.shape[0], dense2.shape[0])
    return dense1 * dense2


def _validated_dense(K: PSDInput, name: str,
                     dtype: Optional[torch.dtype]) -> Tensor:
    """Dense symmetric PSD matrix in the compute dtype, checked.

    Args:
        K: Dense or factored PSD matrix.
        name: Parameter name used in error messages.
        dtype: Compute dtype.

    Returns:
        Dense symmetric matrix.
    """
    if isinstance(K, FactoredPSD):
        return K.to(resolve_dtype(dtype)).dense()
    sym = dense_symmetric(K, name, dtype)
    check_psd_by_cholesky(sym, name, K.dtype)
    return sym


def matrix_joint_entropy(K1: PSDInput, K2: PSDInput, alpha: float = 1.0,
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
    return matrix_entropy(hadamard_product(K1, K2, dtype), alpha, dtype)


def matrix_mutual_information(K1: PSDInput, K2: PSDInput, alpha: float = 1.0,
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
    joint = matrix_joint_entropy(K1, K2, alpha, dtype)
    return matrix_entropy(K1, alpha, dtype) + \
        matrix_entropy(K2, alpha, dtype) - joint
