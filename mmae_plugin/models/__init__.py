"""MMPretrain components: algorithms and losses, registered in ``MODELS``."""
from .algorithms import MMAE
from .classifiers import KNNClassifier
from .losses import FeatureRegularizer, TCRLoss, UniformityLoss
from .utils import gather_features

__all__ = [
    'MMAE', 'KNNClassifier', 'FeatureRegularizer', 'TCRLoss', 'UniformityLoss',
    'gather_features'
]
