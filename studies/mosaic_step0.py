"""Step 0 of the mosaic study, on existing checkpoints: is Fashion-MNIST's
10-class task rank-limited, and does whitening MAE's features do what
M-MAE does?

For each checkpoint: the frozen CLS and mean-token features of all 60,000
training and 10,000 test images (``configs/fashion_mnist/
knn_fmnist_clsmean.py``), the linear probe on the features as they are, on
their top-k principal components (k = 2 ... d; the probe standardises each
component, so k = d is the probe of the fully whitened features), and the
effective rank ``erank_cov`` of the test features. One label per image is
one cell, so the probes are those of :mod:`mmae_plugin.evaluation.mosaic`.
"""
import json
from typing import Dict, Sequence

from mmae_plugin.evaluation.mosaic import (PCA_DIMS, cell_probe_top1,
                                           principal_components, project)
from mmae_plugin.evaluation.statistics import representation_statistics

EVAL_CONFIG = 'configs/fashion_mnist/knn_fmnist_clsmean.py'


def pooling_readings(train_x,
                     train_y,
                     test_x,
                     test_y,
                     weight_decay: float = 1e-4) -> Dict[str, float]:
    """Plain and top-k probe accuracies and ``erank_cov`` of one pooling.

    Returns:
        ``linear_top1``, ``pca<k>_linear_top1`` for every k <= d in
        :data:`PCA_DIMS`, and ``erank_cov``.
    """
    train_x, test_x = train_x.double(), test_x.double()
    train_cells, test_cells = train_y[:, None], test_y[:, None]
    readings = {
        'linear_top1':
        float(
            cell_probe_top1(train_x, train_cells, test_x, test_cells, 10,
                            weight_decay)[0])
    }
    mean, components, _ = principal_components(train_x)
    for k in [k for k in PCA_DIMS if k <= train_x.shape[1]]:
        readings[f'pca{k}_linear_top1'] = float(
            cell_probe_top1(
                project(train_x, mean, components, k), train_cells,
                project(test_x, mean, components, k), test_cells, 10,
                weight_decay)[0])
    readings['erank_cov'] = representation_statistics(test_x)['erank_cov']
    return readings


def checkpoint_readings(
    checkpoint: str, poolings: Sequence[str] = ('cls', 'mean')
) -> Dict[str, Dict[str, float]]:
    """:func:`pooling_readings` of each pooling of a checkpoint."""
    from mmae_compare.protocol import checkpoint_features, split_poolings
    model, train_x, train_y, test_x, test_y = checkpoint_features(
        EVAL_CONFIG, checkpoint)
    train = split_poolings(train_x, model.pooling, poolings)
    test = split_poolings(test_x, model.pooling, poolings)
    return {
        name: pooling_readings(train[name], train_y, test[name], test_y)
        for name in poolings
    }


def markdown_table(results: Dict[str, Dict[str, Dict[str, float]]],
                   pooling: str) -> str:
    """One row per checkpoint: erank, the plain probe, the top-k probes."""
    any_result = next(iter(results.values()))[pooling]
    dims = [k for k in PCA_DIMS if f'pca{k}_linear_top1' in any_result]
    header = ['encoder', 'erank_cov', 'probe'] + [f'top-{k}' for k in dims]
    lines = [
        '| ' + ' | '.join(header) + ' |',
        '|' + '---|' * len(header),
    ]
    for name, readings in results.items():
        r = readings[pooling]
        cells = [name, f"{r['erank_cov']:.1f}", f"{r['linear_top1']:.2f}"]
        cells += [f"{r[f'pca{k}_linear_top1']:.2f}" for k in dims]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def write_json(path: str, results) -> None:
    with open(path, 'w') as f:
        json.dump(results, f, indent=1)
        f.write('\n')
