"""The held-out pass of :class:`~.MatrixInfoHook`, on a copy of the model.

A fixed set of images the model never trains on, each turned into its
augmented views once with a fixed seed, so that every measurement sees the
same inputs and the curves over epochs show the network changing, not the
batch. Each measurement runs the model's own training forward on a deep
copy: the loss forward has side effects (BatchNorm statistics, BYOL's
momentum step) that must not reach training.
"""
import contextlib
import copy
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from mmae_plugin.utils.validation import (check_bool, check_choice,
                                          check_config, check_int)
from .matrix_info_measure import average_values
from .matrix_info_taps import BranchTaps

#: Modes of the network during the held-out pass: ``'eval'`` (BatchNorm
#: running statistics, the network as a linear probe sees it) or ``'train'``
#: (batch statistics, as on the training batches).
HELDOUT_MODES = ('eval', 'train')
HELDOUT_KEYS = ('dataset', 'num_batches', 'batch_size', 'seed', 'mode',
                'interval', 'at_start')


@dataclass(frozen=True)
class HeldoutSpec:
    """Validated ``heldout=`` settings of :class:`~.MatrixInfoHook`.

    Attributes:
        dataset: mmpretrain dataset config (its pipeline makes the views).
        num_batches: Number of held-out batches.
        batch_size: Images per batch (None: the global training batch).
        seed: Seed of the image choice and of the augmentations.
        mode: ``'eval'`` or ``'train'`` (see :data:`HELDOUT_MODES`).
        interval: Measure every ``interval`` epochs (and after the last).
        at_start: Also measure the initial network (epoch 0).
    """

    dataset: dict
    num_batches: int = 4
    batch_size: Optional[int] = None
    seed: int = 0
    mode: str = 'eval'
    interval: int = 1
    at_start: bool = True


def checked_heldout(heldout: Optional[dict]) -> Optional[HeldoutSpec]:
    """Validate the ``heldout=`` argument of :class:`~.MatrixInfoHook`.

    Args:
        heldout: ``None`` or a dict with the keys of :class:`HeldoutSpec`
            (``dataset`` required).

    Returns:
        The settings, or None when the option is off.
    """
    if heldout is None:
        return None
    if not isinstance(heldout, dict) or 'dataset' not in heldout:
        raise ValueError(f'heldout must be None or a dict with a "dataset" '
                         f'config, got {heldout!r}')
    unknown = set(heldout) - set(HELDOUT_KEYS)
    if unknown:
        raise ValueError(f'unknown heldout key(s) {sorted(unknown)}; allowed: '
                         f'{", ".join(HELDOUT_KEYS)}')
    spec = HeldoutSpec(**heldout)
    check_config(spec.dataset, 'heldout dataset')
    check_int(spec.num_batches, 'heldout num_batches', minimum=1)
    if spec.batch_size is not None:
        # Two rows at least: the covariance kernel standardises over them.
        check_int(spec.batch_size, 'heldout batch_size', minimum=2)
    check_int(spec.seed, 'heldout seed', minimum=0)
    if spec.seed >= 2**32:  # numpy seeds are 32-bit unsigned
        raise ValueError(f'heldout seed must be < 2**32, got {spec.seed!r}')
    check_choice(spec.mode, 'heldout mode', HELDOUT_MODES)
    check_int(spec.interval, 'heldout interval', minimum=1)
    check_bool(spec.at_start, 'heldout at_start')
    return spec


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed python, numpy and torch inside; restore their states after.

    The held-out views and masks are drawn here, so they are the same at
    every measurement, and training draws exactly what it would without the
    held-out option.

    Args:
        seed: Seed of all three generators.
        device: The model's device; a CUDA device's generator is also
            forked (the other devices are not touched by the forward).
    """
    states = (random.getstate(), np.random.get_state())
    devices = [device] if device.type == 'cuda' else []
    try:
        with torch.random.fork_rng(devices=devices):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


def _no_update(*args: Any, **kwargs: Any) -> None:
    """Stand-in for ``BaseAveragedModel.update_parameters`` in a copy."""


def freeze_averaged_models(model: nn.Module) -> None:
    """Stop the momentum (EMA) networks inside ``model`` from updating.

    BYOL's loss forward steps its target network before running it; the
    held-out pass should measure the target network as training left it,
    not one momentum step further.

    Args:
        model: A copy of the algorithm (changed in place).
    """
    from mmengine.model import BaseAveragedModel
    for module in model.modules():
        if isinstance(module, BaseAveragedModel):
            module.update_parameters = _no_update


def build_heldout_batches(spec: HeldoutSpec, batch_size: int,
                          collate: Callable[[list], Any]) -> List[Any]:
    """Draw, augment and collate the held-out batches once.

    Args:
        spec: The held-out settings.
        batch_size: Images per batch.
        collate: The training dataloader's collate function.

    Returns:
        The collated batches, in host memory.
    """
    from mmpretrain.registry import DATASETS
    dataset = DATASETS.build(copy.deepcopy(spec.dataset))
    needed = spec.num_batches * batch_size
    if len(dataset) < needed:
        raise ValueError(
            f'MatrixInfoHook heldout: {spec.num_batches} batches of '
            f'{batch_size} need {needed} images; the dataset has '
            f'{len(dataset)}')
    # The images are a seeded random subset, so a test split sorted by
    # class still gives every class.
    chosen = np.random.default_rng(spec.seed).permutation(
        len(dataset))[:needed]
    with seeded_rng(spec.seed, torch.device('cpu')):
        items = [dataset[int(index)] for index in chosen]
    return [
        collate(items[start:start + batch_size])
        for start in range(0, needed, batch_size)
    ]


def untapped_copy(model: nn.Module, taps: BranchTaps) -> nn.Module:
    """A deep copy of ``model`` without ``taps``, its momentum nets frozen.

    deepcopy would copy the recording hooks along (it shares functions),
    so they are removed for the copy and put back on ``model``.

    Args:
        model: The unwrapped algorithm.
        taps: The training taps, attached to ``model`` or not.

    Returns:
        The copy.
    """
    tapped = taps.attached
    taps.detach()
    try:
        shadow = copy.deepcopy(model)
    finally:
        if tapped:
            taps.attach(model)
    freeze_averaged_models(shadow)
    return shadow


def measure_on_copy(
        model: nn.Module, taps: BranchTaps, batches: List[Any],
        spec: HeldoutSpec,
        measure: Callable[[List[Tensor]], Dict[str,
                                               Tensor]]) -> Dict[str, float]:
    """The quantities of the held-out batches, averaged over them.

    Args:
        model: The unwrapped algorithm (left unchanged: the forward runs on
            a copy).
        taps: The training taps (their branches are tapped on the copy).
        batches: The collated held-out batches.
        spec: The held-out settings (mode and seed).
        measure: Embeddings of one batch -> its quantities.

    Returns:
        ``{name: value}``.
    """
    device = next(model.parameters()).device
    shadow = untapped_copy(model, taps)
    shadow_taps = BranchTaps(taps.branches)
    shadow_taps.attach(shadow)
    shadow.train(spec.mode == 'train')
    per_batch = []
    try:
        with torch.no_grad(), seeded_rng(spec.seed, device):
            for batch in batches:
                data = shadow.data_preprocessor(batch, False)
                with shadow_taps.recording():
                    shadow(**data, mode='loss')
                per_batch.append(measure(shadow_taps.embeddings()))
    finally:
        shadow_taps.detach()
        del shadow
    return average_values(per_batch)
