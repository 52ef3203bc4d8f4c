from .mmae import FEATURES, MMAE

__all__ = ['FEATURES', 'MMAE']
