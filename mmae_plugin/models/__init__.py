"""MMPretrain components: algorithms and losses, registered in ``MODELS``."""
from .algorithms import MMAE
from .classifiers import KNNClassifier
from .data_preprocessors import BatchFlipDataPreprocessor
from .losses import FeatureRegularizer, TCRLoss, UniformityLoss
from .utils import gather_features

__all__ = [
    'MMAE', 'BatchFlipDataPreprocessor', 'KNNClassifier',
    'FeatureRegularizer', 'TCRLoss', 'UniformityLoss', 'gather_features'
]
