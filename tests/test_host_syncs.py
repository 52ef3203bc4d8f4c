"""Host-device syncs made from plugin code in a steady-state training step.

On a GPU every ``.item()``, ``bool(tensor)``, ``.cpu()``... waits for the
device to drain its queue. This test counts such calls made *from*
``mmae_plugin`` files while the real mmengine Runner runs ``train_step`` on a
tiny ViT (M-MAE, U-MAE and the MAE baseline on Fashion-MNIST), and requires
the regularised models to make as many as MAE: none.

The counter replaces the sync-type attributes of ``torch.Tensor`` (and the
torch functions whose kernels check their result on the host, such as
``torch.cholesky_inverse`` and ``torch.linalg.eigh``) with wrappers that
count, then call the original. A call is attributed to the first frame
outside torch itself, so a sync inside a torch helper that plugin code called
(``f'{tensor:.3g}'`` calling ``item``) is charged to the plugin.
"""
import collections
import functools
import os
import sys
from typing import Callable, Counter, Dict, Tuple

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmae_plugin

PLUGIN_DIR = os.path.dirname(os.path.abspath(mmae_plugin.__file__))
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))

#: torch.Tensor attributes that copy device data to the host.
SYNC_METHODS = ('item', '__bool__', '__float__', '__int__', '__index__',
                '__format__', 'tolist', 'cpu', 'numpy', 'nonzero')
#: torch functions that read a device value on the host: a data-dependent
#: output shape, or a LAPACK/cuSOLVER ``info`` checked to raise an error.
SYNC_FUNCTIONS = {
    torch: ('nonzero', 'cholesky_inverse', 'unique', 'masked_select'),
    torch.linalg: ('cholesky', 'eigh', 'eigvalsh', 'inv', 'solve'),
}

Site = Tuple[str, int, str]


def _caller_outside_torch() -> Tuple[str, int]:
    """File and line of the first frame above the wrapper not in torch."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return '', 0
    return frame.f_code.co_filename, frame.f_lineno


class SyncCounter:
    """Counts sync-type calls made from plugin files while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.sites: Counter[Site] = collections.Counter()
        self._originals: Dict[Tuple[object, str], Callable] = {}

    def _wrap(self, owner: object, name: str) -> None:
        original = getattr(owner, name)
        self._originals[owner, name] = original
        counter = self

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if counter.active:
                filename, line = _caller_outside_torch()
                if filename.startswith(PLUGIN_DIR):
                    site = (os.path.relpath(filename, PLUGIN_DIR), line, name)
                    counter.sites[site] += 1
            return original(*args, **kwargs)

        setattr(owner, name, counted)

    def install(self) -> None:
        for name in SYNC_METHODS:
            self._wrap(torch.Tensor, name)
        for module, names in SYNC_FUNCTIONS.items():
            for name in names:
                self._wrap(module, name)

    def uninstall(self) -> None:
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)
        self._originals.clear()


@pytest.fixture(scope='module')
def sync_counter():
    counter = SyncCounter()
    counter.install()
    try:
        yield counter
    finally:
        counter.uninstall()


class CountTrainStepHook(Hook):
    """Arms the counter around ``train_step`` of every iteration but the
    first (which may validate once, by design)."""

    priority = 'LOWEST'  # before_train_iter: last, right before train_step

    def __init__(self, counter: SyncCounter) -> None:
        self.counter = counter
        self.steps = 0

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.counter.active = runner.iter >= 1


class StopCountingHook(Hook):
    """Disarms the counter as soon as ``train_step`` returns."""

    priority = 'HIGHEST'  # after_train_iter: first, before any logging

    def __init__(self, counter: SyncCounter, armed: CountTrainStepHook):
        self.counter = counter
        self.armed = armed

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if self.counter.active:
            self.armed.steps += 1
        self.counter.active = False


ITERS = 4


def syncs_per_step(repo_root: str, name: str, work_dir: str,
                   counter: SyncCounter) -> Tuple[float, Counter[Site]]:
    """Plugin syncs per steady-state step of ``configs/fashion_mnist/{name}``.

    Returns:
        Mean count per counted step and the call sites.
    """
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs', 'fashion_mnist', f'{name}.py'))
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1
    cfg.train_dataloader.update(
        batch_size=16, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.indices = 16 * ITERS
    runner = Runner.from_cfg(cfg)
    armed = CountTrainStepHook(counter)
    runner.register_hook(armed)
    runner.register_hook(StopCountingHook(counter, armed))
    counter.sites.clear()
    runner.train()
    assert armed.steps == ITERS - 1
    return sum(counter.sites.values()) / armed.steps, counter.sites.copy()


def test_counter_sees_a_sync_from_plugin_code(sync_counter):
    """The counter can fail: a plugin-side ``float(tensor)`` is seen, a
    test-side ``.item()`` is not."""
    from mmae_plugin.matrix_info.validation import max_abs
    sync_counter.sites.clear()
    sync_counter.active = True
    try:
        torch.ones(()).item()
        assert not sync_counter.sites
        max_abs(torch.ones(3))  # float(tensor) inside the plugin
    finally:
        sync_counter.active = False
    assert [site[2] for site in sync_counter.sites] == ['__float__']


@pytest.fixture(scope='module')
def mae_syncs(repo_root, tmp_path_factory, sync_counter):
    return syncs_per_step(repo_root, 'mae_fmnist',
                          str(tmp_path_factory.mktemp('mae')), sync_counter)


def test_mae_step_makes_no_plugin_sync(mae_syncs):
    count, sites = mae_syncs
    assert count == 0, dict(sites)


@pytest.mark.parametrize('name', ['mmae_fmnist', 'umae_fmnist'])
def test_regularised_step_makes_as_many_syncs_as_mae(repo_root, tmp_path,
                                                     sync_counter, mae_syncs,
                                                     name):
    got, sites = syncs_per_step(repo_root, name, str(tmp_path / name),
                                sync_counter)
    assert got == mae_syncs[0], dict(sites)
