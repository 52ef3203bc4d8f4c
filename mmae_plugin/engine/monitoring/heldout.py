"""The held-out pass of :class:`~.MatrixInfoHook`, on the training model.

A fixed set of images, each turned into its augmented views once with a
fixed seed, measured with the model's own training forward under the run's
autocast on the training model itself; the forward's side effects
(BatchNorm statistics, momentum steps, a regulariser's state) are undone
after the pass (:func:`training_state_kept`). See
docs/matrix_info.md#2-matrixinfohook.
"""
import contextlib
import copy
import functools
import random
from dataclasses import dataclass
from typing import (Any, Callable, ContextManager, Dict, Iterator, List,
                    Optional)

import numpy as np
import torch
from mmengine.model import is_model_wrapper
from torch import Tensor, nn

from mmae_plugin.utils.validation import (check_bool, check_choice,
                                          check_config, check_int, check_keys)
from .measure import average_values
from .taps import BranchTaps

#: Modes of the network during the held-out pass: ``'eval'`` (BatchNorm
#: running statistics, the network as a linear probe sees it) or ``'train'``
#: (batch statistics, as on the training batches).
HELDOUT_MODES = ('eval', 'train')
#: Embeddings of one batch -> its quantities.
Measure = Callable[[List[Tensor]], Dict[str, Tensor]]
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
    spec = HeldoutSpec(
        **check_keys(heldout, 'heldout', 'dataset', HELDOUT_KEYS))
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


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` is an FSDP root (its forward gathers the shards)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel
    return isinstance(model, FullyShardedDataParallel)


def training_autocast(optim_wrapper: Any) -> Callable[[], ContextManager]:
    """The autocast of the run's training steps, as a context factory.

    ``AmpOptimWrapper.optim_context`` (also the plugin's
    ``MixedPrecisionOptimWrapper``) runs each training forward under
    mmengine's ``autocast(dtype=cast_dtype)``; the held-out forward uses
    the same, so it measures the network as training runs it.

    Args:
        optim_wrapper: The runner's built optimizer wrapper (or
            ``OptimWrapperDict``).

    Returns:
        A function returning a fresh autocast context (a null context for a
        run without mixed precision).

    Raises:
        ValueError: An ``OptimWrapperDict`` whose wrappers autocast
            differently (the held-out forward could only follow one).
    """
    from mmengine.optim import AmpOptimWrapper, OptimWrapperDict
    from mmengine.runner.amp import autocast
    wrappers = list(optim_wrapper.values()) if isinstance(
        optim_wrapper, OptimWrapperDict) else [optim_wrapper]
    casts = {
        w.cast_dtype if isinstance(w, AmpOptimWrapper) else 'off'
        for w in wrappers
    }
    if len(casts) > 1:
        raise ValueError(
            f'MatrixInfoHook heldout: the optim_wrapper\'s wrappers '
            f'autocast differently ({sorted(map(str, casts))}); the held-out '
            'forward follows one autocast: give them the same dtype')
    cast, = casts
    if cast == 'off':
        return contextlib.nullcontext
    return functools.partial(autocast, dtype=cast)


#: What every ``nn.Module`` keeps in its ``__dict__`` (parameters, buffers,
#: submodules, hooks, mode); the rest is the module's own state.
_MODULE_MACHINERY = frozenset(vars(nn.Module()))

#: Values a forward can only rebind, never change in place (so the reference
#: is the snapshot).
_KEPT_BY_REFERENCE = (nn.Module, int, float, str, bool, tuple, frozenset,
                      type(None))


@dataclass(frozen=True)
class _KeptTensor:
    """A tensor attribute and its values: a forward may write into it (SwAV
    pushes each batch into its queue), so it is restored in place."""
    tensor: Tensor
    values: Tensor

    def restore(self) -> Tensor:
        """The same tensor, with its values as they were."""
        with torch.no_grad():
            self.tensor.copy_(self.values)
        return self.tensor


def _snapshot(value: Any) -> Any:
    """A value as it is now: modules by reference (rebinding, not mutation,
    is what a forward does to them), tensors with a copy of their values,
    other objects copied (a forward may mutate them, e.g. a gatherer
    agreeing its layout)."""
    if isinstance(value, _KEPT_BY_REFERENCE):
        return value
    if isinstance(value, Tensor):
        return _KeptTensor(value, value.detach().clone())
    try:
        return copy.copy(value)
    except TypeError:  # an uncopyable handle (a lock, a process group)
        return value


def own_state(module: nn.Module) -> Dict[str, Any]:
    """The attributes of ``module`` outside ``nn.Module``'s machinery."""
    return {
        name: _snapshot(value)
        for name, value in vars(module).items()
        if name not in _MODULE_MACHINERY
    }


def restore_own_state(module: nn.Module, state: Dict[str, Any]) -> None:
    """Put back what :func:`own_state` took (tensors in place)."""
    vars(module).update({
        name: value.restore() if isinstance(value, _KeptTensor) else value
        for name, value in state.items()
    })


@contextlib.contextmanager
def parameters_kept(model: nn.Module) -> Iterator[None]:
    """Undo, on exit, what a forward wrote into the parameters.

    SwAV's loss normalises its prototypes in place, CAE's rebinds its
    teacher's ``.data`` in a momentum step: a forward outside training must
    not move them. The values are kept on the CPU (no device memory) and
    written back whatever happened to them. Under FSDP nothing is kept: no
    forward that writes its parameters trains there (FSDP discards CAE's
    teacher step, SwAV's and the momentum networks' fail;
    ``MMAEFSDPStrategy`` refuses them), and keeping would gather the whole
    model twice per pass.

    Args:
        model: The module the forward runs on.
    """
    if any(is_fsdp(module) for module in model.modules()):
        yield
        return
    kept = [(param, param.data, param.detach().to('cpu', copy=True))
            for param in model.parameters()]
    try:
        yield
    finally:
        with torch.no_grad():
            for param, data, values in kept:
                if param.data_ptr() != data.data_ptr():
                    param.data = data
                param.copy_(values)


def _no_update(*args: Any, **kwargs: Any) -> None:
    """Stand-in for ``BaseAveragedModel.update_parameters`` while frozen."""


@contextlib.contextmanager
def averaged_models_frozen(model: nn.Module) -> Iterator[None]:
    """Stop the momentum (EMA) networks inside ``model`` from updating.

    BYOL's loss forward steps its target network before running it; the
    held-out pass measures the target network as training left it, not one
    momentum step further.

    Args:
        model: The algorithm (or its FSDP root).
    """
    from mmengine.model import BaseAveragedModel
    averaged = [m for m in model.modules() if isinstance(m, BaseAveragedModel)]
    for module in averaged:
        module.update_parameters = _no_update
    try:
        yield
    finally:
        for module in averaged:
            del module.update_parameters  # the class's method again


@contextlib.contextmanager
def training_state_kept(model: nn.Module,
                        keep_parameters: bool = True) -> Iterator[None]:
    """Undo, on exit, what a loss forward did to ``model`` besides outputs.

    Restores each module's train/eval mode, every buffer (BatchNorm
    statistics, MoCo's queue), the modules' own attributes (a regulariser's
    skip code and gather layout, SwAV's queue) and the parameters
    (:func:`parameters_kept`), and freezes the momentum networks inside;
    FSDP's own wrapper state is left to FSDP.

    Args:
        model: The module the held-out forward runs on.
        keep_parameters: Also restore the parameters (a CPU copy of them
            per pass); False for a forward that writes none (``mode=
            'tensor'``, the encoder alone).
    """
    modes = [(module, module.training) for module in model.modules()]
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    states = [(module, own_state(module)) for module in model.modules()
              if not is_fsdp(module)]
    parameters = parameters_kept(model) if keep_parameters \
        else contextlib.nullcontext()
    try:
        with averaged_models_frozen(model), parameters:
            yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        for module, state in states:
            restore_own_state(module, state)
        for module, training in modes:
            module.training = training


def measure_in_place(
        model: nn.Module, branches: List[dict], batches: List[Any],
        spec: HeldoutSpec, measure: Measure,
        autocast: Callable[[], ContextManager]) -> Dict[str, float]:
    """The quantities of the held-out batches, averaged over them.

    The forward runs on the training model itself, inside
    :func:`training_state_kept`: under FSDP through the FSDP root, whose
    forward gathers each unit's full parameters as training's does (every
    rank runs the same batches, so the collectives match), under DDP or on
    one device on the unwrapped algorithm.

    Args:
        model: The runner's model (wrapped or not); left as it was.
        branches: The training taps' branches (tapped for the pass by
            taps of its own; the training taps stay as they are).
        batches: The collated held-out batches.
        spec: The held-out settings (mode and seed).
        measure: Embeddings of one batch -> its quantities.
        autocast: The run's training autocast (:func:`training_autocast`).

    Returns:
        ``{name: value}``.
    """
    algorithm = model.module if is_model_wrapper(model) else model
    forward_model = model if is_fsdp(model) else algorithm
    device = next(algorithm.parameters()).device
    heldout_taps = BranchTaps(branches)
    heldout_taps.attach(algorithm)
    per_batch = []
    try:
        with training_state_kept(forward_model), torch.no_grad(), \
                seeded_rng(spec.seed, device):
            forward_model.train(spec.mode == 'train')
            for batch in batches:
                data = algorithm.data_preprocessor(batch, False)
                with heldout_taps.recording(), autocast():
                    forward_model(**data, mode='loss')
                per_batch.append(measure(heldout_taps.embeddings()))
    finally:
        heldout_taps.detach()
    return average_values(per_batch)
