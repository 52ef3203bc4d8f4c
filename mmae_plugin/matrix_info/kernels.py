"""Builders of the unit-diagonal PSD matrices the paper analyses.

``z`` is a batch of features (B, d), rows are samples.
:func:`normalized_covariance` is the batch-normalised covariance
``zb^T zb / B`` (d x d, every feature standardised over the batch; the
information-flow paper's matrix for Siamese branches);
:func:`normalized_gram` is the Gram matrix ``zn zn^T`` (B x B) of the
l2-normalised rows. With ``factored=True`` both return a
:class:`FactoredPSD` ``F F^T``, on which every toolbox function works on
the cheaper side of the Gram/covariance duality
(docs/matrix_info.md#the-cheaper-side-of-the-gramcovariance-duality).
"""
from typing import Optional, Union

import torch
from torch import Tensor

from ..utils.validation import check_bool
from .coding_rate import check_features
from .validation import to_compute_dtype

#: A feature whose batch standard deviation is below this fraction of its
#: largest magnitude is constant up to rounding ("dead"); standardising it
#: would turn rounding noise into a unit-variance feature.
DEAD_FEATURE_RTOL = 1e-12


class FactoredPSD:
    """A PSD matrix ``K = F F^T`` kept as its factor ``F`` (n, r).

    Args:
        factor: Real floating tensor of shape (n, r).
    """

    def __init__(self, factor: Tensor) -> None:
        if not isinstance(factor, Tensor) or factor.dim() != 2:
            shape = tuple(factor.shape) if isinstance(factor, Tensor) else \
                type(factor).__name__
            raise ValueError(
                f'factor must be a 2-D (n, r) tensor, got {shape}')
        if not factor.is_floating_point():
            raise TypeError(f'factor must be a floating tensor, got dtype '
                            f'{factor.dtype}')
        if not bool(torch.isfinite(factor).all()):
            raise ValueError('factor contains non-finite values (NaN or Inf)')
        self.factor = factor

    @property
    def size(self) -> int:
        """Side n of the represented matrix."""
        return self.factor.shape[0]

    @property
    def inner_size(self) -> int:
        """Number r of factor columns (an upper bound on the rank)."""
        return self.factor.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the factor."""
        return self.factor.dtype

    def trace(self) -> Tensor:
        """``tr(F F^T) = ||F||_F^2`` without forming the matrix."""
        return self.factor.pow(2).sum()

    def small_gram(self) -> Tensor:
        """The cheaper side's matrix: ``F^T F`` if r < n else ``F F^T``."""
        f = self.factor
        return f.T @ f if self.inner_size < self.size else f @ f.T

    def dense(self) -> Tensor:
        """The represented n x n matrix ``F F^T``."""
        return self.factor @ self.factor.T

    def to(self, dtype: torch.dtype) -> 'FactoredPSD':
        """Copy with the factor cast to ``dtype`` (differentiable)."""
        return FactoredPSD(self.factor.to(dtype))

    def __repr__(self) -> str:
        return (f'FactoredPSD(size={self.size}, inner_size={self.inner_size}, '
                f'dtype={self.dtype})')


PSDInput = Union[Tensor, FactoredPSD]


def _standardize_columns(z: Tensor) -> Tensor:
    """Standardise every column over the rows (biased variance, as BatchNorm).

    Dead columns (constant up to rounding) become zero columns instead of
    amplified noise. Subtracting the first row before the mean makes an
    exactly constant column exactly zero, whatever its offset.

    Args:
        z: Features (B, d) in the compute dtype.

    Returns:
        Standardised features (B, d).
    """
    shifted = z - z[:1]
    centered = shifted - shifted.mean(dim=0, keepdim=True)
    var = centered.pow(2).mean(dim=0)
    magnitude = z.detach().abs().amax(dim=0)
    dead = var.detach() <= (DEAD_FEATURE_RTOL * magnitude).pow(2)
    # sqrt has an infinite derivative at 0: feed it 1 on dead columns so the
    # masked branch stays finite in the backward pass as well.
    std = torch.sqrt(torch.where(dead, torch.ones_like(var), var))
    return torch.where(dead, torch.zeros_like(centered), centered / std)


def _normalize_rows(z: Tensor) -> Tensor:
    """l2-normalise every row; all-zero rows stay zero (finite gradient).

    Args:
        z: Features (B, d) in the compute dtype.

    Returns:
        Row-normalised features (B, d).
    """
    norm_sq = z.pow(2).sum(dim=1, keepdim=True)
    dead = norm_sq.detach() == 0
    norm = torch.sqrt(torch.where(dead, torch.ones_like(norm_sq), norm_sq))
    return torch.where(dead, torch.zeros_like(z), z / norm)


def normalized_covariance(z: Tensor,
                          factored: bool = False,
                          dtype: Optional[torch.dtype] = None) -> PSDInput:
    """Batch-normalised covariance ``K = zb^T zb / B`` (d x d, unit diagonal).

    ``zb`` is ``z`` with every feature (column) standardised over the batch,
    with the biased variance of BatchNorm, so ``K`` is the correlation matrix
    of the features (paper section 3). A feature that is constant over the
    batch has no defined correlation: its row and column of ``K`` are zero,
    and a fully collapsed batch gives the zero matrix, which the entropies
    and divergences refuse (it has no density matrix).

    Args:
        z: Features (B, d), B >= 2, any floating dtype.
        factored: Return a :class:`FactoredPSD` with factor ``zb^T / sqrt(B)``
            (d x B) so later eigendecompositions use the cheaper side.
        dtype: Compute dtype (float64 by default).

    Returns:
        Dense (d, d) tensor, or its :class:`FactoredPSD`.
    """
    check_features(z, name='z', min_samples=2)
    check_bool(factored, 'factored')
    zb = _standardize_columns(to_compute_dtype(z, dtype))
    factor = zb.T / zb.shape[0]**0.5
    return FactoredPSD(factor) if factored else factor @ factor.T


def normalized_gram(z: Tensor,
                    factored: bool = False,
                    dtype: Optional[torch.dtype] = None) -> PSDInput:
    """Gram matrix ``zn zn^T`` of l2-normalised rows (B x B, unit diagonal).

    An all-zero row has no direction: its row and column of the Gram matrix
    are zero.

    Args:
        z: Features (B, d), any floating dtype.
        factored: Return a :class:`FactoredPSD` with factor ``zn`` (B x d).
        dtype: Compute dtype (float64 by default).

    Returns:
        Dense (B, B) tensor, or its :class:`FactoredPSD`.
    """
    check_features(z, name='z', min_samples=1)
    check_bool(factored, 'factored')
    zn = _normalize_rows(to_compute_dtype(z, dtype))
    return FactoredPSD(zn) if factored else zn @ zn.T
