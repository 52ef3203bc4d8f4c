"""Data preprocessors whose batch copy does not block the host.

:class:`NonBlockingSelfSupDataPreprocessor` and
:class:`NonBlockingClsDataPreprocessor` give mmpretrain's output bit for
bit, with a ``non_blocking=True`` batch copy (effective with the
dataloader's ``pin_memory=True``), the BGR -> RGB swap as a ``torch.flip``
on the device, the self-supervised data samples left where they are, and
the labels and Mixup / CutMix permutation copied in one pinned,
non-blocking copy. The ImageNet recipes use them::

    data_preprocessor = dict(type='NonBlockingSelfSupDataPreprocessor', ...)

Why: docs/gpu_clusters.md#feeding-the-gpu-workers-pinned-memory-cores-per-gpu
"""
from typing import List, Optional, Sequence, Union

import torch
from mmpretrain.models.utils import (ClsDataPreprocessor,
                                     SelfSupDataPreprocessor)
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from mmpretrain.structures.utils import cat_batch_labels, tensor_split
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = [
    'NonBlockingSelfSupDataPreprocessor', 'NonBlockingClsDataPreprocessor',
    'bgr_rgb_swap', 'copy_to_device'
]


def copy_to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``, copied without the host waiting.

    To a GPU the tensor is staged in pinned memory first (a copy from
    pageable memory is staged synchronously by CUDA whatever
    ``non_blocking`` says); torch's pinned-memory allocator keeps the
    staging buffer until the copy has run.

    Args:
        tensor: A host (or already device) tensor.
        device: Where it is needed.

    Returns:
        ``tensor`` itself if it is on ``device``, else the queued copy.
    """
    if tensor.device == torch.device(device):
        return tensor
    if torch.device(device).type == 'cuda' and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class HostDrawsToDevice(TorchFunctionMode):
    """Within it, ``torch.randperm`` draws on the CPU as always (the same
    generator, the same numbers) and returns the permutation copied to
    ``device`` with :func:`copy_to_device`.

    mmpretrain's Mixup and CutMix index the device batch with that
    permutation; a CPU index would be copied there with a blocking copy.
    Used around mmpretrain's preprocessing only, never process-wide.

    Args:
        device: The preprocessor's device.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func is torch.randperm and kwargs.get('device') is None:
            return copy_to_device(result, self.device)
        return result


def bgr_rgb_swap(batch: Tensor) -> Tensor:
    """Reverse the channel order of a (B, 3, H, W) batch on its device.

    Equal, element for element, to ``batch[:, [2, 1, 0]]`` without the
    index tensor that indexing with a list creates on the host.

    Args:
        batch: Images (B, C, H, W) with C == 3.

    Returns:
        A new tensor with channels 2, 1, 0.

    Raises:
        ValueError: If the batch does not have 3 channels.
    """
    if batch.dim() < 2 or batch.shape[1] != 3:
        raise ValueError('the BGR <-> RGB swap needs batches of 3-channel '
                         f'images (B, 3, H, W), got shape {tuple(batch.shape)}'
                         '; set to_rgb=False for other channel counts')
    return batch.flip(1)


@MODELS.register_module()
class NonBlockingSelfSupDataPreprocessor(SelfSupDataPreprocessor):
    """``SelfSupDataPreprocessor`` with a non-blocking copy and an on-device
    channel swap.

    The inputs equal mmpretrain's ``SelfSupDataPreprocessor``'s with the
    same arguments bit for bit: the same copy, the channel swap as
    :func:`bgr_rgb_swap` (``torch.flip``) instead of ``[:, [2, 1, 0]]``,
    then the conversion to float and the normalisation in the same order.
    The data samples are returned as they came unless
    ``move_data_samples=True``.

    Args:
        mean, std, pad_size_divisor, pad_value, to_rgb, bgr_to_rgb,
            rgb_to_bgr: As in mmpretrain's ``SelfSupDataPreprocessor``.
        non_blocking: Copy batches to the device without blocking the host
            (default True; effective with the dataloader's
            ``pin_memory=True``).
        move_data_samples: Also move the data samples to the device, as
            mmpretrain does (default False: no algorithm of the plugin's
            configs reads them; set True for one whose ``loss()`` reads
            tensors from them, such as mmpretrain's SimMIM, BEiT, CAE or
            MaskFeat masks).
    """

    def __init__(self,
                 mean: Optional[Sequence[Union[float, int]]] = None,
                 std: Optional[Sequence[Union[float, int]]] = None,
                 pad_size_divisor: int = 1,
                 pad_value: Union[float, int] = 0,
                 to_rgb: bool = False,
                 bgr_to_rgb: bool = False,
                 rgb_to_bgr: bool = False,
                 non_blocking: Optional[bool] = True,
                 move_data_samples: bool = False) -> None:
        super().__init__(
            mean=mean,
            std=std,
            pad_size_divisor=pad_size_divisor,
            pad_value=pad_value,
            to_rgb=to_rgb,
            bgr_to_rgb=bgr_to_rgb,
            rgb_to_bgr=rgb_to_bgr,
            non_blocking=non_blocking)
        self._move_data_samples = bool(move_data_samples)

    def _normalise(self, batch: Tensor) -> Tensor:
        """Float, then ``(batch - mean) / std`` if mean and std are set.

        The one normalisation of this class and its subclasses (mmpretrain's
        order: convert to float first).
        """
        batch = batch.float()
        if self._enable_normalize:
            batch = (batch - self.mean) / self.std
        return batch

    def _convert(self, batch: Tensor) -> Tensor:
        """Channel swap (if set), float, normalisation (if set)."""
        if self._channel_conversion:
            batch = bgr_rgb_swap(batch)
        return self._normalise(batch)

    def forward(self, data: dict, training: bool = False) -> dict:
        """Copy a collated batch to the device and normalise it.

        Args:
            data: ``dict(inputs=..., data_samples=...)`` from
                ``default_collate``; ``inputs`` a (B, C, H, W) tensor or a
                list of them (one per view).
            training: Unused (kept for the preprocessor interface).

        Returns:
            ``dict(inputs=..., data_samples=...)``: the inputs on the
            device, the data samples there only with ``move_data_samples``.
        """
        if not isinstance(data, dict):
            raise TypeError('NonBlockingSelfSupDataPreprocessor needs the '
                            "dataloader's default_collate (a dict), got "
                            f'{type(data).__name__}')
        inputs = self.cast_data(data['inputs'])
        data_samples = data.get('data_samples')
        if self._move_data_samples:
            data_samples = self.cast_data(data_samples)
        if isinstance(inputs, list):
            converted: Union[Tensor, List[Tensor]] = [
                self._convert(view) for view in inputs
            ]
        else:
            converted = self._convert(inputs)
        return {'inputs': converted, 'data_samples': data_samples}


@MODELS.register_module()
class NonBlockingClsDataPreprocessor(ClsDataPreprocessor):
    """``ClsDataPreprocessor`` whose image copy does not block the host.

    The images are copied with ``non_blocking``; the labels, and in training
    batches the Mixup / CutMix permutation drawn on the CPU, go to the device
    in one pinned, non-blocking copy before mmpretrain's code runs
    (:class:`HostDrawsToDevice`). Everything else is mmpretrain's, so the
    output is the same bit for bit.

    Args:
        non_blocking: Copy the images without blocking the host (default
            True; effective with the dataloader's ``pin_memory=True``).
        **kwargs: mmpretrain's ``ClsDataPreprocessor`` arguments.
    """

    def __init__(self, non_blocking: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self._non_blocking = bool(non_blocking)

    def forward(self, data: dict, training: bool = False) -> dict:
        """mmpretrain's preprocessing with the labels already on the device
        and Mixup / CutMix's permutation copied there without blocking.

        Args:
            data: Batch from the dataloader's collate function.
            training: Apply the batch augmentations.

        Returns:
            ``dict(inputs=..., data_samples=...)`` on the device.
        """
        self._labels_to_device(data.get('data_samples'))
        if training and self.batch_augments is not None:
            with HostDrawsToDevice(self.device):
                return super().forward(data, training)
        return super().forward(data, training)

    def _labels_to_device(self, data_samples) -> None:
        """Give every data sample its ``gt_label`` on the device, from one
        non-blocking copy of the batch's labels."""
        if not data_samples or not isinstance(data_samples[0], DataSample) \
                or 'gt_label' not in data_samples[0]:
            return
        labels, splits = cat_batch_labels(
            [sample.gt_label for sample in data_samples])
        labels = copy_to_device(labels, self.device)
        for sample, label in zip(data_samples, tensor_split(labels, splits)):
            sample.set_gt_label(label)
