"""MMPretrain components (algorithms, losses, necks, classifiers), registered
in ``MODELS``."""
from .algorithms import MMAE
from .classifiers import KNNClassifier
from .data_preprocessors import (BatchFlipDataPreprocessor,
                                 NonBlockingClsDataPreprocessor,
                                 NonBlockingSelfSupDataPreprocessor)
from .losses import FeatureRegularizer, TCRLoss, UniformityLoss
from .necks import TokenPoolingNeck
from .utils import gather_features

__all__ = [
    'MMAE', 'BatchFlipDataPreprocessor', 'KNNClassifier',
    'NonBlockingClsDataPreprocessor', 'NonBlockingSelfSupDataPreprocessor',
    'FeatureRegularizer', 'TCRLoss', 'TokenPoolingNeck', 'UniformityLoss',
    'gather_features'
]
