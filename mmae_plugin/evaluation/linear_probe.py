"""Linear classifier on cached frozen features (pure torch).

The linear-probe configs train BatchNorm(affine=False) + Linear on the frozen
CLS token with LARS for many epochs over images. On features computed once,
the same classifier family is a convex problem: standardise each feature
with the training-set mean and variance (what the affine-free BatchNorm
uses at test time) and fit l2-regularised multinomial logistic regression
with L-BFGS to convergence. Seconds instead of minutes, and deterministic.
"""
from typing import NamedTuple, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: BatchNorm's eps in mmpretrain's ClsBatchNormNeck.
BN_EPS = 1e-6


class LinearProbe(NamedTuple):
    """A fitted probe: ``head((x - mean) / sqrt(var + BN_EPS))``."""
    mean: Tensor
    var: Tensor
    head: torch.nn.Linear

    def logits(self, features: Tensor) -> Tensor:
        """Class logits (N, C) of raw features (N, d)."""
        with torch.no_grad():
            return self.head(standardize(features, self.mean, self.var))


def standardize(x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """``(x - mean) / sqrt(var + BN_EPS)`` in float64."""
    return (x.double() - mean.double()) / torch.sqrt(var.double() + BN_EPS)


def feature_moments(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-feature mean and biased variance in float64.

    The statistics an affine-free BatchNorm holds after seeing ``x``; the
    probe standardises with them.

    Args:
        x: Features (N, d).

    Returns:
        ``(mean, var)``, each (d,) float64.
    """
    x = x.double()
    return x.mean(dim=0), x.var(dim=0, unbiased=False)


def fit_logistic_regression(x: Tensor, y: Tensor, num_classes: int,
                            weight_decay: float = 1e-4,
                            max_iter: int = 300) -> torch.nn.Linear:
    """Minimise ``CE(xW^T + b, y) + weight_decay/2 ||W||^2`` with L-BFGS.

    Args:
        x: Features (N, d).
        y: Integer labels (N,).
        num_classes: Number of classes.
        weight_decay: L2 coefficient (the bias is not decayed).
        max_iter: L-BFGS iterations.

    Returns:
        The fitted float64 ``Linear(d, num_classes)``, on ``x``'s device.
    """
    x, y = x.double(), y.long().to(x.device)
    # On the features' device (the GPU after a GPU feature pass).
    head = torch.nn.Linear(x.shape[1], num_classes).to(x.device,
                                                       torch.float64)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    optimizer = torch.optim.LBFGS(
        head.parameters(), lr=1.0, max_iter=max_iter, history_size=20,
        tolerance_grad=1e-9, tolerance_change=1e-12,
        line_search_fn='strong_wolfe')

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(head(x), y) + \
            0.5 * weight_decay * head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return head


def fit_linear_probe(train_x: Tensor, train_y: Tensor, num_classes: int,
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
        standardize(train_x, mean, var), train_y, num_classes, weight_decay)
    return LinearProbe(mean, var, head)
