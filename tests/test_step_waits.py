"""No steady-state step of the ImageNet recipes reads a value of the step
just queued or moves a data sample (issue 37's "done when", CPU proxy).

The M-MAE and MAE recipes (``configs/{mmae,mae}_vit-base_200e.py``) shrunk
to ViT-tiny at 32 x 32 as ``dev/gpu_check.sh`` shrinks them, on labelled
images, batch 2, trained by the real Runner with every default and custom
hook of the recipe. Two counts per step, from any frame (the plugin's,
mmengine's ``MessageHub``, anyone's):

* **reads of the step's logged values**: a sync-type call (``.item()``,
  ``float()``, ``.cpu()``, ``.tolist()``...) on a tensor of the step's
  ``log_vars`` or on one made from them (by any torch op, traced), from
  the end of the step's ``train_step`` to the end of the next one. On a
  GPU each is a wait for the step just queued; a read of the *previous*
  step's values (what ``DeferredRuntimeInfoHook`` does) is not counted.
  Reads inside ``train_step`` are ``tests/test_host_syncs.py``'s and, on a
  GPU, ``torch.cuda.set_sync_debug_mode``'s (``dev/gpu_check.sh``).
* **data-sample moves**: ``DataSample.to`` / ``.cuda`` / ``.cpu`` calls.

Steady state: every step but the first and the last of the epoch (the last
writes the log line and the checkpoint, which settle the step at once).
Run with ``-s`` to see the numbers, before (mmengine's ``RuntimeInfoHook``,
data samples moved) and after (the shipped recipes).
"""
import collections
import functools
import os
import os.path as osp
from typing import Counter, Dict, List, Tuple

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from mmengine.structures import BaseDataElement
from mmpretrain.structures import DataSample
from test_cuda import SHRINK
from test_host_syncs import SYNC_METHODS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import mmae_plugin.registration  # noqa: F401

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
BATCH, ITERS = 2, 6
#: Every step but the first and the last (log line and checkpoint).
STEADY = range(1, ITERS - 1)
MOVES = ('to', 'cuda', 'cpu')
#: The recipes' logged tensors: MMAE's four, MAE's one.
LOGGED = {'mmae': 4, 'mae': 1}

Site = Tuple[str, int, str]


def storage_of(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


class StepCounter(TorchDispatchMode):
    """Per step: reads of the step's logged values, data-sample moves.

    :meth:`new_step` (called as each ``train_step`` returns) marks the
    storages of the step's ``log_vars``; as a dispatch mode the counter
    marks every tensor an op makes from a marked one. Storages of tensors
    alive from earlier steps are never reused, so a read of an earlier
    step's values is not counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.step = -1
        self.marked: set = set()
        self.reads: Dict[int, Counter[Site]] = collections.defaultdict(
            collections.Counter)
        self.moves: Counter[int] = collections.Counter()
        self._originals: List[Tuple[type, str, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(
                isinstance(leaf, torch.Tensor)
                and storage_of(leaf) in self.marked
                for leaf in tree_leaves((args, kwargs))):
            self.marked.update(
                storage_of(leaf) for leaf in tree_leaves(out)
                if isinstance(leaf, torch.Tensor))
        return out

    def new_step(self, step: int, outputs: dict) -> None:
        self.step = step
        self.marked = {
            storage_of(value)
            for value in outputs.values() if isinstance(value, torch.Tensor)
        } - {0}

    def _count_read(self, tensor: torch.Tensor, name: str) -> None:
        if storage_of(tensor) in self.marked:
            frame = _caller_outside_torch()
            self.reads[self.step][(*frame, name)] += 1

    def install(self) -> None:
        for name in SYNC_METHODS:
            self._wrap(torch.Tensor, name, self._count_read)
        for name in MOVES:
            self._wrap(BaseDataElement, name, self._count_move)

    def _count_move(self, element, name: str) -> None:
        if isinstance(element, DataSample):  # in the next train_step
            self.moves[self.step + 1] += 1

    def _wrap(self, owner: type, name: str, count) -> None:
        original = getattr(owner, name)
        self._originals.append((owner, name, original))

        @functools.wraps(original)
        def counted(obj, *args, **kwargs):
            count(obj, name)
            return original(obj, *args, **kwargs)

        setattr(owner, name, counted)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()


def _caller_outside_torch() -> Tuple[str, int]:
    """File (relative to site-packages or the repo) and line of the first
    frame outside torch and this file."""
    import sys
    torch_dir = osp.dirname(torch.__file__)
    frame = sys._getframe(3)
    while frame is not None and (frame.f_code.co_filename.startswith(torch_dir)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return '', 0
    name = frame.f_code.co_filename
    for root in (osp.dirname(osp.dirname(torch_dir)), REPO):
        if name.startswith(root):
            name = osp.relpath(name, root)
    return name, frame.f_lineno


class StepOutputs(Hook):
    """Hands each step's ``log_vars`` to the counter as ``train_step``
    returns (before any other hook)."""

    priority = 'HIGHEST'

    def __init__(self, counter: StepCounter) -> None:
        self.counter = counter

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.counter.new_step(runner.iter, outputs or {})


def labelled_images(root: str, count: int) -> None:
    """``count`` JPEGs (40 x 48) in two class folders under ``root/train``."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for index in range(count):
        folder = osp.join(root, 'train', f'n{index % 2:03d}')
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(osp.join(folder, f'{index}.jpg'))


def shrunk_recipe_runner(case: str, work_dir: str, data_root: str,
                         before: bool) -> Runner:
    """The recipe shrunk, on labelled images; ``before``: mmengine's
    ``RuntimeInfoHook`` and the data samples moved, as before issue 37."""
    cfg = Config.fromfile(
        osp.join(REPO, 'configs', f'{case}_vit-base_200e.py'))
    cfg.merge_from_dict(SHRINK)
    # The recipe's mixed precision needs a GPU (as gpu_check.sh's dry run).
    cfg.optim_wrapper = dict(
        type='OptimWrapper',
        constructor=cfg.optim_wrapper.constructor,
        optimizer=cfg.optim_wrapper.optimizer,
        paramwise_cfg=cfg.optim_wrapper.paramwise_cfg)
    pipeline = cfg.train_dataloader.dataset.pipeline
    assert pipeline[1].type == 'DecodeRandomResizedCrop'
    pipeline[1].scale = 32
    cfg.train_dataloader.update(
        batch_size=BATCH,
        num_workers=0,
        persistent_workers=False,
        pin_memory=False)
    cfg.train_dataloader.dataset = dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix='train',
        with_label=True,
        pipeline=pipeline)
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    if before:
        cfg.default_hooks.runtime_info = dict(type='RuntimeInfoHook')
        cfg.model.data_preprocessor = dict(
            type='NonBlockingSelfSupDataPreprocessor',
            mean=cfg.data_preprocessor.mean,
            std=cfg.data_preprocessor.std,
            to_rgb=cfg.data_preprocessor.to_rgb,
            move_data_samples=True)
    cfg.work_dir = work_dir
    return RUNNERS.build(cfg)  # the recipe's runner_type


def count_steps(case: str, tmp_path, before: bool) -> StepCounter:
    data_root = str(tmp_path / 'images')
    labelled_images(data_root, BATCH * ITERS)
    runner = shrunk_recipe_runner(case, str(tmp_path / 'work'), data_root,
                                  before)
    counter = StepCounter()
    runner.register_hook(StepOutputs(counter))
    counter.install()
    try:
        with counter:
            runner.train()
    finally:
        counter.uninstall()
    assert runner.iter == ITERS
    return counter


def report(case: str, label: str, counter: StepCounter) -> None:
    for step in range(ITERS):
        print(f'{case} {label} step {step + 1}: '
              f'{sum(counter.reads[step].values())} reads '
              f'{dict(counter.reads[step])}, {counter.moves[step]} '
              'data-sample moves')


@pytest.mark.parametrize('case', ['mmae', 'mae'])
def test_before_the_logged_values_were_read_and_the_samples_moved(
        case, tmp_path):
    """The counter can fail: mmengine's ``RuntimeInfoHook`` reads each
    logged tensor of the step (``MessageHub.update_scalar`` -> ``.item()``)
    and every data sample of the batch was moved."""
    counter = count_steps(case, tmp_path, before=True)
    report(case, 'before', counter)
    for step in STEADY:
        hub = sum(
            n for (path, _, name), n in counter.reads[step].items()
            if path.endswith('mmengine/logging/message_hub.py'))
        assert hub == LOGGED[case], dict(counter.reads[step])
        assert counter.moves[step] == BATCH


@pytest.mark.parametrize('case', ['mmae', 'mae'])
def test_shipped_recipes_read_nothing_of_the_step_and_move_no_sample(
        case, tmp_path):
    counter = count_steps(case, tmp_path, before=False)
    report(case, 'after', counter)
    for step in STEADY:
        assert not counter.reads[step], dict(counter.reads[step])
        assert counter.moves[step] == 0
