"""One-factor-at-a-time study of the contrastive (CL) setting of the lab.

The default lab (``docs/theory.md``) trains CL with dot-product InfoNCE at
``tau = 0.1`` on the mean of all output tokens of two randomly masked views,
with every area weight ``z_k ~ N(0, 1)``. Under that setting CL moves
attention mass *away* from the global area, while the paper reports that CL
concentrates on the global area. Each :class:`CLVariant` here changes one of
those modelling choices (objective similarity, pooling, views, temperature,
data model) and :func:`run_variant` trains it for several seeds, so that the
choice responsible for the difference can be read off
(``tools/theory/run_cl_ablation.py`` writes the comparison).
"""
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from mmae_plugin.theory.data import (GLOBAL_AREA, FeatureImbalanceData,
                                     ImbalanceSetting)
from mmae_plugin.theory.training import TrainSetting, train


@dataclass(frozen=True)
class CLVariant:
    """One CL configuration: overrides of the data and training settings.

    Args:
        name (str): Short identifier (used on the command line and in JSON).
        description (str): What the variant changes, for legends and docs.
        data (dict): Keyword overrides of :class:`ImbalanceSetting`.
        train (dict): Keyword overrides of :class:`TrainSetting`.
        lr_scale (float): Multiplies the base step size of CL runs
            (InfoNCE gradients scale like ``1 / tau`` and with the
            representation norm, so some variants need another step).
    """

    name: str
    description: str
    data: Mapping[str, object] = field(default_factory=dict)
    train: Mapping[str, object] = field(default_factory=dict)
    lr_scale: float = 1.0


BASE_TEMPERATURE = 0.1

CL_VARIANTS: Dict[str, CLVariant] = {
    v.name: v
    for v in (
        CLVariant(
            'default', 'lab default: dot InfoNCE, tau 0.1, mean of all '
            'tokens, two masked views, z ~ N(0, 1)'),
        CLVariant(
            'cosine',
            'cosine-similarity InfoNCE',
            train=dict(cl_similarity='cosine')),
        CLVariant(
            'pool_masked',
            'representation = mean of masked queries',
            train=dict(cl_pooling='masked')),
        CLVariant(
            'view_full',
            'views: one masked, one unmasked',
            train=dict(cl_views='masked_and_full')),
        CLVariant('tau_1', 'tau 1 (same step)', train=dict(temperature=1.0)),
        # x10, not x100: a step that compensated 1 / tau fully saturated
        # the softmax within a few steps (one seed of three stalled).
        CLVariant(
            'tau_10',
            'tau 10 (step x10)',
            train=dict(temperature=10.0),
            lr_scale=10.0),
        CLVariant(
            'global_std_2',
            'global weight std 2 (information gap)',
            data=dict(global_weight_std=2.0)),
        # Mean 2 makes representations ~5x longer; step / 10 keeps it stable.
        CLVariant(
            'weight_mean_2',
            'every weight z_k ~ N(2, 1) (step / 10)',
            data=dict(weight_mean=2.0),
            lr_scale=0.1),
    )
}


def check_variant_names(names: Sequence[str]) -> List[CLVariant]:
    """Look variants up by name.

    Args:
        names (Sequence[str]): Names of :data:`CL_VARIANTS`.

    Returns:
        list[CLVariant]: The variants, in the given order.
    """
    unknown = [n for n in names if n not in CL_VARIANTS]
    if unknown:
        raise ValueError(f'variants={list(names)!r} is invalid: '
                         f'{unknown!r} unknown; expected names from '
                         f'{sorted(CL_VARIANTS)}.')
    return [CL_VARIANTS[n] for n in names]


def variant_settings(variant: CLVariant, base_data: ImbalanceSetting,
                     base_train: TrainSetting) -> tuple:
    """Apply a variant's overrides to base settings.

    Args:
        variant (CLVariant): The variant.
        base_data (ImbalanceSetting): Data setting before the overrides.
        base_train (TrainSetting): Training setting before the overrides
            (for CL its ``lr`` is multiplied by ``variant.lr_scale``; the
            CL-only overrides leave an MAE run unchanged).

    Returns:
        tuple[ImbalanceSetting, TrainSetting]: The variant's settings.
    """
    data_values = {**vars(base_data), **variant.data}
    train_values = {**vars(base_train), **variant.train}
    if train_values['objective'] == 'cl':
        # The step rescaling compensates InfoNCE's 1 / tau only.
        train_values['lr'] = base_train.lr * variant.lr_scale
    return ImbalanceSetting(**data_values), TrainSetting(**train_values)


def run_variant(variant: CLVariant,
                base_data: ImbalanceSetting,
                base_train: TrainSetting,
                seeds: Sequence[int],
                on_run: Optional[Callable[[], None]] = None) -> List[Dict]:
    """Train one CL variant for every seed.

    Args:
        variant (CLVariant): The variant.
        base_data (ImbalanceSetting): Data setting before the overrides.
        base_train (TrainSetting): Training setting before the overrides;
            its ``seed`` is replaced by each of ``seeds``.
        seeds (Sequence[int]): Seeds of the feature frame, batches and masks.
        on_run (callable, optional): Called after every finished run.

    Returns:
        list[dict]: One :func:`mmae_plugin.theory.train` history per seed.
    """
    data_setting, train_setting = variant_settings(variant, base_data,
                                                   base_train)
    histories = []
    for seed in seeds:
        data = FeatureImbalanceData(data_setting, seed=seed)
        setting = TrainSetting(**{**vars(train_setting), 'seed': seed})
        histories.append(train(data, setting))
        if on_run is not None:
            on_run()
    return histories


def local_mean(row: Sequence[float]) -> float:
    """Mean of a per-area row over the local areas."""
    local = [v for k, v in enumerate(row) if k != GLOBAL_AREA]
    return sum(local) / len(local)


def curve_values(history: Dict, quantity: str) -> List[float]:
    """One tracked scalar per evaluated step.

    Args:
        history (dict): A training history.
        quantity (str): ``'own_global'``, ``'own_local'`` (own-area
            attention of the global area / mean of the local areas),
            ``'local_to_global'`` (mass local queries put on the global
            area), ``'fp_global'`` (FP correlation of global positions with
            the global feature), ``'fp_local_own'`` (local positions with
            their own feature) or ``'fp_local_global'`` (local positions
            with the global feature).

    Returns:
        list[float]: The quantity at every evaluated step.
    """
    g = GLOBAL_AREA
    readers = {
        'own_global':
        lambda i: history['own_area_attention'][i][g],
        'own_local':
        lambda i: local_mean(history['own_area_attention'][i]),
        'local_to_global':
        lambda i: local_mean(
            [row[g] for row in history['area_attention_mass'][i]]),
        'fp_global':
        lambda i: history['feature_position_correlation'][i][g][g],
        'fp_local_own':
        lambda i: local_mean([
            row[k]
            for k, row in enumerate(history['feature_position_correlation'][i])
        ]),
        'fp_local_global':
        lambda i: local_mean(
            [row[g] for row in history['feature_position_correlation'][i]]),
    }
    if quantity not in readers:
        raise ValueError(f'quantity={quantity!r} is invalid: expected one '
                         f'of {sorted(readers)}.')
    return [readers[quantity](i) for i in range(len(history['step']))]


QUANTITIES = ('own_global', 'own_local', 'local_to_global', 'fp_global',
              'fp_local_own', 'fp_local_global')


def mean_spread(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """Mean, population std (None for one value), min, max and count."""
    mean = sum(values) / len(values)
    std = None
    if len(values) > 1:
        std = math.sqrt(sum((v - mean)**2 for v in values) / len(values))
    return dict(
        mean=mean, std=std, min=min(values), max=max(values), n=len(values))


def summarise_variant(histories: Sequence[Dict]) -> Dict[str, Dict]:
    """Init and final value of every quantity over seeds.

    Args:
        histories (Sequence[dict]): One history per seed.

    Returns:
        dict: ``{quantity: {'init': stats, 'final': stats}}`` with the
        statistics of :func:`mean_spread`.
    """
    summary = {}
    for quantity in QUANTITIES:
        curves = [curve_values(h, quantity) for h in histories]
        summary[quantity] = dict(
            init=mean_spread([c[0] for c in curves]),
            final=mean_spread([c[-1] for c in curves]))
    return summary
