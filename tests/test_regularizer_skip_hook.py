"""RegularizerSkipHook reports MMAE's skipped regulariser steps; the model's
forward reads no log (real Runner on the Fashion-MNIST M-MAE config)."""
import os

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.runner import Runner

from mmae_plugin.engine.hooks import RegularizerSkipHook
from mmae_plugin.models.losses.feature_regularizer import (SKIP_GATHER_REFUSED,
                                                           SKIP_NON_FINITE)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MMAE_FMNIST = os.path.join(REPO, 'configs', 'fashion_mnist', 'mmae_fmnist.py')


class NaNFeaturesAtIteration(Hook):
    """Turns the regulariser's input into NaN at one iteration."""

    def __init__(self, iteration):
        self.iteration = iteration

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter != self.iteration:
            return
        handle = []

        def to_nan(module, args):
            handle.pop().remove()
            return (torch.full_like(args[0], float('nan')), )

        handle.append(
            runner.model.regularizer.register_forward_pre_hook(to_nan))


def tiny_runner(work_dir, iters=3):
    cfg = Config.fromfile(MMAE_FMNIST)
    cfg.work_dir = str(work_dir)
    cfg.train_dataloader.batch_size = 4
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = 4 * iters
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.default_hooks.checkpoint = None
    return Runner.from_cfg(cfg)


def skip_hook(runner):
    (hook, ) = [h for h in runner.hooks if isinstance(h, RegularizerSkipHook)]
    return hook


def test_a_skipped_step_is_reported_once_naming_its_iteration(tmp_path):
    runner = tiny_runner(tmp_path)
    runner.register_hook(NaNFeaturesAtIteration(1))
    runner.train()
    log = next(tmp_path.glob('*/*.log')).read_text()
    warnings = [line for line in log.splitlines() if 'was skipped' in line]
    assert len(warnings) == 1, warnings
    assert 'loss_tcr was skipped (a zero with zero gradient) at training ' \
        'iteration 2 on every rank: ' in warnings[0]
    assert 'non-finite' in warnings[0]


def test_a_refused_gather_raises_naming_the_iteration(tmp_path):
    runner = tiny_runner(tmp_path)
    hook = skip_hook(runner)
    hook.before_run(runner)
    runner.message_hub.update_scalar('train/reg_skipped',
                                     float(SKIP_GATHER_REFUSED))
    with pytest.raises(
            RuntimeError,
            match=r'loss_tcr could not gather the '
            r'features of every rank at training iteration 1: '):
        hook.after_train_iter(runner, 0)
    runner.message_hub.update_scalar('train/reg_skipped',
                                     float(SKIP_NON_FINITE))
    hook.after_train_iter(runner, 0)  # a warning, not an error


def test_the_model_forward_reads_no_logged_value(tmp_path):
    """A refused gather in the message hub does not reach the forward."""
    runner = tiny_runner(tmp_path)
    model = runner.model
    hub = MessageHub.get_current_instance()
    hub.update_scalar('train/reg_skipped', float(SKIP_GATHER_REFUSED))
    data = model.data_preprocessor(
        next(iter(runner.train_dataloader)), training=True)
    for iteration in (4, 5):
        hub.update_info('iter', iteration)
        losses = model.loss(**data)
        assert set(losses) == {'loss_rec', 'loss_tcr', 'reg_skipped'}


def test_a_model_without_regulariser_is_left_alone(tmp_path):
    cfg_path = os.path.join(REPO, 'configs', 'fashion_mnist', 'mae_fmnist.py')
    cfg = Config.fromfile(cfg_path)
    cfg.work_dir = str(tmp_path)
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    runner = Runner.from_cfg(cfg)
    hook = RegularizerSkipHook()
    hook.before_run(runner)
    runner.message_hub.update_scalar('train/reg_skipped',
                                     float(SKIP_GATHER_REFUSED))
    hook.after_train_iter(runner, 0)  # nothing to report on
