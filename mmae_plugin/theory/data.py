"""Synthetic images: one dominant global area and several small local areas.

The setting of "A Theoretical Analysis of Self-Supervised Learning for
Vision Transformers" (ICLR 2025 submission): ``P`` patches partitioned into
one global area and ``K - 1`` local areas of ``round(P ** local_exponent)``
patches each (contiguous, global first; smaller exponent = stronger
imbalance). Area ``k`` owns a feature ``v_k`` (orthonormal across areas)::

    x_p = z_{k(p)} * v_{k(p)} + xi_p,   z_k ~ N(mu, s_k^2) independent,
    xi_p ~ N(0, noise_std^2 / d * I_d)

By default ``mu = 0`` (``weight_mean``) and ``s_k = 1``;
``global_weight_std`` (``s_0``) makes the global feature dominant. A patch
is predictable only from its own area. See docs/theory.md#1-the-theory-lab.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ..utils.validation import check_int, check_non_negative, check_real

GLOBAL_AREA = 0


@dataclass(frozen=True)
class ImbalanceSetting:
    """Sizes and dimensions of the synthetic data.

    Args:
        num_patches (int): Number of patches ``P`` per sample.
        num_local_areas (int): Number of small local areas (``K - 1``).
        local_exponent (float): Imbalance parameter ``kappa`` in (0, 1); each
            local area has ``round(P ** kappa)`` patches.
        feature_dim (int): Dimension ``d`` of a patch; must be at least the
            number of areas so that area features can be orthonormal.
        noise_std (float): Root mean squared norm of the additive patch noise.
        global_weight_std (float): Standard deviation ``s_0 > 0`` of the
            global area's weight (local areas: 1). Above 1 the global
            feature carries more signal than each local one.
        weight_mean (float): Common mean ``mu`` of every area weight.
    """

    num_patches: int = 64
    num_local_areas: int = 3
    local_exponent: float = 0.5
    feature_dim: int = 16
    noise_std: float = 0.0
    global_weight_std: float = 1.0
    weight_mean: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.num_patches, 'num_patches', minimum=2)
        check_int(self.num_local_areas, 'num_local_areas', minimum=1)
        check_real(
            self.local_exponent, 'local_exponent', minimum=0, strict=True)
        if self.local_exponent >= 1:  # the open interval (0, 1)
            raise ValueError(f'local_exponent must be a finite number > 0 '
                             f'and < 1, got {self.local_exponent!r}')
        # At least one dimension per area (the features are orthonormal).
        check_int(self.feature_dim, 'feature_dim', minimum=self.num_areas)
        check_non_negative(self.noise_std, 'noise_std')
        check_real(
            self.global_weight_std,
            'global_weight_std',
            minimum=0,
            strict=True)
        check_real(self.weight_mean, 'weight_mean')
        global_size = self.area_sizes[GLOBAL_AREA]
        if global_size < self.local_area_size:
            raise ValueError(
                f'local_exponent must leave the global area at least as '
                f'large as each of the {self.num_local_areas} local areas, '
                f'got {self.local_exponent!r}: the global area would have '
                f'{global_size} of the {self.num_patches} patches, each '
                f'local area {self.local_area_size}')

    @property
    def num_areas(self) -> int:
        """int: Total number of areas ``K`` (global + local)."""
        return self.num_local_areas + 1

    @property
    def local_area_size(self) -> int:
        """int: Patches per local area, ``max(1, round(P ** kappa))``."""
        return max(1, round(self.num_patches**self.local_exponent))

    @property
    def area_sizes(self) -> List[int]:
        """list[int]: Patches per area, global area first."""
        local = self.local_area_size
        return [self.num_patches - self.num_local_areas * local
                ] + [local] * self.num_local_areas

    @property
    def weight_stds(self) -> List[float]:
        """list[float]: Standard deviation of every area weight ``z_k``."""
        return [self.global_weight_std] + [1.0] * self.num_local_areas

    @property
    def imbalance_ratio(self) -> float:
        """float: Global area size divided by a local area size."""
        return self.area_sizes[GLOBAL_AREA] / self.local_area_size


def area_index(setting: ImbalanceSetting) -> torch.Tensor:
    """Area id of every patch.

    Args:
        setting (ImbalanceSetting): Data sizes.

    Returns:
        torch.Tensor: Long tensor of shape ``(P,)``; 0 is the global area,
        ``1 .. K-1`` are the local areas, as contiguous index ranges.
    """
    sizes = torch.tensor(setting.area_sizes)
    return torch.repeat_interleave(torch.arange(setting.num_areas), sizes)


def orthonormal_features(num_areas: int, dim: int,
                         generator: torch.Generator) -> torch.Tensor:
    """Random orthonormal area features.

    Args:
        num_areas (int): Number of features (rows) to draw.
        dim (int): Ambient dimension, ``>= num_areas``.
        generator (torch.Generator): Source of randomness.

    Returns:
        torch.Tensor: ``(num_areas, dim)`` float32 matrix with orthonormal
        rows (a uniformly random orthonormal frame, via QR with sign fix).
    """
    gaussian = torch.randn(
        dim, num_areas, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    # The sign fix makes the frame Haar-distributed instead of QR-biased.
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.T.contiguous().float()


class FeatureImbalanceData:
    """Seeded sampler of synthetic images with imbalanced areas.

    The area features are drawn once from ``seed``; every call to
    :meth:`sample` draws fresh per-sample weights and noise from the
    generator it is given (or from the sampler's own stream).

    Args:
        setting (ImbalanceSetting): Data sizes and noise level.
        seed (int): Seed of the feature frame and of the default sample
            stream.
    """

    def __init__(self, setting: ImbalanceSetting, seed: int = 0) -> None:
        self.setting = setting
        self._generator = torch.Generator().manual_seed(seed)
        self.features = orthonormal_features(setting.num_areas,
                                             setting.feature_dim,
                                             self._generator)
        self.area_index = area_index(setting)

    def sample(
        self,
        batch_size: int,
        generator: Optional[torch.Generator] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Draw a batch of images.

        Args:
            batch_size (int): Number of samples ``B``.
            generator (torch.Generator, optional): Randomness for weights and
                noise. Defaults to the sampler's own seeded stream.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``patches`` of shape
            ``(B, P, d)`` and the per-sample area ``weights`` ``z`` of shape
            ``(B, K)``, ``z_k ~ N(weight_mean, weight_stds[k]^2)``.
        """
        check_int(batch_size, 'batch_size', minimum=1)
        generator = generator or self._generator
        s = self.setting
        # Same draw for every setting, then an affine map: the defaults
        # (mean 0, std 1) reproduce the original stream bit for bit.
        weights = torch.randn(batch_size, s.num_areas, generator=generator)
        weights = weights * torch.tensor(s.weight_stds) + s.weight_mean
        patches = (
            weights[:, self.area_index].unsqueeze(-1) *
            self.features[self.area_index].unsqueeze(0))
        if s.noise_std > 0:
            noise = torch.randn(patches.shape, generator=generator)
            patches = patches + noise * (s.noise_std / s.feature_dim**0.5)
        return patches, weights
