from .feature_regularizer import FeatureRegularizer
from .tcr_loss import TCR_FORMS, TCRLoss
from .uniformity_loss import UniformityLoss

__all__ = ['FeatureRegularizer', 'TCRLoss', 'TCR_FORMS', 'UniformityLoss']
