"""One-layer softmax-attention ViT with a merged query-key matrix.

The theory paper's model: token ``u_p = [x_p, 0] + [0, e_p]`` (content plus
a one-hot position, orthonormal by construction; a masked patch keeps only
its position), scores ``u_p^T Q u_q`` with one merged, zero-initialised
query-key matrix ``Q``, softmax over the visible patches only, and the
identity on content as the value map. See
docs/theory.md#model-mmae_plugintheorymodelonelayerattention.
"""
from typing import Tuple

import torch
from torch import nn


class OneLayerAttention(nn.Module):
    """Single softmax-attention layer over content plus positions.

    Args:
        num_patches (int): Number of patches ``P`` (one positional unit
            vector each).
        feature_dim (int): Patch content dimension ``d``.
    """

    def __init__(self, num_patches: int, feature_dim: int) -> None:
        super().__init__()
        if num_patches < 1 or feature_dim < 1:
            raise ValueError(
                f'num_patches={num_patches!r}, feature_dim={feature_dim!r} '
                'are invalid: expected positive integers.')
        self.num_patches = num_patches
        self.feature_dim = feature_dim
        token_dim = feature_dim + num_patches
        # Zero init: the paper's starting point, uniform attention.
        self.qk = nn.Parameter(torch.zeros(token_dim, token_dim))

    def tokens(self, patches: torch.Tensor,
               visible: torch.Tensor) -> torch.Tensor:
        """Build tokens ``u_p = [visible content, one-hot position]``.

        Args:
            patches (torch.Tensor): ``(B, P, d)`` patch contents.
            visible (torch.Tensor): ``(B, P)`` bool, True where visible.

        Returns:
            torch.Tensor: ``(B, P, d + P)`` tokens.
        """
        batch = patches.shape[0]
        content = patches * visible.unsqueeze(-1).to(patches.dtype)
        positions = torch.eye(
            self.num_patches, dtype=patches.dtype,
            device=patches.device).expand(batch, -1, -1)
        return torch.cat([content, positions], dim=-1)

    def attention(self, patches: torch.Tensor,
                  visible: torch.Tensor) -> torch.Tensor:
        """Attention probabilities of every query over the visible keys.

        Args:
            patches (torch.Tensor): ``(B, P, d)`` patch contents.
            visible (torch.Tensor): ``(B, P)`` bool visibility mask; every
                sample needs at least one visible patch.

        Returns:
            torch.Tensor: ``(B, P, P)``; row ``p`` is the distribution of
            query ``p`` over keys, zero on masked keys.
        """
        self._check_inputs(patches, visible)
        tokens = self.tokens(patches, visible)
        scores = tokens @ self.qk.to(tokens.dtype) @ tokens.transpose(1, 2)
        scores = scores.masked_fill(~visible.unsqueeze(1), float('-inf'))
        return scores.softmax(dim=-1)

    def forward(self, patches: torch.Tensor,
                visible: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Attend and mix the visible contents.

        Args:
            patches (torch.Tensor): ``(B, P, d)`` patch contents.
            visible (torch.Tensor): ``(B, P)`` bool visibility mask.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``outputs`` ``(B, P, d)`` (one
            prediction per query patch) and ``attention`` ``(B, P, P)``.
        """
        attention = self.attention(patches, visible)
        content = patches * visible.unsqueeze(-1).to(patches.dtype)
        return attention @ content, attention

    def _check_inputs(self, patches: torch.Tensor,
                      visible: torch.Tensor) -> None:
        expected = (self.num_patches, self.feature_dim)
        if patches.dim() != 3 or tuple(patches.shape[1:]) != expected:
            raise ValueError(
                f'patches.shape={tuple(patches.shape)} is invalid: expected '
                f'(B, {expected[0]}, {expected[1]}).')
        if visible.shape != patches.shape[:2] or visible.dtype != torch.bool:
            raise ValueError(
                f'visible (shape {tuple(visible.shape)}, dtype '
                f'{visible.dtype}) is invalid: expected a bool tensor of '
                f'shape {tuple(patches.shape[:2])}.')
        if not bool(visible.any(dim=1).all()):
            raise ValueError('visible is invalid: every sample needs at '
                             'least one visible patch.')
