"""Data preprocessors registered in mmpretrain's ``MODELS``."""
from .batch_flip import BatchFlipDataPreprocessor

__all__ = ['BatchFlipDataPreprocessor']
