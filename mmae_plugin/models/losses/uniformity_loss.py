"""U-MAE's square uniformity regulariser."""
from typing import Optional

from mmpretrain.registry import MODELS
from torch import Tensor

from .feature_regularizer import FeatureRegularizer


@MODELS.register_module()
class UniformityLoss(FeatureRegularizer):
    """``loss_weight * mean_{i,j} (zn_i . zn_j)^2`` over the full B x B matrix.

    The diagonal is included, as in the U-MAE reference. Because
    ``||zn zn^T||_F = ||zn^T zn||_F`` the sum is taken on the smaller side.

    Args:
        gather: ``'global'``, ``'reference'`` or ``'local'`` (see
            :class:`~mmae_plugin.models.losses.TCRLoss`).
        loss_weight: Weight lambda of the term (>= 0).
        gather_capacity: Rows per rank of the gather's slots (see
            :class:`~mmae_plugin.models.losses.FeatureRegularizer`).
        compute_dtype: ``'float64'`` (default) or ``'float32'``.
    """

    loss_name = 'loss_unif'

    def value(self, zn: Tensor, valid: Optional[Tensor] = None) -> Tensor:
        num_samples, dim = zn.shape
        # Zero padding rows add nothing to the sum; only the count changes.
        gram = zn @ zn.T if num_samples <= dim else zn.T @ zn
        if valid is None:
            return gram.square().sum() / num_samples**2
        count = valid.sum().clamp_min(1).to(zn.dtype)
        return gram.square().sum() / count**2
