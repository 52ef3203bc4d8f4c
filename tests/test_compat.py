"""The process-wide workarounds of mmae_plugin.compat on the real stack.

The runner mixins and the FSDP strategy that replaced the other former
compat modules: tests/test_runner_mixins.py, tests/test_fsdp_strategy.py.
"""
import collections
import os
import pickle

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner import Runner, load_checkpoint, save_checkpoint
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401

TINY_VIT = dict(
    type='VisionTransformer',
    arch=dict(
        embed_dims=16, num_layers=1, num_heads=2, feedforward_channels=32),
    img_size=8,
    patch_size=4,
    in_channels=1)


def mmengine_style_checkpoint(path):
    """A checkpoint with the contents mmengine's Runner writes."""
    model = MODELS.build(TINY_VIT)
    hub = MessageHub.get_instance('upstream-fixes-test')
    for value in (0.5, 0.25):
        hub.update_scalar('train/loss', value)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1, 8, 8))[0].sum().backward()
    optimizer.step()
    checkpoint = dict(
        meta=dict(epoch=1, iter=10, cfg='model = dict()', seed=0),
        state_dict=model.state_dict(),
        message_hub=hub.state_dict(),
        optimizer=optimizer.state_dict())
    save_checkpoint(checkpoint, str(path))
    return model


def test_mmengine_checkpoint_loads_with_weights_only(tmp_path):
    path = tmp_path / 'ckpt.pth'
    model = mmengine_style_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    hub = MessageHub.get_instance('restored')
    hub.load_state_dict(checkpoint['message_hub'])
    assert hub.get_scalar('train/loss').mean() == pytest.approx(0.375)
    assert hub.get_scalar('train/loss').min() == pytest.approx(0.25)
    fresh = MODELS.build(TINY_VIT)
    load_checkpoint(fresh, str(path))
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


class Payload:
    """Unpickling this runs a shell command."""

    def __reduce__(self):
        return (os.system, ('touch /tmp/mmae-plugin-pwned', ))


def test_checkpoint_with_arbitrary_callable_is_refused(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': Payload()}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(MODELS.build(TINY_VIT), str(path))
    assert not os.path.exists('/tmp/mmae-plugin-pwned')


class GetattrPayload:
    """Asks the allow-listed ``getattr`` for something else than statistics."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return (getattr, (self.owner, self.name))


@pytest.mark.parametrize('owner,name', [(HistoryBuffer, '__init__'),
                                        (collections.OrderedDict, 'fromkeys')])
def test_getattr_is_restricted_to_history_buffer_statistics(
        tmp_path, owner, name):
    path = tmp_path / 'getattr.pth'
    torch.save({'x': GetattrPayload(owner, name)}, path)
    with pytest.raises(pickle.UnpicklingError, match='getattr'):
        torch.load(path, weights_only=True)


def test_mmpretrain_get_model_loads_plugin_checkpoint(tmp_path):
    from mmpretrain import get_model
    path = tmp_path / 'ckpt.pth'
    cfg = Config(
        dict(
            model=dict(
                type='ImageClassifier',
                backbone=TINY_VIT,
                neck=dict(type='GlobalAveragePooling'),
                head=dict(type='LinearClsHead', num_classes=3,
                          in_channels=16))))
    model = MODELS.build(cfg.model)
    save_checkpoint(
        dict(state_dict=model.state_dict(), meta=dict(epoch=1)), str(path))
    loaded = get_model(cfg, pretrained=str(path))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


# --------------------------------------------------------------------------
# a genuine numpy 1.x checkpoint (tests/data/make_numpy1_checkpoint.py)
# --------------------------------------------------------------------------
NUMPY1_CHECKPOINT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), 'data',
    'numpy1_runner_epoch_2.pth')


def numpy1_runner(work_dir, **kwargs):
    """A Runner with the fixture's model, optimizer and scheduler."""
    from mmengine.testing.runner_test_case import ToyDataset, ToyModel
    return Runner(
        model=ToyModel(),
        work_dir=str(work_dir),
        experiment_name=f'numpy1_{os.path.basename(work_dir)}',
        train_dataloader=dict(
            dataset=ToyDataset(),
            batch_size=4,
            sampler=dict(type='DefaultSampler', shuffle=False),
            num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        param_scheduler=dict(type='MultiStepLR', milestones=[1], gamma=0.5),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        log_level='WARNING',
        **kwargs)


def test_numpy1_fixture_is_a_numpy1_pickle():
    """The committed file is what numpy 1.x writes, not numpy 2's spelling."""
    import zipfile
    assert os.path.getsize(NUMPY1_CHECKPOINT) < 200 * 1024
    with zipfile.ZipFile(NUMPY1_CHECKPOINT) as archive:
        pickled = archive.read(
            next(name for name in archive.namelist()
                 if name.endswith('/data.pkl')))
    assert b'numpy.core.multiarray\n_reconstruct\n' in pickled
    assert b'numpy.core.multiarray\nscalar\n' in pickled
    assert b'numpy._core' not in pickled
    assert b'mmengine.logging.history_buffer\nHistoryBuffer\n' in pickled


def test_numpy1_checkpoint_loads_with_weights_only():
    checkpoint = torch.load(NUMPY1_CHECKPOINT, weights_only=True)
    import numpy as np
    hub = checkpoint['message_hub']
    scores = hub['log_scalars']['val/toy/score']
    assert type(scores) is HistoryBuffer
    # epoch_2.pth is saved before epoch 2's validation: one score so far.
    assert scores.data[0].dtype == np.float64 and len(scores.data[0]) == 1
    best = hub['runtime_info']['best_score']
    assert type(best) is np.float64 and best == scores.data[0].max()
    assert checkpoint['meta']['epoch'] == 2 and checkpoint['meta']['iter'] == 6
    assert 'momentum_buffer' in checkpoint['optimizer']['state'][0]


def test_numpy1_checkpoint_loads_on_mmengine_loaders(tmp_path):
    from mmengine.runner import CheckpointLoader
    from mmengine.testing.runner_test_case import ToyModel
    state = torch.load(NUMPY1_CHECKPOINT, weights_only=True)['state_dict']
    loaded = CheckpointLoader.load_checkpoint(NUMPY1_CHECKPOINT)
    assert loaded['meta']['experiment_name'].startswith('numpy1_fixture')
    by_function, by_init_cfg = ToyModel(), ToyModel()
    load_checkpoint(by_function, NUMPY1_CHECKPOINT)
    by_init_cfg.init_cfg = dict(
        type='Pretrained', checkpoint=NUMPY1_CHECKPOINT)
    by_init_cfg.init_weights()
    for model in (by_function, by_init_cfg):
        for key, value in state.items():
            assert torch.equal(model.state_dict()[key], value), key


def test_numpy1_checkpoint_load_from(tmp_path):
    state = torch.load(NUMPY1_CHECKPOINT, weights_only=True)['state_dict']
    runner = numpy1_runner(tmp_path / 'load', load_from=NUMPY1_CHECKPOINT)
    runner.load_or_resume()
    assert runner.epoch == 0
    for key, value in state.items():
        assert torch.equal(runner.model.state_dict()[key], value), key


def test_numpy1_checkpoint_resumes(tmp_path):
    checkpoint = torch.load(NUMPY1_CHECKPOINT, weights_only=True)
    runner = numpy1_runner(
        tmp_path / 'resume', load_from=NUMPY1_CHECKPOINT, resume=True)
    runner.load_or_resume()
    assert (runner.epoch, runner.iter) == (2, 6)
    hub = runner.message_hub
    assert hub.get_info('best_score') == \
        checkpoint['message_hub']['runtime_info']['best_score']
    saved_loss = checkpoint['message_hub']['log_scalars']['train/loss']
    assert (hub.get_scalar('train/loss').data[0] == saved_loss.data[0]).all()
    # The optimizer's momentum and the scheduler's decayed lr came back.
    state = runner.optim_wrapper.optimizer.state_dict()
    saved = checkpoint['optimizer']
    assert torch.equal(state['state'][0]['momentum_buffer'],
                       saved['state'][0]['momentum_buffer'])
    assert state['param_groups'][0]['lr'] == pytest.approx(0.005)
    runner.train()
    assert (runner.epoch, runner.iter) == (3, 9)
    assert len(hub.get_scalar('train/loss').data[0]) == 9
