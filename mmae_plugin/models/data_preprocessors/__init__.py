"""Data preprocessors registered in mmpretrain's ``MODELS``."""
from .batch_flip import BatchFlipDataPreprocessor
from .non_blocking import (NonBlockingClsDataPreprocessor,
                           NonBlockingSelfSupDataPreprocessor, bgr_rgb_swap,
                           copy_to_device)

__all__ = [
    'BatchFlipDataPreprocessor', 'NonBlockingClsDataPreprocessor',
    'NonBlockingSelfSupDataPreprocessor', 'bgr_rgb_swap', 'copy_to_device'
]
