"""Shared parts of the batch-level feature regularisers (TCR, uniformity).

The forward pass reads nothing on the host (on a GPU each read waits for the
device): the checks of the values run on the device and their outcome is a
code tensor, :attr:`FeatureRegularizer.skip_code`. A step whose (gathered)
features are not usable contributes a zero, with zero gradient, instead of
raising on one rank while the others wait in a collective.
"""
import logging
from abc import abstractmethod
from typing import Optional

import torch
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch import Tensor

from mmae_plugin.matrix_info.coding_rate import (row_magnitudes,
                                                 unit_rows_unchecked)
from mmae_plugin.matrix_info.validation import (check_init_cfg, check_real,
                                                check_tensor)
from ..utils import check_gather_mode, gather_features

#: Largest weight whose float32 loss can be finite for a non-zero term.
MAX_LOSS_WEIGHT = float(torch.finfo(torch.float32).max)

#: :attr:`FeatureRegularizer.skip_code` values (0: the term was applied).
SKIP_NON_FINITE = 1
SKIP_ZERO_ROW = 2
SKIP_NON_FINITE_RESULT = 4


class FeatureRegularizer(BaseModule):
    """Base of losses on the l2-normalised features of the whole batch.

    Subclasses implement :meth:`value` on the normalised, gathered features;
    this class validates arguments and input, gathers across ranks and runs
    the arithmetic in float64 with autocast disabled (the reference runs took
    the Gram matrix under fp16 autocast; we do not). Rows are normalised at
    any scale (:func:`~mmae_plugin.matrix_info.coding_rate.unit_rows`).

    Unusable values do not raise in the forward pass, which reads nothing on
    the host: when the gathered features contain NaN or Inf (fp16 overflow),
    an all-zero row, or the weighted term is not finite in float32, the
    returned loss is a zero with zero gradient and :attr:`skip_code` says why
    (:data:`SKIP_NON_FINITE`, :data:`SKIP_ZERO_ROW`,
    :data:`SKIP_NON_FINITE_RESULT`; 0 when the term was applied). The
    decision is taken on the gathered features, so with ``gather='global'``
    or ``'reference'`` every rank takes it identically in the same step.
    :class:`~mmae_plugin.models.MMAE` logs the code and warns;
    :meth:`raise_if_skipped` turns it into the error for direct use.

    A batch of fewer than 2 samples (after the gather), e.g. the last batch
    of an epoch with ``drop_last=False``, has no batch statistics: the term
    is skipped for that step with a logged warning and a zero that keeps the
    autograd graph (and, under DDP, the gather's collectives) is returned.

    Args:
        gather: How features of other ranks enter the loss: ``'global'``,
            ``'reference'`` or ``'local'``
            (see :mod:`mmae_plugin.models.utils.gather`).
        loss_weight: Weight of the term, a real number in
            [0, float32 max].
        init_cfg: mmengine initialisation config (None, a dict or a list).
    """

    #: key under which :class:`~mmae_plugin.models.MMAE` logs the term.
    loss_name = 'loss_reg'

    def __init__(self, gather: str = 'global', loss_weight: float = 0.01,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=check_init_cfg(init_cfg))
        self.gather = check_gather_mode(gather)
        self.loss_weight = check_real(loss_weight, 'loss_weight', minimum=0,
                                      maximum=MAX_LOSS_WEIGHT)
        #: Device scalar (float32) of the last forward: why the term was
        #: skipped, 0 if it was applied.
        self.skip_code: Optional[Tensor] = None

    @abstractmethod
    def value(self, zn: Tensor) -> Tensor:
        """The unweighted term on unit-norm rows ``zn`` (N, d), float64.

        Must read nothing on the host; may return NaN where its own
        numerics fail (the caller then skips the term).
        """

    def forward(self, features: Tensor) -> Tensor:
        """Weighted regulariser of this batch of features.

        Args:
            features: (B, d) features of this rank; gathered per ``gather``.

        Returns:
            Scalar float32 loss (a zero when the step is skipped).
        """
        check_tensor(features, 'features', check_finite=False)
        z = gather_features(features, self.gather)
        if z.shape[0] < 2:
            print_log(
                f'{type(self).__name__} skipped for this step: it needs at '
                f'least 2 samples in the (gathered) batch, got {z.shape[0]} '
                '(a last batch with drop_last=False?)',
                logger='current', level=logging.WARNING)
            self.skip_code = z.new_zeros((), dtype=torch.float32)
            return (z.sum() * 0.0).float()
        with torch.autocast(device_type=z.device.type, enabled=False):
            z = z.to(torch.float64)
            magnitude = row_magnitudes(z)
            finite = torch.isfinite(magnitude).all()
            zero_row = (magnitude == 0).any()
            usable = finite & ~zero_row
            # Unusable rows are swapped for ones before any arithmetic, so
            # the skipped term has a finite, exactly zero gradient.
            zn = unit_rows_unchecked(torch.where(usable, z, 1.0),
                                     torch.where(usable, magnitude, 1.0))
            loss = (self.loss_weight * self.value(zn)).float()
            code = torch.where(
                ~finite, SKIP_NON_FINITE,
                torch.where(zero_row, SKIP_ZERO_ROW,
                            torch.where(torch.isfinite(loss), 0,
                                        SKIP_NON_FINITE_RESULT)))
            self.skip_code = code.float()
            return torch.where(code == 0, loss, 0.0)

    def skip_reason(self, code: int) -> str:
        """What a non-zero :attr:`skip_code` means, naming the parameter.

        Args:
            code: A value of :attr:`skip_code`.

        Returns:
            One sentence.
        """
        name = type(self).__name__
        if code == SKIP_NON_FINITE:
            return (f'{name}: features contain non-finite values (NaN or '
                    'Inf), on this rank or another (fp16 overflow in the '
                    'forward pass is the usual cause)')
        if code == SKIP_ZERO_ROW:
            return (f'{name}: features have an all-zero row: a zero vector '
                    'has no direction to normalise')
        return (f'{name}: the term is not finite or loss_weight='
                f'{self.loss_weight!r} times it overflows float32; use a '
                'smaller loss_weight')

    def raise_if_skipped(self) -> None:
        """Raise the error behind a skipped last forward, for direct use.

        Reads :attr:`skip_code` on the host (one sync): call it outside the
        training step.
        """
        code = 0 if self.skip_code is None else int(self.skip_code)
        if code:
            raise ValueError(self.skip_reason(code))
