"""Linear classifier on cached frozen features (pure torch).

The linear-probe configs' classifier (affine-free BatchNorm + Linear) fitted
on features computed once: standardise each feature with the training-set
mean and variance, then fit l2-regularised multinomial logistic regression
with L-BFGS to convergence (seconds, deterministic). Loss and gradient are
summed over chunks of :data:`PROBE_CHUNK` rows, so memory beyond the
features stays below 1 GiB at ImageNet scale. See
docs/evaluation.md#cached-feature-linear-probe-and-statistics.
"""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: BatchNorm's eps in mmpretrain's ClsBatchNormNeck.
BN_EPS = 1e-6
#: Feature rows standardised, converted and classified at once.
PROBE_CHUNK = 16384
#: Up to this many bytes of float64 rows, the standardised chunks are kept
#: between L-BFGS evaluations instead of converted again for each (the
#: same values, so the same fit, in about two thirds of the time).
CONVERTED_BYTES = 1 << 30


class LinearProbe(NamedTuple):
    """A fitted probe: ``head((x - mean) / sqrt(var + BN_EPS))``."""
    mean: Tensor
    var: Tensor
    head: torch.nn.Linear

    def logits(self, features: Tensor) -> Tensor:
        """Class logits (N, C) of raw features (N, d)."""
        with torch.no_grad():
            return self.head(standardize(features, self.mean, self.var))

    def top_k_classes(self, features: Tensor, k: int = 1) -> Tensor:
        """The ``k`` highest-scoring classes (N, k) of raw features,
        computed :data:`PROBE_CHUNK` rows at a time (no (N, C) logits)."""
        return torch.cat([
            self.logits(features[start:start + PROBE_CHUNK]).topk(
                k, dim=1).indices
            for start in range(0, features.shape[0], PROBE_CHUNK)
        ])


def standardize(x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """``(x - mean) / sqrt(var + BN_EPS)`` in float64."""
    return (x.double() - mean.double()) / torch.sqrt(var.double() + BN_EPS)


def feature_moments(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-feature mean and biased variance in float64.

    The statistics an affine-free BatchNorm holds after seeing ``x``; the
    probe standardises with them. Two passes over chunks of
    :data:`PROBE_CHUNK` rows (no float64 copy of ``x``).

    Args:
        x: Features (N, d).

    Returns:
        ``(mean, var)``, each (d,) float64.
    """
    chunks = range(0, x.shape[0], PROBE_CHUNK)
    mean = sum(x[start:start + PROBE_CHUNK].double().sum(dim=0)
               for start in chunks) / x.shape[0]
    var = sum(
        (x[start:start + PROBE_CHUNK].double() - mean).square().sum(dim=0)
        for start in chunks) / x.shape[0]
    return mean, var


def fit_logistic_regression(
        x: Tensor,
        y: Tensor,
        num_classes: int,
        weight_decay: float = 1e-4,
        max_iter: int = 300,
        moments: Optional[Tuple[Tensor, Tensor]] = None) -> torch.nn.Linear:
    """Minimise ``CE(xW^T + b, y) + weight_decay/2 ||W||^2`` with L-BFGS.

    Full-batch: the loss and its gradient are sums over chunks of
    :data:`PROBE_CHUNK` rows, each converted to float64 (and standardised)
    on its own: once for the whole fit while the converted rows take at
    most :data:`CONVERTED_BYTES`, for every evaluation beyond that, so
    memory stays bounded at any ``N``.

    Args:
        x: Features (N, d).
        y: Integer labels (N,).
        num_classes: Number of classes.
        weight_decay: L2 coefficient (the bias is not decayed).
        max_iter: L-BFGS iterations.
        moments: ``(mean, var)`` to standardise each chunk of ``x`` with
            (:func:`standardize`), or ``None``: ``x`` as it is.

    Returns:
        The fitted float64 ``Linear(d, num_classes)``, on ``x``'s device.
    """
    y = y.long().to(x.device)
    # On the features' device (the GPU after a GPU feature pass).
    head = torch.nn.Linear(x.shape[1], num_classes).to(x.device, torch.float64)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    optimizer = torch.optim.LBFGS(
        head.parameters(),
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn='strong_wolfe')

    starts = range(0, x.shape[0], PROBE_CHUNK)

    def converted(start: int) -> Tensor:
        chunk = x[start:start + PROBE_CHUNK]
        return (chunk.double() if moments is None else standardize(
            chunk, *moments))

    kept = ([converted(start) for start in starts]
            if x.shape[0] * x.shape[1] * 8 <= CONVERTED_BYTES else None)

    def rows(index: int) -> Tensor:
        return converted(starts[index]) if kept is None else kept[index]

    def closure() -> Tensor:
        optimizer.zero_grad()
        total = 0.0
        for index, start in enumerate(starts):
            loss = F.cross_entropy(
                head(rows(index)),
                y[start:start + PROBE_CHUNK],
                reduction='sum') / x.shape[0]
            loss.backward()
            total = total + loss.detach()
        penalty = 0.5 * weight_decay * head.weight.square().sum()
        penalty.backward()
        return total + penalty.detach()

    optimizer.step(closure)
    return head


def fit_linear_probe(train_x: Tensor,
                     train_y: Tensor,
                     num_classes: int,
                     weight_decay: float = 1e-4) -> LinearProbe:
    """Standardise with the training moments, then fit the classifier.

    Args:
        train_x: Training features (N, d).
        train_y: Training labels (N,).
        num_classes: Number of classes.
        weight_decay: L2 coefficient of the classifier weights.

    Returns:
        The fitted :class:`LinearProbe`.
    """
    mean, var = feature_moments(train_x)
    head = fit_logistic_regression(
        train_x, train_y, num_classes, weight_decay, moments=(mean, var))
    return LinearProbe(mean, var, head)
