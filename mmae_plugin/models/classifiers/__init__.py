from .knn_classifier import KNNClassifier

__all__ = ['KNNClassifier']
