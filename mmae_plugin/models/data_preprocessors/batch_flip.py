"""Random flips of the whole batch in the data preprocessor."""
from typing import Optional

import torch
from mmengine.structures import BaseDataElement
from mmpretrain.registry import MODELS

from mmae_plugin.utils.validation import check_choice, check_real
from .non_blocking import NonBlockingSelfSupDataPreprocessor, copy_to_device

FLIP_DIRECTIONS = {'horizontal': -1, 'vertical': -2}


@MODELS.register_module()
class BatchFlipDataPreprocessor(NonBlockingSelfSupDataPreprocessor):
    """``SelfSupDataPreprocessor`` that also flips images at random.

    Replaces the per-sample ``RandomFlip`` of the pipeline by one batched
    ``torch.where`` after normalisation (with which it commutes exactly): each
    training image is flipped with probability ``flip_prob``, drawn on the CPU
    from torch's generator (reseeded by ``ReseedHook``, so resume stays exact)
    and copied to the device without blocking. Evaluation batches are not
    flipped; on the CPU the data samples are passed through as they come.
    See docs/performance.md#the-components.

    Args:
        flip_prob: Probability in [0, 1] of flipping each image.
        direction: ``'horizontal'`` (mirror left-right) or ``'vertical'``.
        non_blocking: Copy batches to the device without blocking the host
            (default True; effective with the dataloader's
            ``pin_memory=True``).
        **kwargs: The normalisation arguments of
            :class:`NonBlockingSelfSupDataPreprocessor` (``mean``, ``std``,
            ``pad_size_divisor``, ``pad_value``, ``to_rgb``, ``bgr_to_rgb``,
            ``rgb_to_bgr``), passed on as they are.
    """

    def __init__(self,
                 flip_prob: float = 0.5,
                 direction: str = 'horizontal',
                 *,
                 non_blocking: Optional[bool] = True,
                 **kwargs) -> None:
        flip_prob = check_real(flip_prob, 'flip_prob', minimum=0, maximum=1)
        check_choice(direction, 'direction', tuple(FLIP_DIRECTIONS))
        super().__init__(non_blocking=non_blocking, **kwargs)
        self.flip_prob = flip_prob
        self.direction = direction

    def cast_data(self, data):
        """Move data to the device; CPU data elements stay as they are."""
        if self._device.type == 'cpu' and isinstance(
                data, (list, tuple)) and data and all(
                    isinstance(item, BaseDataElement) for item in data):
            return data
        return super().cast_data(data)

    def flip(self, inputs: torch.Tensor) -> torch.Tensor:
        """Flip each image of ``inputs`` (B, C, H, W) with ``flip_prob``."""
        if self.flip_prob == 0:
            return inputs  # no draw: the random stream is left untouched
        chosen = copy_to_device(
            torch.rand(inputs.shape[0]) < self.flip_prob, inputs.device)
        chosen = chosen.view(-1, *([1] * (inputs.dim() - 1)))
        flipped = inputs.flip(FLIP_DIRECTIONS[self.direction])
        return torch.where(chosen, flipped, inputs)

    def forward(self, data: dict, training: bool = False) -> dict:
        """Normalise as the parent does, then flip training batches.

        Args:
            data: Batch from ``default_collate``.
            training: Flip only when True.

        Returns:
            ``dict(inputs=..., data_samples=...)``.
        """
        data = super().forward(data, training)
        if training:
            inputs = data['inputs']
            data['inputs'] = [self.flip(view) for view in inputs] \
                if isinstance(inputs, list) else self.flip(inputs)
        return data
