from .mmae import FEATURES, MMAE, SKIP_KEY

__all__ = ['FEATURES', 'MMAE', 'SKIP_KEY']
