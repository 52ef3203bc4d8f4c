"""MMPretrain components: algorithms and losses, registered in ``MODELS``."""
from .algorithms import MMAE
from .losses import FeatureRegularizer, TCRLoss, UniformityLoss
from .utils import gather_features

__all__ = [
    'MMAE', 'FeatureRegularizer', 'TCRLoss', 'UniformityLoss',
    'gather_features'
]
