"""Low-shot linear probes: a fixed subset of k labels per class (pure torch).

The subset of a seed is drawn once from the training labels with numpy's
``RandomState(seed)``, per class in class order, so every arm of one seed
is probed on the same labelled images (the comparison stays paired) and a
resumed comparison draws the same subset. The probe standardises with the
moments of all training features (unlabelled data is free in this
protocol) and fits the same l2-regularised logistic regression as the
full-label probe on the k labelled rows per class.
"""
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from mmae_plugin.evaluation.linear_probe import (LinearProbe, feature_moments,
                                                 fit_logistic_regression,
                                                 standardize)
from mmae_plugin.utils.validation import check_int


def lowshot_indices(labels: Sequence[int], shots: int,
                    seed: int) -> np.ndarray:
    """Indices of ``shots`` rows of every class, fixed by ``seed``.

    Args:
        labels: Integer class labels of the training rows.
        shots: Labelled rows per class (>= 1).
        seed: Seed of the draw (the run's seed).

    Returns:
        Sorted int64 indices, ``shots`` per class present in ``labels``.

    Raises:
        TypeError: If ``shots`` is not an integer.
        ValueError: If ``shots`` < 1 or a class has fewer than ``shots``
            rows.
    """
    check_int(shots, 'shots', minimum=1)
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.RandomState(seed)
    chosen = []
    for cls in np.unique(labels):
        rows = np.flatnonzero(labels == cls)
        if rows.size < shots:
            raise ValueError(
                f'shots={shots} but class {int(cls)} has only {rows.size} '
                'training rows')
        chosen.append(rng.choice(rows, size=shots, replace=False))
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def fit_lowshot_probe(train_x: Tensor,
                      train_y: Tensor,
                      indices: np.ndarray,
                      num_classes: int,
                      weight_decay: float = 1e-4) -> LinearProbe:
    """A linear probe fitted on the rows ``indices`` only.

    Args:
        train_x: All training features (N, d) (their moments standardise).
        train_y: All training labels (N,).
        indices: The labelled rows (see :func:`lowshot_indices`).
        num_classes: Number of classes.
        weight_decay: L2 coefficient of the classifier weights.

    Returns:
        The fitted :class:`LinearProbe`.
    """
    mean, var = feature_moments(train_x)
    rows = torch.as_tensor(indices, device=train_x.device)
    head = fit_logistic_regression(
        standardize(train_x[rows], mean, var), train_y[rows], num_classes,
        weight_decay)
    return LinearProbe(mean, var, head)
