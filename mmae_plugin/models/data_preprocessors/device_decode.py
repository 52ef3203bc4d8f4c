"""Decode, crop, resize and flip a batch of JPEGs on the model's device.

The preprocessor half of the GPU-decoding option (the worker's half is
:class:`mmae_plugin.datasets.PackEncodedJpeg`, which see). Not used by the
recipes; ``docs/gpu_clusters.md`` says when and how to switch to it.
"""
from typing import List, Optional, Sequence, Union

import torch
from mmpretrain.registry import MODELS
from torch import Tensor

from mmae_plugin.utils.validation import check_choice
from .non_blocking import NonBlockingSelfSupDataPreprocessor, bgr_rgb_swap

__all__ = ['DeviceJpegDataPreprocessor', 'decode_crop_batch']

INTERPOLATIONS = ('bilinear', 'bicubic')


def decode_crop_batch(inputs: Sequence[Tensor],
                      samples: Sequence,
                      size: int,
                      device: torch.device,
                      interpolation: str = 'bicubic') -> Tensor:
    """The batch's (B, 3, size, size) uint8 RGB crops on ``device``.

    Encoded JPEGs (1-D uint8) are decoded together by
    ``torchvision.io.decode_jpeg`` on ``device`` (nvJPEG on a GPU), then
    each is cut to its ``crop_box``, resized (antialiased) and flipped
    there; inputs already cropped on the CPU are copied as they are.

    Args:
        inputs: Per image, encoded bytes or a (3, size, size) crop.
        samples: Their data samples (``crop_box``, ``flip``, ``encoded``).
        size: Side of the output.
        device: Where to decode.
        interpolation: ``'bicubic'`` (the recipe's) or ``'bilinear'``.

    Returns:
        uint8 tensor (B, 3, size, size), RGB.
    """
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F
    mode = InterpolationMode(interpolation)
    encoded = [i for i, s in enumerate(samples) if s.metainfo['encoded']]
    decoded = decode_jpeg([inputs[i] for i in encoded],
                          mode=ImageReadMode.RGB, device=device) \
        if encoded else []
    images = dict(zip(encoded, decoded))
    crops: List[Tensor] = []
    for index, sample in enumerate(samples):
        if index not in images:
            crops.append(inputs[index].to(device, non_blocking=True))
            continue
        top, left, height, width = sample.metainfo['crop_box']
        crop = F.resized_crop(
            images[index],
            top,
            left,
            height,
            width, [size, size],
            interpolation=mode,
            antialias=True)
        crops.append(crop.flip(-1) if sample.metainfo['flip'] else crop)
    return torch.stack(crops)


@MODELS.register_module()
class DeviceJpegDataPreprocessor(NonBlockingSelfSupDataPreprocessor):
    """Decode and crop on the device, then normalise as the recipe does.

    Takes batches of :class:`~mmae_plugin.datasets.PackEncodedJpeg` through
    ``pseudo_collate``. The decoder gives RGB; the model sees the channel
    order it sees with the recipe's pipeline (OpenCV's BGR, swapped to RGB
    by ``to_rgb=True`` / ``bgr_to_rgb=True``): RGB with either set, BGR with
    neither. ``mean`` and ``std`` are in that order, as in the recipe.

    Args:
        size: Side of the crops (the recipe's 224).
        interpolation: ``'bicubic'`` (the recipe's) or ``'bilinear'``.
        mean, std, to_rgb, bgr_to_rgb, non_blocking: As in
            :class:`NonBlockingSelfSupDataPreprocessor`.
    """

    def __init__(self,
                 size: int = 224,
                 interpolation: str = 'bicubic',
                 mean: Optional[Sequence[Union[float, int]]] = None,
                 std: Optional[Sequence[Union[float, int]]] = None,
                 to_rgb: bool = False,
                 bgr_to_rgb: bool = False,
                 non_blocking: Optional[bool] = True) -> None:
        check_choice(interpolation, 'interpolation', INTERPOLATIONS)
        super().__init__(
            mean=mean,
            std=std,
            to_rgb=to_rgb,
            bgr_to_rgb=bgr_to_rgb,
            non_blocking=non_blocking)
        self.size = int(size)
        self.interpolation = interpolation
        # The recipe's model sees RGB exactly when it swaps OpenCV's BGR.
        self._model_wants_bgr = not self._channel_conversion

    def forward(self, data: dict, training: bool = False) -> dict:
        """Decode, crop, normalise a ``pseudo_collate`` batch.

        Args:
            data: ``dict(inputs=[...], data_samples=[...])``.
            training: Unused (the crops were drawn by the workers).

        Returns:
            ``dict(inputs=(B, 3, size, size) float, data_samples=...)``.
        """
        if not isinstance(data, dict) or not isinstance(
                data.get('inputs'), (list, tuple)):
            raise TypeError('DeviceJpegDataPreprocessor takes the batches of '
                            'PackEncodedJpeg through pseudo_collate (a dict '
                            'with a list of inputs)')
        samples = data['data_samples']
        batch = decode_crop_batch(data['inputs'], samples, self.size,
                                  self.device, self.interpolation)
        if self._model_wants_bgr:
            batch = bgr_rgb_swap(batch)
        return {
            'inputs': self._normalise(batch),
            'data_samples': self.cast_data(samples)
        }
