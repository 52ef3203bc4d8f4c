"""Gradient-descent training of the one-layer ViT on MAE or CL.

Each step draws a fresh batch and fresh masks and takes one plain gradient
step ``Q <- Q - lr * grad L(Q)`` (no momentum, no weight decay): an unbiased
stochastic estimate of gradient descent on the population objective that the
theory analyses. Gradients come from autograd of the objectives written in
:mod:`mmae_plugin.theory.objectives`. Tracked quantities
(:mod:`mmae_plugin.theory.metrics`) are measured on one fixed evaluation
batch with fixed masks, so curves are not polluted by sampling noise of the
evaluation itself.
"""
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import torch

from ..utils.validation import check_choice, check_int, check_real
from .data import FeatureImbalanceData
from .metrics import evaluate
from .model import OneLayerAttention
from .objectives import (POOLINGS, SIMILARITIES, infonce_loss, mae_loss,
                         random_visible_mask)

OBJECTIVES = ('mae', 'cl')
# How CL's two views are made: both randomly masked (default), or the
# first masked and the second the whole image.
CL_VIEWS = ('two_masked', 'masked_and_full')


@dataclass(frozen=True)
class TrainSetting:
    """Optimisation settings.

    Args:
        objective (str): ``'mae'`` or ``'cl'``.
        steps (int): Number of gradient steps.
        lr (float): Step size.
        batch_size (int): Samples per step (for CL, ``batch_size - 1``
            negatives per anchor).
        mask_ratio (float): Fraction of masked patches per view.
        temperature (float): InfoNCE temperature (CL only).
        cl_similarity (str): InfoNCE similarity, ``'dot'`` or ``'cosine'``
            (CL only).
        cl_pooling (str): Which output tokens a CL representation averages:
            ``'all'``, ``'masked'`` or ``'visible'`` queries (CL only).
        cl_views (str): ``'two_masked'`` (two independent random masks) or
            ``'masked_and_full'`` (one random mask, one unmasked view) (CL
            only).
        eval_interval (int): Steps between two evaluations.
        eval_batch_size (int): Size of the fixed evaluation batch.
        seed (int): Seed of training batches, masks and evaluation batch.
    """

    objective: str = 'mae'
    steps: int = 1500
    lr: float = 1.0
    batch_size: int = 32
    mask_ratio: float = 0.75
    temperature: float = 0.1
    cl_similarity: str = 'dot'
    cl_pooling: str = 'all'
    cl_views: str = 'two_masked'
    eval_interval: int = 50
    eval_batch_size: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice(self.objective, 'objective', OBJECTIVES)
        for name in ('steps', 'eval_interval', 'eval_batch_size'):
            check_int(getattr(self, name), name, minimum=1)
        check_int(self.batch_size, 'batch_size', minimum=2)
        check_real(self.lr, 'lr', minimum=0, strict=True)
        check_real(self.temperature, 'temperature', minimum=0, strict=True)
        for name, allowed in (('cl_similarity', SIMILARITIES),
                              ('cl_pooling', POOLINGS), ('cl_views',
                                                         CL_VIEWS)):
            check_choice(getattr(self, name), name, allowed)
        if self.cl_views == 'masked_and_full' and self.cl_pooling == 'masked':
            raise ValueError(
                "cl_pooling='masked' is invalid with "
                "cl_views='masked_and_full': the unmasked view has no masked "
                "query; expected cl_pooling 'all' or 'visible'.")


def objective_value(model: OneLayerAttention, patches: torch.Tensor,
                    setting: TrainSetting,
                    generator: torch.Generator) -> torch.Tensor:
    """Draw masks and evaluate the configured objective on a batch.

    Args:
        model (OneLayerAttention): The attention model.
        patches (torch.Tensor): ``(B, P, d)`` batch.
        setting (TrainSetting): Objective, mask ratio and temperature.
        generator (torch.Generator): Randomness of the masks.

    Returns:
        torch.Tensor: Scalar objective, differentiable w.r.t. ``model.qk``.
    """
    batch, num_patches = patches.shape[:2]

    def draw_mask() -> torch.Tensor:
        return random_visible_mask(batch, num_patches, setting.mask_ratio,
                                   generator)

    if setting.objective == 'mae':
        return mae_loss(model, patches, draw_mask())
    first = draw_mask()
    if setting.cl_views == 'two_masked':
        second = draw_mask()
    else:
        second = torch.ones_like(first)
    return infonce_loss(
        model,
        patches,
        first,
        second,
        setting.temperature,
        similarity=setting.cl_similarity,
        pooling=setting.cl_pooling)


def gradient_descent_step(model: OneLayerAttention, loss: torch.Tensor,
                          lr: float) -> torch.Tensor:
    """One plain gradient-descent step on ``model.qk``.

    Args:
        model (OneLayerAttention): Model to update in place.
        loss (torch.Tensor): Scalar objective built from ``model.qk``.
        lr (float): Step size.

    Returns:
        torch.Tensor: The gradient that was applied (detached copy).
    """
    (grad, ) = torch.autograd.grad(loss, [model.qk])
    with torch.no_grad():
        model.qk.sub_(lr * grad)
    return grad.detach().clone()


def _record(history: Dict[str, List], step: int,
            metrics: Dict[str, torch.Tensor]) -> None:
    history['step'].append(step)
    for key, value in metrics.items():
        history[key].append(value.tolist())


def train(data: FeatureImbalanceData,
          setting: TrainSetting,
          on_step: Optional[Callable[[int], None]] = None) -> Dict:
    """Train a zero-initialised one-layer ViT and track its attention.

    Args:
        data (FeatureImbalanceData): Data sampler (its features are fixed).
        setting (TrainSetting): Optimisation settings.
        on_step (callable, optional): Called with the step index after every
            step, e.g. to advance a progress bar.

    Returns:
        dict: ``setting`` (dict), ``step`` (list of evaluated steps, 0 is the
        initialisation), ``train_loss`` (per evaluated step, mean over the
        steps since the previous evaluation) and lists of the quantities of
        :func:`mmae_plugin.theory.metrics.evaluate` per evaluated step.
    """
    s = data.setting
    model = OneLayerAttention(s.num_patches, s.feature_dim)
    generator = torch.Generator().manual_seed(setting.seed)
    eval_patches, eval_weights = data.sample(setting.eval_batch_size,
                                             generator)
    eval_visible = random_visible_mask(setting.eval_batch_size, s.num_patches,
                                       setting.mask_ratio, generator)

    def measure() -> Dict[str, torch.Tensor]:
        return evaluate(model, eval_patches, eval_weights, eval_visible,
                        data.features, data.area_index)

    history: Dict[str, List] = dict(
        step=[],
        train_loss=[],
        own_area_attention=[],
        area_attention_mass=[],
        reconstruction_error=[],
        feature_coefficient=[],
        feature_position_correlation=[],
        position_correlation=[])
    _record(history, 0, measure())
    history['train_loss'].append(float('nan'))
    losses: List[float] = []
    for step in range(1, setting.steps + 1):
        patches, _ = data.sample(setting.batch_size, generator)
        loss = objective_value(model, patches, setting, generator)
        gradient_descent_step(model, loss, setting.lr)
        losses.append(loss.item())
        if step % setting.eval_interval == 0 or step == setting.steps:
            _record(history, step, measure())
            history['train_loss'].append(sum(losses) / len(losses))
            losses = []
        if on_step is not None:
            on_step(step)
    history['setting'] = asdict(setting)
    return history
