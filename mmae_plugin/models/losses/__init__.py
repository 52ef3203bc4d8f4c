from .feature_regularizer import FeatureRegularizer
from .spectral_contrastive_loss import SpectralContrastiveLoss
from .tcr_loss import TCR_FORMS, TCRLoss
from .uniformity_loss import UniformityLoss

__all__ = [
    'FeatureRegularizer', 'SpectralContrastiveLoss', 'TCRLoss', 'TCR_FORMS',
    'UniformityLoss'
]
