"""ReseedHook: pipeline draws are a function of (seed, epoch, sample index).

One process, the real Runner on 64 Fashion-MNIST images. The exact-resume
check with 2 processes and the shipped dataloader is in test_train_e2e.py.
"""
import os

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks.reseed_hook import INACTIVE, SampleSeededCompose

IMAGES = 64
EPOCHS = 2


class FlipRecorder(Hook):
    """Records, per epoch, the (sample index, flipped?) pairs in load order."""

    def __init__(self):
        self.epochs = {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.epochs.setdefault(runner.epoch, []).extend(
            (sample.sample_idx, sample.flip)
            for sample in data_batch['data_samples'])


def train_and_record_flips(repo_root,
                           work_dir,
                           num_workers,
                           persistent,
                           max_epochs=EPOCHS,
                           resume=False):
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs/fashion_mnist/mmae_fmnist.py'))
    cfg.work_dir = str(work_dir)
    cfg.train_cfg.max_epochs = max_epochs
    cfg.resume = resume
    loader = cfg.train_dataloader
    loader.batch_size = 16
    loader.num_workers = num_workers
    loader.persistent_workers = persistent
    loader.dataset.indices = IMAGES
    # The flip is in the pipeline here whatever the shipped config does.
    loader.dataset.pipeline = [
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackInputs')
    ]
    runner = Runner.from_cfg(cfg)
    recorder = FlipRecorder()
    runner.register_hook(recorder, priority='LOWEST')
    runner.train()
    pipeline = runner.train_dataloader.dataset.pipeline
    assert isinstance(pipeline, SampleSeededCompose)
    assert int(pipeline.epoch[0]) == INACTIVE  # reset after training
    return recorder.epochs


@pytest.fixture(scope='module')
def one_worker_run(repo_root, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('one_worker')
    return work_dir, train_and_record_flips(
        repo_root, work_dir, num_workers=1, persistent=False)


@pytest.fixture(scope='module')
def flips_one_worker(one_worker_run):
    return one_worker_run[1]


def test_each_epoch_draws_fresh_flips(flips_one_worker):
    first, second = (flips_one_worker[e] for e in range(EPOCHS))
    assert len(first) == len(second) == IMAGES
    by_position = [[flip for _, flip in epoch] for epoch in (first, second)]
    # mmengine's worker seeds alone repeat the pattern by position.
    assert by_position[0] != by_position[1]
    assert dict(first) != dict(second)
    assert 0.25 < sum(by_position[0]) / IMAGES < 0.75


def test_resume_in_the_main_process_matches_a_worker_run(
        repo_root, tmp_path, one_worker_run):
    """One process: stopped after epoch 1, resumed, loading in-process."""
    flips = train_and_record_flips(
        repo_root, tmp_path, num_workers=0, persistent=False, max_epochs=1)
    flips.update(
        train_and_record_flips(
            repo_root, tmp_path, num_workers=0, persistent=False, resume=True))
    reference_dir, reference_flips = one_worker_run
    # Same flip per (epoch, sample) whoever loads it, and after resume.
    for epoch in range(EPOCHS):
        assert flips[epoch] == reference_flips[epoch], epoch
    reference = reference_dir / f'epoch_{EPOCHS}.pth'
    final = torch.load(tmp_path / f'epoch_{EPOCHS}.pth')['state_dict']
    final_ref = torch.load(reference)['state_dict']
    assert final.keys() == final_ref.keys()
    assert [k for k, v in final_ref.items()
            if not torch.equal(final[k], v)] == []


def test_known_deterministic_transforms_only_are_not_reseeded():
    from mmengine.dataset import Compose
    from mmpretrain.datasets.transforms import PackInputs
    from mmpretrain.registry import TRANSFORMS

    from mmae_plugin.engine.hooks.reseed_hook import draws_nothing_at_random

    class MyPack(PackInputs):  # a subclass may draw: not trusted
        pass

    assert draws_nothing_at_random(
        Compose([dict(type='Collect', keys=['img']),
                 dict(type='PackInputs')]))
    assert not draws_nothing_at_random(
        Compose([dict(type='RandomFlip', prob=0.5),
                 dict(type='PackInputs')]))
    assert not draws_nothing_at_random(Compose([MyPack()]))
    assert TRANSFORMS.get('PackInputs') is PackInputs


def train_shipped_pretraining(repo_root, work_dir, num_workers):
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs/fashion_mnist/mmae_fmnist.py'))
    cfg.work_dir = str(work_dir)
    cfg.train_cfg.max_epochs = 1
    loader = cfg.train_dataloader
    loader.batch_size = 16
    loader.num_workers = num_workers
    loader.persistent_workers = num_workers > 0
    loader.dataset.indices = 32
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def test_shipped_pretraining_pipeline_is_left_unwrapped_and_exact(
        repo_root, tmp_path):
    """Collect + PackInputs draw nothing: no per-sample seeding, and the
    run is the same with the pipeline in a worker or in the process."""
    in_worker = train_shipped_pretraining(repo_root, tmp_path / 'w1', 1)
    in_process = train_shipped_pretraining(repo_root, tmp_path / 'w0', 0)
    for runner in (in_worker, in_process):
        pipeline = runner.train_dataloader.dataset.pipeline
        assert not isinstance(pipeline, SampleSeededCompose)
    log = open(next((tmp_path / 'w0').rglob('*.log'))).read()
    assert 'draws nothing at random; not re-seeded per sample' in log
    final = in_worker.model.state_dict()
    reference = in_process.model.state_dict()
    assert [k for k, v in reference.items()
            if not torch.equal(final[k], v)] == []
