from .spectral_contrastive_head import SpectralContrastiveHead

__all__ = ['SpectralContrastiveHead']
