"""``logdet(mu I + Gram(z))`` with a hand-written gradient.

Autograd through ``z.T @ z`` and a Cholesky factorisation runs two matrix
products for the Gram's backward and the Cholesky backward's triangular
solves; the closed-form gradient ``d/dz logdet(mu I + z^T z) = 2 z S^-1``
(``S = mu I + z^T z``) needs one product and the inverse from the factor
already computed. On the Fashion-MNIST M-MAE step (256 x 128 features) this
halves the regulariser's cost. The value is bit for bit the one of the
autograd version (same Gram, same Cholesky); gradients agree to rounding.
"""
from typing import Optional

import torch
from torch import Tensor


class _RidgeGramLogdet(torch.autograd.Function):
    """``2 sum log diag(chol)`` with ``chol chol^T = mu I + Gram(z)``."""

    @staticmethod
    def forward(ctx, z: Tensor, chol: Tensor, samples_side: bool) -> Tensor:
        ctx.samples_side = samples_side
        ctx.save_for_backward(z, chol)
        return 2.0 * torch.log(torch.diagonal(chol)).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        z, chol = ctx.saved_tensors
        inverse = torch.cholesky_inverse(chol)
        # S^-1 is symmetric: z S^-1 for z^T z, S^-1 z for z z^T.
        grad_z = inverse @ z if ctx.samples_side else z @ inverse
        return grad_z * (2.0 * grad), None, None


def ridge_gram_logdet(z: Tensor, mu: float,
                      samples_side: bool) -> Optional[Tensor]:
    """``logdet(mu I + z^T z)`` (or ``mu I + z z^T`` with ``samples_side``).

    Args:
        z: Features (B, d) in the compute dtype.
        mu: Positive ridge.
        samples_side: Use the B x B Gram ``z z^T`` instead of ``z^T z``.

    Returns:
        Scalar tensor, or ``None`` when rounding breaks the Cholesky
        factorisation (the caller then takes the eigenvalue route).
    """
    with torch.no_grad():
        shifted = z @ z.T if samples_side else z.T @ z
        shifted.diagonal().add_(mu)
        chol, info = torch.linalg.cholesky_ex(shifted)
    if int(info) != 0:
        return None
    return _RidgeGramLogdet.apply(z, chol, samples_side)
