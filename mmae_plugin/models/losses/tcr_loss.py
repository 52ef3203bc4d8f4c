"""M-MAE's total-coding-rate regulariser."""
import math

from mmpretrain.registry import MODELS
from torch import Tensor

from mmae_plugin.matrix_info.coding_rate import total_coding_rate_sync_free
from mmae_plugin.matrix_info.validation import (check_bool, check_choice,
                                                check_real)
from .feature_regularizer import FeatureRegularizer

TCR_FORMS = ('reference', 'paper')


@MODELS.register_module()
class TCRLoss(FeatureRegularizer):
    """Negative total coding rate of the l2-normalised batch features.

    ``loss = -loss_weight * TCR`` with, for unit rows ``zn`` (B, d):

    * ``form='reference'``: ``TCR = logdet(I_d + (mu / d) zn^T zn)``, what the
      published M-MAE code computes;
    * ``form='paper'``: ``TCR = logdet(mu I_d + zn^T zn)`` (paper eq. 8, 13).

    The two differ by the scale of the ridge, so the same ``mu`` is not the
    same regulariser. ``centering=True`` replaces ``zn^T zn`` by
    ``zn^T J_B zn`` with ``J_B = I_B - 11^T / B``. The log-determinant runs in
    float64 on the smaller of the d x d and B x B sides (Sylvester), which is
    exact and stays finite on collapsed (rank-1) features.

    Args:
        mu: Positive, finite coding-rate parameter.
        form: ``'reference'`` or ``'paper'``.
        centering: Center the features over the batch first (a bool).
        gather: ``'global'`` (exact gradient under DDP), ``'reference'``
            (published gather: effective weight ``loss_weight / world_size``)
            or ``'local'``.
        loss_weight: Weight lambda of the term (>= 0).
        init_cfg: mmengine initialisation config.
    """

    loss_name = 'loss_tcr'

    def __init__(self, mu: float = 1.0, form: str = 'reference',
                 centering: bool = False, gather: str = 'global',
                 loss_weight: float = 0.01, init_cfg=None) -> None:
        super().__init__(gather=gather, loss_weight=loss_weight,
                         init_cfg=init_cfg)
        self.mu = check_real(mu, 'mu', minimum=0, strict=True)
        self.form = check_choice(form, 'form', TCR_FORMS)
        self.centering = check_bool(centering, 'centering')

    def value(self, zn: Tensor) -> Tensor:
        # ||zn||_F^2 = B for unit rows; centering only lowers it.
        num_samples, dim = zn.shape
        if self.centering:
            # zn^T J zn == (J zn)^T (J zn) because J is a symmetric projection.
            zn = zn - zn.mean(dim=0, keepdim=True)
        if self.form == 'paper':
            return -total_coding_rate_sync_free(zn, self.mu, num_samples)
        scale = math.sqrt(self.mu / dim)
        return -total_coding_rate_sync_free(zn * scale, 1.0,
                                            num_samples * scale**2)
