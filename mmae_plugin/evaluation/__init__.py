"""Evaluation of frozen representations: kNN, cached linear probe, statistics.

``knn``, ``linear_probe`` and ``statistics`` are plain PyTorch;
``metrics`` registers :class:`RepresentationStatistics` with mmpretrain.
"""
from .frozen import (evaluate_frozen_encoder, extract_features,
                     linear_probe_state_dict)
from .knn import NeighbourBank, knn_class_scores, top_k_neighbours
from .linear_probe import LinearProbe, fit_linear_probe
from .metrics import RepresentationStatistics
from .statistics import representation_statistics

__all__ = [
    'evaluate_frozen_encoder', 'extract_features', 'linear_probe_state_dict',
    'knn_class_scores', 'NeighbourBank', 'top_k_neighbours',
    'fit_linear_probe', 'LinearProbe', 'RepresentationStatistics',
    'representation_statistics'
]
