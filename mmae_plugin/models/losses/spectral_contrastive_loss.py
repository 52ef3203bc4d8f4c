"""Spectral contrastive loss (HaoChen, Wei, Gaidon and Ma, NeurIPS 2021).

Population loss (the paper's equation (5)), for an embedding ``f``:

    L(f) = -2 E_{(x, x+)} [f(x)^T f(x+)] + E_{x, x' iid p} [(f(x)^T f(x'))^2]

Estimator (the authors' ``models/spectral.py``) for ``B`` positive pairs
``(z1_i, z2_i)``, unbiased for i.i.d. images (the off-diagonal cross-view
pairs are independent ones):

    L_hat = -(2 / B) sum_i z1_i . z2_i
            + 1 / (B (B - 1)) sum_{i != j} (z1_i . z2_j)^2

With ``mu`` set, every embedding of norm at least ``sqrt(mu)`` is first
scaled onto the sphere of radius ``sqrt(mu)`` and the loss is divided by
``mu``, as in the authors' code; ``mu=None`` uses the raw embeddings. See
docs/matrix_info.md (configs reproducing figures 1-3).
"""
import math
from typing import Optional

import torch
from mmpretrain.registry import MODELS
from torch import Tensor, nn

from mmae_plugin.matrix_info.validation import check_tensor
from mmae_plugin.utils.validation import check_real


def project_to_ball(z: Tensor, mu: float) -> Tensor:
    """Scale rows of norm >= ``sqrt(mu)`` onto the sphere of that radius.

    Args:
        z: Embeddings (B, d).
        mu: Squared radius of the ball (> 0).

    Returns:
        (B, d): rows inside the ball unchanged, the others rescaled.
    """
    radius = math.sqrt(mu)
    norms = z.norm(dim=1, keepdim=True)
    # The authors' code uses a hard mask (not a clamp of the scale) so that
    # rows inside the ball get exactly the identity's gradient.
    inside = (norms < radius).to(z.dtype)
    scaled = z / norms.clamp_min(torch.finfo(z.dtype).tiny) * radius
    return inside * z + (1 - inside) * scaled


def spectral_contrastive_loss(z1: Tensor,
                              z2: Tensor,
                              mu: Optional[float] = 1.0) -> Tensor:
    """The off-diagonal cross-pair estimator of the spectral loss.

    Args:
        z1: Embeddings of view 1 (B, d), B >= 2.
        z2: Embeddings of view 2 (B, d), row ``i`` the positive of
            ``z1[i]``.
        mu: Squared radius of the ball the embeddings are projected onto
            (the loss is divided by it), or ``None`` for the raw embeddings.

    Returns:
        Scalar ``-(2/B) sum_i z1_i.z2_i + sum_{i!=j} (z1_i.z2_j)^2 /
        (B (B-1))`` (divided by ``mu`` when given).
    """
    # Shapes only: a finiteness scan would sync the host every step, and
    # DivergenceHook already stops training at the first non-finite loss.
    check_tensor(z1, 'z1', check_finite=False)
    check_tensor(z2, 'z2', check_finite=False)
    if z1.shape != z2.shape:
        raise ValueError(f'the two views must have the same shape, got '
                         f'{tuple(z1.shape)} and {tuple(z2.shape)}')
    if z1.shape[0] < 2:
        raise ValueError(f'the estimator needs B >= 2 pairs (it averages '
                         f'over i != j), got B = {z1.shape[0]}')
    if mu is not None:
        z1, z2 = project_to_ball(z1, mu), project_to_ball(z2, mu)
    batch = z1.shape[0]
    positive = (z1 * z2).sum() * (2.0 / batch)
    cross = z1 @ z2.T
    # All B^2 squares minus the B diagonal (positive-pair) ones.
    squares = cross.square()
    negative = (squares.sum() - squares.diagonal().sum()) / (
        batch * (batch - 1))
    loss = negative - positive
    return loss if mu is None else loss / mu


@MODELS.register_module()
class SpectralContrastiveLoss(nn.Module):
    """Spectral contrastive loss of two batches of paired embeddings.

    See the module docstring for the population loss and the estimator.

    Args:
        mu: Squared radius of the ball the embeddings are projected onto
            before the loss (the authors' default is 1), or ``None`` for no
            projection.
        loss_weight: Multiplier of the loss (>= 0).
    """

    def __init__(self,
                 mu: Optional[float] = 1.0,
                 loss_weight: float = 1.0) -> None:
        super().__init__()
        self.mu = None if mu is None else check_real(
            mu, 'mu', minimum=0, strict=True)
        self.loss_weight = check_real(loss_weight, 'loss_weight', minimum=0)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The weighted loss.

        Args:
            z1: Embeddings of view 1 (B, d).
            z2: Embeddings of view 2 (B, d), row-aligned with ``z1``.

        Returns:
            Scalar loss.
        """
        return self.loss_weight * spectral_contrastive_loss(z1, z2, self.mu)

    def extra_repr(self) -> str:
        return f'mu={self.mu}, loss_weight={self.loss_weight}'
