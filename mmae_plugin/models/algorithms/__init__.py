from .mmae import FEATURES, MMAE, SKIP_KEY
from .spectral_contrastive import SpectralContrastive

__all__ = ['FEATURES', 'MMAE', 'SKIP_KEY', 'SpectralContrastive']
