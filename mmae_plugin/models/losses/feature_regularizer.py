"""Shared parts of the batch-level feature regularisers (TCR, uniformity).

The forward pass reads nothing on the host: unusable features give a zero
term and a device-side :attr:`FeatureRegularizer.skip_code`. Under a process
group the features arrive padded to a per-rank capacity with a device-side
mask of the valid rows (:class:`~mmae_plugin.models.utils.gather.RowGatherer`);
padding rows are zero, which changes neither term. Why and how:
docs/reliability.md#no-host-sync-in-the-training-step and
docs/reliability.md#distributed-regularisers-agree-across-ranks.
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
from mmae_plugin.matrix_info.validation import check_tensor
from mmae_plugin.utils.validation import check_init_cfg, check_real
from ..utils.gather import (GatheredRows, RowGatherer, check_capacity,
                            check_gather_mode, is_distributed)

#: Largest weight whose float32 loss can be finite for a non-zero term.
MAX_LOSS_WEIGHT = float(torch.finfo(torch.float32).max)

#: ``compute_dtype`` values a regulariser accepts, and the torch dtypes.
COMPUTE_DTYPES = {'float64': torch.float64, 'float32': torch.float32}

#: :attr:`FeatureRegularizer.skip_code` values (0: the term was applied).
SKIP_NON_FINITE = 1
SKIP_ZERO_ROW = 2
SKIP_NON_FINITE_RESULT = 4
SKIP_TOO_FEW_ROWS = 8
SKIP_GATHER_REFUSED = 16


class FeatureRegularizer(BaseModule):
    """Base of losses on the l2-normalised features of the whole batch.

    Subclasses implement :meth:`value` on the normalised, gathered features;
    this class validates arguments and input, gathers across ranks and runs
    the arithmetic in ``compute_dtype`` with autocast disabled. Unusable
    features (NaN or Inf, an all-zero row, a non-finite term, fewer than 2
    rows, rows that no longer fit the gather's layout) give a zero loss with
    zero gradient and a non-zero :attr:`skip_code` (the ``SKIP_*`` constants),
    decided identically on every rank; :meth:`raise_if_skipped` turns it into
    an error for direct use. The codes:
    docs/reliability.md#no-host-sync-in-the-training-step.

    Args:
        gather: How features of other ranks enter the loss: ``'global'``,
            ``'reference'`` or ``'local'``
            (see :mod:`mmae_plugin.models.utils.gather`).
        loss_weight: Weight of the term, a real number in
            [0, float32 max].
        init_cfg: mmengine initialisation config (None, a dict or a list).
        gather_capacity: Rows every rank's slot of the gather holds, at
            least the per-GPU batch size; ``None`` (default): the largest
            per-rank batch of the first gathered step.
        compute_dtype: ``'float64'`` (default) or ``'float32'`` (for cards
            with slow float64), the dtype of the normalisation and the term's
            arithmetic; the returned loss is float32 either way. Errors and
            costs: docs/gpu_clusters.md#the-regularisers-compute-dtype.
    """

    #: key under which :class:`~mmae_plugin.models.MMAE` logs the term.
    loss_name = 'loss_reg'

    def __init__(self,
                 gather: str = 'global',
                 loss_weight: float = 0.01,
                 init_cfg=None,
                 gather_capacity: Optional[int] = None,
                 compute_dtype: str = 'float64') -> None:
        super().__init__(init_cfg=check_init_cfg(init_cfg))
        self.compute_dtype = check_compute_dtype(compute_dtype)
        self.gather = check_gather_mode(gather)
        self.loss_weight = check_real(
            loss_weight, 'loss_weight', minimum=0, maximum=MAX_LOSS_WEIGHT)
        self.gather_capacity = check_capacity(gather_capacity)
        self._gatherer = RowGatherer(self.gather_capacity, 'features')
        #: Every rank's slot header of the last gather (device, int64).
        self._last_headers: Optional[Tensor] = None
        #: Device scalar (float32) of the last forward: why the term was
        #: skipped, 0 if it was applied.
        self.skip_code: Optional[Tensor] = None

    @abstractmethod
    def value(self, zn: Tensor, valid: Optional[Tensor] = None) -> Tensor:
        """The unweighted term on unit-norm rows ``zn`` (N, d).

        ``zn`` is in :attr:`compute_dtype`.

        Must read nothing on the host; may return NaN where its own
        numerics fail (the caller then skips the term).

        Args:
            zn: Unit rows; with ``valid``, the other rows are zero.
            valid: (N,) bool mask of the rows that count (gathered
                padding is not), or ``None``: all rows.
        """

    def forward(self, features: Tensor) -> Tensor:
        """Weighted regulariser of this batch of features.

        Args:
            features: (B, d) features of this rank; gathered per ``gather``.

        Returns:
            Scalar float32 loss (a zero when the step is skipped).
        """
        if self.gather == 'local' or not is_distributed():
            check_tensor(features, 'features', check_finite=False)
            return self._forward_rows(features)
        # No rank-local check before the collective: a rank raising alone
        # would leave the others waiting in it. Shapes and dtypes travel in
        # the gather's headers and are judged identically on every rank.
        if not isinstance(features, Tensor):
            raise TypeError('features must be a torch.Tensor, got '
                            f'{type(features).__name__}')
        gathered = self._gatherer(features, self.gather)
        if gathered is None:  # no rank has a row: the same on every rank
            self.skip_code = features.new_full((),
                                               SKIP_TOO_FEW_ROWS,
                                               dtype=torch.float32)
            return (features.sum() * 0.0).float()
        self._check_gathered_layout()
        self._last_headers = gathered.headers
        return self._forward_gathered(gathered)

    def _forward_rows(self, z: Tensor) -> Tensor:
        """The term on this rank's rows only (no gather)."""
        if z.shape[0] < 2:
            print_log(
                f'{type(self).__name__} skipped for this step: it needs at '
                f'least 2 samples in the (gathered) batch, got {z.shape[0]} '
                '(a last batch with drop_last=False?)',
                logger='current',
                level=logging.WARNING)
            self.skip_code = z.new_zeros((), dtype=torch.float32)
            return (z.sum() * 0.0).float()
        with torch.autocast(device_type=z.device.type, enabled=False):
            z = z.to(self.compute_dtype)
            magnitude = row_magnitudes(z)
            finite = torch.isfinite(magnitude).all()
            zero_row = (magnitude == 0).any()
            usable = finite & ~zero_row
            # Unusable rows are swapped for ones before any arithmetic, so
            # the skipped term has a finite, exactly zero gradient.
            zn = unit_rows_unchecked(
                torch.where(usable, z, 1.0),
                torch.where(usable, magnitude, 1.0))
            loss = (self.loss_weight * self.value(zn)).float()
            code = torch.where(
                ~finite, SKIP_NON_FINITE,
                torch.where(
                    zero_row, SKIP_ZERO_ROW,
                    torch.where(
                        torch.isfinite(loss), 0, SKIP_NON_FINITE_RESULT)))
            self.skip_code = code.float()
            return torch.where(code == 0, loss, 0.0)

    def _check_gathered_layout(self) -> None:
        """Refuse gathered rows that are not (B, d) floating point.

        The layout was agreed from every rank's header, so every rank
        raises here alike.
        """
        layout = self._gatherer.layout
        if len(layout.row_shape) != 1 or not layout.dtype.is_floating_point:
            raise ValueError(
                'features must be 2-D floating-point tensors (B, d) on every '
                f'rank, got rows of shape {layout.row_shape} and dtype '
                f'{layout.dtype}')

    def _forward_gathered(self, gathered: GatheredRows) -> Tensor:
        """The term on every rank's padded rows, masked on the device."""
        z, valid = gathered.rows, gathered.valid
        with torch.autocast(device_type=z.device.type, enabled=False):
            z = z.to(self.compute_dtype)
            magnitude = torch.where(valid, row_magnitudes(z), 1.0)
            finite = torch.isfinite(magnitude).all()
            zero_row = (magnitude == 0).any()
            enough = gathered.count >= 2
            usable = finite & ~zero_row & enough & ~gathered.refused
            # Padding and every row of a skipped step become zero before
            # any arithmetic: the term stays finite, its gradient exactly 0.
            keep = valid & usable
            zn = unit_rows_unchecked(
                torch.where(keep.unsqueeze(1), z, 1.0),
                torch.where(keep, magnitude, 1.0))
            zn = torch.where(keep.unsqueeze(1), zn, 0.0)
            loss = (self.loss_weight * self.value(zn, valid)).float()
            code = self._gathered_skip_code(gathered.refused, enough, finite,
                                            zero_row, loss)
            self.skip_code = code.float()
            return torch.where(code == 0, loss, 0.0)

    @staticmethod
    def _gathered_skip_code(*flags: Tensor) -> Tensor:
        """The :attr:`skip_code` of a gathered step, first reason first.

        Args:
            *flags: ``refused``, ``enough``, ``finite``, ``zero_row`` (device
                bools) and the weighted ``loss``.

        Returns:
            int64 device scalar.
        """
        refused, enough, finite, zero_row, loss = flags
        code = torch.where(torch.isfinite(loss), 0, SKIP_NON_FINITE_RESULT)
        code = torch.where(zero_row, SKIP_ZERO_ROW, code)
        code = torch.where(~finite, SKIP_NON_FINITE, code)
        code = torch.where(~enough, SKIP_TOO_FEW_ROWS, code)
        return torch.where(refused, SKIP_GATHER_REFUSED, code)

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
        if code == SKIP_TOO_FEW_ROWS:
            return (f'{name}: it needs at least 2 samples in the gathered '
                    'batch, got fewer (a last batch with drop_last=False, or '
                    'empty ranks?)')
        if code == SKIP_GATHER_REFUSED:
            return f'{name}: {self.gather_mismatch_message()}'
        return (f'{name}: the term is not finite or loss_weight='
                f'{self.loss_weight!r} times it overflows float32; use a '
                'smaller loss_weight')

    def gather_mismatch_message(self) -> str:
        """Why the last gather left some rank's rows out (reads its headers
        on the host: for the error path only)."""
        if self._last_headers is None:
            return 'no gather has run'
        return self._gatherer.mismatch_message(self._last_headers)

    def raise_if_skipped(self) -> None:
        """Raise the error behind a skipped last forward, for direct use.

        Reads :attr:`skip_code` on the host (one sync): call it outside the
        training step.
        """
        code = 0 if self.skip_code is None else int(self.skip_code)
        if code:
            raise ValueError(self.skip_reason(code))


def check_compute_dtype(compute_dtype) -> torch.dtype:
    """The torch dtype of a regulariser's ``compute_dtype``, validated.

    Args:
        compute_dtype: ``'float64'`` or ``'float32'`` (a config's string),
            or the torch dtype itself.

    Returns:
        ``torch.float64`` or ``torch.float32``.
    """
    if isinstance(compute_dtype, str) and compute_dtype in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[compute_dtype]
    if compute_dtype in (torch.float64, torch.float32):
        return compute_dtype
    raise ValueError(
        f'compute_dtype must be one of {tuple(COMPUTE_DTYPES)} (or the torch '
        f'dtype), got {compute_dtype!r}: half precision has no Cholesky '
        'kernel and loses the term')
