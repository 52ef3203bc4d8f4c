"""M-MAE's total-coding-rate regulariser."""
from typing import Optional

import torch
from mmpretrain.registry import MODELS
from torch import Tensor

from mmae_plugin.matrix_info.coding_rate import (TCR_FORMS,
                                                 check_coding_rate_args,
                                                 coding_rate_key,
                                                 coding_rate_of_unit_rows)
from .feature_regularizer import FeatureRegularizer

__all__ = ['TCRLoss', 'TCR_FORMS']


@MODELS.register_module()
class TCRLoss(FeatureRegularizer):
    """Negative total coding rate of the l2-normalised batch features.

    ``loss = -loss_weight * TCR`` with ``TCR`` from
    :func:`mmae_plugin.matrix_info.coding_rate.coding_rate`; for unit rows
    ``zn`` (B, d), ``form='reference'`` (the published M-MAE code) is
    ``logdet(I_d + (mu / d) zn^T zn)`` and ``form='paper'`` (eq. 8, 13) is
    ``logdet(mu I_d + zn^T zn)``: the same ``mu`` is not the same regulariser.
    ``MatrixInfoHook`` logs the same quantity as :attr:`key`. Use::

        model = dict(type='MMAE', ...,
                     regularizer=dict(type='TCRLoss', loss_weight=0.01))

    Args:
        mu: Coding-rate parameter, a finite number in ``(0, 1e300]``
            (:data:`~mmae_plugin.matrix_info.coding_rate.MAX_MU`).
        form: ``'reference'`` or ``'paper'``.
        centering: Center the features over the batch first (a bool).
        gather: ``'global'`` (exact gradient under DDP), ``'reference'``
            (published gather: effective weight ``loss_weight / world_size``)
            or ``'local'``.
        loss_weight: Weight lambda of the term (>= 0).
        init_cfg: mmengine initialisation config.
        gather_capacity: Rows per rank of the gather's slots (see
            :class:`FeatureRegularizer`); ``None``: agreed at the first
            gathered step.
        compute_dtype: ``'float64'`` (default) or ``'float32'``.
    """

    loss_name = 'loss_tcr'

    def __init__(self,
                 mu: float = 1.0,
                 form: str = 'reference',
                 centering: bool = False,
                 gather: str = 'global',
                 loss_weight: float = 0.01,
                 init_cfg=None,
                 gather_capacity: Optional[int] = None,
                 compute_dtype: str = 'float64') -> None:
        super().__init__(
            gather=gather,
            loss_weight=loss_weight,
            init_cfg=init_cfg,
            gather_capacity=gather_capacity,
            compute_dtype=compute_dtype)
        self.form, self.mu, self.centering = check_coding_rate_args(
            form, mu, centering)

    @property
    def key(self) -> str:
        """Logged name of the coding rate this loss maximises."""
        return coding_rate_key(self.form, self.mu, self.centering)

    def value(self, zn: Tensor, valid: Optional[Tensor] = None) -> Tensor:
        if valid is None or not self.centering:
            # Zero padding rows leave logdet(mu I + zn^T zn) unchanged.
            return coding_rate_of_unit_rows(
                zn, self.form, self.mu, self.centering, sign=-1.0)
        # Centre over the valid rows only and keep the padding at zero.
        count = valid.sum().clamp_min(1).to(zn.dtype)
        mean = zn.sum(dim=0, keepdim=True) / count
        centred = torch.where(valid.unsqueeze(1), zn - mean, 0.0)
        return coding_rate_of_unit_rows(
            centred, self.form, self.mu, False, sign=-1.0)
