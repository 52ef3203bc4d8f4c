"""Data preprocessors registered in mmpretrain's ``MODELS``."""
from .batch_flip import BatchFlipDataPreprocessor
from .device_decode import DeviceJpegDataPreprocessor, decode_crop_batch
from .non_blocking import (NonBlockingClsDataPreprocessor,
                           NonBlockingSelfSupDataPreprocessor, bgr_rgb_swap,
                           copy_to_device)

__all__ = [
    'BatchFlipDataPreprocessor', 'DeviceJpegDataPreprocessor',
    'NonBlockingClsDataPreprocessor', 'NonBlockingSelfSupDataPreprocessor',
    'bgr_rgb_swap', 'copy_to_device', 'decode_crop_batch'
]
