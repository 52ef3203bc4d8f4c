"""Probes of frozen mosaic features (pure torch and numpy).

On one feature vector per mosaic
(:class:`~mmae_plugin.datasets.FashionMNISTMosaic`): the **local** reading
(per cell, a full-label and low-shot linear probe of the cell's class), the
**rank** reading (the same on the top-``k`` principal components) and the
**global** reading (which classes the mosaic contains, one binary probe per
class, balanced accuracy). The study: docs/mosaic.md.
"""
from typing import Dict, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .linear_probe import (feature_moments, fit_linear_probe,
                           fit_logistic_regression, standardize)
from .lowshot import fit_lowshot_probe, lowshot_indices

#: Principal subspaces probed (those up to the feature width).
PCA_DIMS = (2, 4, 8, 16, 32, 64, 128)
#: Low-shot draws averaged per cell.
LOWSHOT_DRAWS = 20


def probe_top1(probe, features: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy (%) of a fitted probe."""
    predicted = probe.logits(features).argmax(dim=1)
    return 100.0 * (predicted == labels.to(
        predicted.device)).double().mean().item()


def principal_components(train_x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Mean, components and variances of the training features, float64.

    Args:
        train_x: (N, d) features.

    Returns:
        ``(mean (d,), components (d, d) as columns, variances (d,))``,
        variances in decreasing order.
    """
    x = train_x.double()
    mean = x.mean(dim=0)
    centred = x - mean
    cov = centred.T @ centred / x.shape[0]
    variances, components = torch.linalg.eigh(cov)
    order = variances.argsort(descending=True)
    return mean, components[:, order], variances[order]


def project(x: Tensor, mean: Tensor, components: Tensor, k: int) -> Tensor:
    """Coordinates (N, k) of ``x`` on the first ``k`` components."""
    return (x.double() - mean) @ components[:, :k]


def cell_probe_top1(train_x: Tensor, train_cells: Tensor, test_x: Tensor,
                    test_cells: Tensor, num_classes: int,
                    weight_decay: float) -> np.ndarray:
    """Full-label linear probe accuracy (%) of every cell.

    Args:
        train_x: (N, d) training features.
        train_cells: (N, cells) classes of the training mosaics.
        test_x: (M, d) test features.
        test_cells: (M, cells) classes of the test mosaics.
        num_classes: Classes per cell.
        weight_decay: L2 coefficient of the probes.

    Returns:
        (cells,) accuracies.
    """
    return np.array([
        probe_top1(
            fit_linear_probe(train_x, train_cells[:, c], num_classes,
                             weight_decay), test_x, test_cells[:, c])
        for c in range(train_cells.shape[1])
    ])


def lowshot_cell_top1(train_x: Tensor, train_cells: Tensor, test_x: Tensor,
                      test_cells: Tensor, num_classes: int, shots: int,
                      seed: int, draws: int,
                      weight_decay: float) -> np.ndarray:
    """Low-shot probe accuracy (%) of every cell, averaged over draws.

    Draw ``j`` of cell ``c`` takes ``shots`` training mosaics per class of
    that cell with :func:`~.lowshot.lowshot_indices` under the seed
    ``1000 * seed + j``: every arm of one seed is probed on the same rows.

    Returns:
        (cells,) accuracies, each the mean of ``draws`` probes.
    """
    cells = train_cells.shape[1]
    labels = train_cells.cpu().numpy()
    result = np.zeros(cells)
    for c in range(cells):
        for draw in range(draws):
            rows = lowshot_indices(labels[:, c], shots, 1000 * seed + draw)
            probe = fit_lowshot_probe(train_x, train_cells[:, c], rows,
                                      num_classes, weight_decay)
            result[c] += probe_top1(probe, test_x, test_cells[:, c]) / draws
    return result


def presence(cells: Tensor, num_classes: int) -> Tensor:
    """(N, num_classes) bool: whether each class occurs in the mosaic."""
    found = torch.zeros(cells.shape[0], num_classes, dtype=torch.bool)
    found[torch.arange(cells.shape[0])[:, None], cells.long().cpu()] = True
    return found


def balanced_accuracy(predicted: Tensor, truth: Tensor) -> float:
    """Mean of the true-positive and true-negative rates (%); a rate whose
    class is absent is left out."""
    rates = [(predicted[truth == value] == value).double().mean().item()
             for value in (True, False) if (truth == value).any()]
    return 100.0 * sum(rates) / len(rates)


def presence_balanced_top1(train_x: Tensor, train_cells: Tensor,
                           test_x: Tensor, test_cells: Tensor,
                           num_classes: int,
                           weight_decay: float) -> np.ndarray:
    """Balanced accuracy (%) of one binary probe per class: "does the
    mosaic contain this class?" (standardised features, as every probe).

    Returns:
        (num_classes,) balanced accuracies; a class that no training or no
        test mosaic contains (or every one does) gives NaN.
    """
    moments = feature_moments(train_x)
    train_z = standardize(train_x, *moments)
    test_z = standardize(test_x, *moments)
    train_found = presence(train_cells, num_classes)
    test_found = presence(test_cells, num_classes)
    result = np.full(num_classes, np.nan)
    for cls in range(num_classes):
        target, truth = train_found[:, cls], test_found[:, cls]
        if target.all() or not target.any() or truth.all() or \
                not truth.any():
            continue
        head = fit_logistic_regression(train_z, target.long(), 2, weight_decay)
        with torch.no_grad():
            predicted = head(test_z).argmax(dim=1).cpu().bool()
        result[cls] = balanced_accuracy(predicted, truth)
    return result


def mosaic_metrics(train_x: Tensor,
                   train_cells: Tensor,
                   test_x: Tensor,
                   test_cells: Tensor,
                   seed: int,
                   num_classes: int = 10,
                   shots: Sequence[int] = (10, ),
                   draws: int = LOWSHOT_DRAWS,
                   pca_dims: Sequence[int] = PCA_DIMS,
                   weight_decay: float = 1e-4) -> Dict[str, float]:
    """Every reading of one pooling's features.

    Args:
        train_x: (N, d) features of the training mosaics.
        train_cells: (N, cells) their cell classes.
        test_x: (M, d) features of the test mosaics.
        test_cells: (M, cells) their cell classes.
        seed: The run's seed (fixes the low-shot draws).
        num_classes: Classes per cell.
        shots: Labels per class of the low-shot probes.
        draws: Low-shot draws averaged per cell.
        pca_dims: Principal subspaces probed (those <= d).
        weight_decay: L2 coefficient of every probe.

    Returns:
        ``cell_linear_top1`` (mean over cells) and ``cell<c>_linear_top1``;
        ``cell_lowshot<k>_top1``; ``pca<k>_cell_linear_top1``;
        ``presence_balanced_top1`` (mean over classes); ``erank_cov`` and
        the other statistics of
        :func:`~mmae_plugin.evaluation.statistics.representation_statistics`
        on the test features under ``repr/``.
    """
    from .statistics import representation_statistics
    train_x, test_x = train_x.double(), test_x.double()
    train_cells, test_cells = train_cells.long(), test_cells.long()
    per_cell = cell_probe_top1(train_x, train_cells, test_x, test_cells,
                               num_classes, weight_decay)
    metrics = {'cell_linear_top1': float(per_cell.mean())}
    metrics.update({
        f'cell{c}_linear_top1': float(value)
        for c, value in enumerate(per_cell)
    })
    for shot in shots:
        low = lowshot_cell_top1(train_x, train_cells, test_x, test_cells,
                                num_classes, shot, seed, draws, weight_decay)
        metrics[f'cell_lowshot{shot}_top1'] = float(low.mean())
    mean, components, _ = principal_components(train_x)
    for k in [k for k in pca_dims if k <= train_x.shape[1]]:
        values = cell_probe_top1(
            project(train_x, mean, components, k), train_cells,
            project(test_x, mean, components, k), test_cells, num_classes,
            weight_decay)
        metrics[f'pca{k}_cell_linear_top1'] = float(values.mean())
    found = presence_balanced_top1(train_x, train_cells, test_x, test_cells,
                                   num_classes, weight_decay)
    metrics['presence_balanced_top1'] = float(np.nanmean(found))
    metrics.update({
        f'repr/{key}': value
        for key, value in representation_statistics(test_x).items()
    })
    return metrics
