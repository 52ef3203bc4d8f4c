"""Exact resume at any checkpoint (issue 44, invariant I4).

Epoch-based runs of the toy model (conftest) with iteration checkpoints
every 3 iterations, through the plugin's runner and checkpoint hook: a run
stopped right after an iteration checkpoint written inside an epoch and
auto-resumed must train exactly the unbroken run's remaining batches (the
dataset is never asked for a skipped sample), pass hooks the same
(iteration, epoch, batch index), write the same checkpoints, end at
``max_iters`` and equal the unbroken run's weights bit for bit; on 1 process
and on 2 gloo processes.
"""
import functools
import os
import uuid
from typing import Any, Dict, List, Optional

import pytest
import torch
from conftest import ToyDataset, ToyModel
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from torch.utils.data import BatchSampler

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.runners import (ExactResumeEpochBasedTrainLoop,
                                        InexactResumeError, MMAEFlexibleRunner,
                                        MMAERunner)
from mmae_plugin.engine.runners.exact_resume import (SkipFirstIndices,
                                                     exact_resume_loop_cfg)

EPOCHS = 3
BATCH = 2
CHECKPOINT_INTERVAL = 3


class LoggedToyDataset(ToyDataset):
    """:class:`ToyDataset` appending every index it is asked for to a file
    (in whichever process loads it).

    Args:
        length: Number of samples.
        log_path: The file of requested indices, one a line.
    """

    def __init__(self, length: int, log_path: str) -> None:
        super().__init__(length)
        self.log_path = log_path

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        with open(self.log_path, 'a') as log:
            log.write(f'{index}\n')
        return super().__getitem__(index)


def requested_indices(log_path: str) -> List[int]:
    """The indices the dataset was asked for, in order (none: empty)."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as log:
        return [int(line) for line in log]


class BatchRecorder(Hook):
    """(iteration, epoch, batch index, sample indices) of every trained
    batch, as hooks see them."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.batches: List[list] = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        indices = [int(x[0]) for x in data_batch['inputs']]
        self.batches.append([runner.iter, runner.epoch, batch_idx, indices])


class Interrupted(RuntimeError):
    """The stand-in for a kill right after a checkpoint was saved."""


class StopAfter(Hook):
    """Raise :class:`Interrupted` after iteration ``iteration`` (1-based),
    once the checkpoint hook (``VERY_LOW``) has saved it."""

    priority = 'LOWEST'

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        if runner.iter + 1 == self.iteration:
            raise Interrupted(f'stopped after iteration {self.iteration}')


def exact_toy_runner(work_dir: Any,
                     *,
                     length: int,
                     drop_last: bool = False,
                     num_workers: int = 0,
                     runner_class: type = MMAERunner,
                     checkpoint_type: str = 'SafeCheckpointHook',
                     train_cfg: Optional[dict] = None,
                     batch_sampler: Optional[dict] = None,
                     hooks: Optional[list] = None,
                     log_name: str = 'requests.txt',
                     experiment_name: Optional[str] = None,
                     **kwargs: Any) -> Runner:
    """The toy run: shuffled, momentum SGD, an iteration-based warm-up,
    iteration checkpoints every 3 iterations, all kept.

    Args:
        work_dir: Work (and checkpoint) folder.
        length: Samples per epoch.
        drop_last: The dataloader's ``drop_last``.
        num_workers: Dataloader workers (persistent when more than 0).
        runner_class: The runner.
        checkpoint_type: The checkpoint hook.
        train_cfg: The loop config (epoch-based, 3 epochs by default).
        batch_sampler: A batch sampler config, or None for torch's.
        hooks: Custom hooks.
        log_name: The file (in ``work_dir``) of requested indices.
        experiment_name: Defaults to a fresh unique name.
        **kwargs: More runner arguments (``resume``, ``launcher``...).

    Returns:
        The runner (not yet trained).
    """
    kwargs.setdefault('log_level', 'INFO')
    dataloader = dict(
        dataset=LoggedToyDataset(length, os.path.join(work_dir, log_name)),
        batch_size=BATCH,
        sampler=dict(type='DefaultSampler', shuffle=True),
        drop_last=drop_last,
        num_workers=num_workers,
        persistent_workers=num_workers > 0)
    if batch_sampler is not None:
        dataloader['batch_sampler'] = batch_sampler
    torch.manual_seed(0)  # the model is built before the runner seeds
    return runner_class(
        model=ToyModel(),
        work_dir=str(work_dir),
        train_dataloader=dataloader,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        param_scheduler=dict(
            type='LinearLR', start_factor=0.1, by_epoch=False, end=7),
        train_cfg=train_cfg or dict(by_epoch=True, max_epochs=EPOCHS),
        default_hooks=dict(
            checkpoint=dict(
                type=checkpoint_type,
                interval=CHECKPOINT_INTERVAL,
                by_epoch=False,
                max_keep_ckpts=-1)),
        custom_hooks=hooks,
        randomness=dict(seed=0),
        experiment_name=experiment_name or f'exact_{uuid.uuid4().hex[:12]}',
        **kwargs)


def train_recorded(work_dir: Any,
                   stop_after: Optional[int] = None,
                   **kwargs: Any) -> Dict[str, Any]:
    """Train one toy run and say what it did.

    Args:
        work_dir: Work folder (its request log is emptied first).
        stop_after: Interrupt after this iteration (its checkpoint saved).
        **kwargs: :func:`exact_toy_runner` arguments.

    Returns:
        ``batches`` (:class:`BatchRecorder`), ``requested`` (dataset
        indices), ``iter`` (the runner's at the end), ``state`` (the
        model's) and ``runner``.
    """
    log_path = os.path.join(work_dir, kwargs.get('log_name', 'requests.txt'))
    if os.path.exists(log_path):
        os.remove(log_path)
    recorder = BatchRecorder()
    hooks = [recorder] + ([StopAfter(stop_after)] if stop_after else [])
    runner = exact_toy_runner(work_dir, hooks=hooks, **kwargs)
    if stop_after:
        with pytest.raises(Interrupted):
            runner.train()
    else:
        runner.train()
    model = runner.model.module if hasattr(runner.model, 'module') else \
        runner.model
    return dict(
        batches=recorder.batches,
        requested=requested_indices(log_path),
        iter=runner.iter,
        state={k: v.detach().clone()
               for k, v in model.state_dict().items()},
        runner=runner)


def saved_iterations(work_dir: Any) -> List[int]:
    return sorted(
        int(name[len('iter_'):-len('.pth')]) for name in os.listdir(work_dir)
        if name.startswith('iter_') and name.endswith('.pth'))


def saved_state(path: Any) -> Dict[str, torch.Tensor]:
    return torch.load(
        path, map_location='cpu', weights_only=False)['state_dict']


def differing(state: Dict[str, torch.Tensor],
              reference: Dict[str, torch.Tensor]) -> List[str]:
    assert state.keys() == reference.keys()
    return [k for k, v in reference.items() if not torch.equal(state[k], v)]


def run_logs(work_dir: Any) -> str:
    return ''.join(
        open(path).read() for path in sorted(work_dir.glob('*/*.log')))


def flat(batches: List[list]) -> List[int]:
    return [index for batch in batches for index in batch[3]]


# --------------------------------------------------------------------------
# 1 process
# --------------------------------------------------------------------------
#: (samples, drop_last, workers, stop after iteration): batches per epoch
#: and where the stop falls.
CASES = {
    # 5 batches an epoch: iter_9 is 4 batches into epoch 2.
    'inside_epoch_2': (10, False, 0, 9),
    # 6 batches, the last of 1 sample: iter_9 is 3 batches into epoch 2.
    'partial_last_batch': (11, False, 0, 9),
    # 5 batches, sample 11 dropped: iter_3 is 3 batches into epoch 1.
    'drop_last': (11, True, 0, 3),
    # 3 batches: iter_6 is written after epoch 2's last batch, before the
    # epoch counter advanced (the epoch-end hooks have not run).
    'after_last_batch': (6, False, 0, 6),
    # A persistent worker loads the samples.
    'persistent_worker': (10, False, 1, 9),
}


@pytest.mark.parametrize('case', list(CASES))
def test_resume_inside_an_epoch_is_the_unbroken_run(tmp_path, case):
    length, drop_last, workers, stop = CASES[case]
    settings = dict(length=length, drop_last=drop_last, num_workers=workers)
    unbroken = train_recorded(tmp_path / 'unbroken', **settings)
    max_iters = unbroken['runner'].max_iters
    assert len(unbroken['batches']) == max_iters == unbroken['iter']
    assert unbroken['batches'][stop][2] != 0 or case == 'after_last_batch'

    work_dir = tmp_path / 'resumed'
    stopped = train_recorded(work_dir, stop_after=stop, **settings)
    assert stopped['batches'] == unbroken['batches'][:stop]
    resumed = train_recorded(work_dir, resume=True, **settings)

    # The same batches at the same (iteration, epoch, batch index), no
    # skipped sample loaded, and the run ends at max_iters.
    assert resumed['batches'] == unbroken['batches'][stop:]
    assert resumed['requested'] == flat(unbroken['batches'][stop:])
    assert resumed['iter'] == max_iters
    assert differing(resumed['state'], unbroken['state']) == []
    # The same checkpoints, the final one included, with the same weights.
    ours, theirs = tmp_path / 'resumed', tmp_path / 'unbroken'
    assert saved_iterations(ours) == saved_iterations(theirs)
    assert saved_iterations(ours)[-1] == max_iters
    for iteration in saved_iterations(ours):
        name = f'iter_{iteration}.pth'
        assert differing(saved_state(ours / name),
                         saved_state(theirs / name)) == [], name
    epoch = stopped['batches'][-1][1]  # of the checkpoint (0-based)
    done = stop - epoch * len(unbroken['runner'].train_dataloader)
    assert f'resumed inside epoch {epoch + 1} after {done} of its' in \
        run_logs(ours)


def test_flexible_runner_resumes_inside_an_epoch(tmp_path):
    settings = dict(length=10, runner_class=MMAEFlexibleRunner)
    unbroken = train_recorded(tmp_path / 'unbroken', **settings)
    train_recorded(tmp_path / 'resumed', stop_after=9, **settings)
    resumed = train_recorded(tmp_path / 'resumed', resume=True, **settings)
    assert resumed['batches'] == unbroken['batches'][9:]
    assert resumed['requested'] == flat(unbroken['batches'][9:])
    assert differing(resumed['state'], unbroken['state']) == []


def test_mmengine_loop_restarts_the_epoch(tmp_path):
    """mmengine's own runner, loop and hook, resumed from iter_9 of
    ``inside_epoch_2``, train epoch 2's first 4 batches again (delete the
    plugin's loop when this fails)."""
    settings = dict(
        length=10, runner_class=Runner, checkpoint_type='CheckpointHook')
    unbroken = train_recorded(tmp_path / 'unbroken', **settings)
    train_recorded(tmp_path / 'resumed', stop_after=9, **settings)
    resumed = train_recorded(
        tmp_path / 'resumed',
        resume=True,
        load_from=str(tmp_path / 'resumed' / 'iter_9.pth'),
        **settings)
    assert resumed['batches'][0][1:3] == [1, 0]  # epoch 2 from batch 1
    assert resumed['iter'] == unbroken['iter'] + 4
    assert differing(resumed['state'], unbroken['state']) != []


class ReversedBatches(BatchSampler):
    """A batch sampler whose batches are not consecutive sampler indices."""

    def __iter__(self):
        return reversed(list(super().__iter__()))


def test_unknown_batch_sampler_is_refused_by_name(tmp_path):
    settings = dict(
        length=10,
        batch_sampler=dict(
            type=ReversedBatches, batch_size=BATCH, drop_last=False))
    train_recorded(tmp_path, stop_after=9, **settings)
    with pytest.raises(
            InexactResumeError,
            match='cannot resume inside an epoch with ReversedBatches'):
        train_recorded(tmp_path, resume=True, **settings)
    assert requested_indices(str(tmp_path / 'requests.txt')) == []
    log = run_logs(tmp_path)
    assert 'cannot resume inside an epoch with ReversedBatches' in log


class CustomEpochLoop(EpochBasedTrainLoop):
    """A user's epoch loop: built as configured, never replaced."""


def test_custom_epoch_loop_is_kept_and_warned_about(tmp_path):
    settings = dict(
        length=10, train_cfg=dict(type=CustomEpochLoop, max_epochs=EPOCHS))
    train_recorded(tmp_path, stop_after=9, **settings)
    resumed = train_recorded(tmp_path, resume=True, **settings)
    assert type(resumed['runner'].train_loop) is CustomEpochLoop
    assert resumed['batches'][0][1:3] == [1, 0]  # mmengine's restart
    log = run_logs(tmp_path)
    assert 'the custom loop CustomEpochLoop restarts that epoch from its ' \
        'first batch, training its first 4 batches again' in log


UPSTREAM_EPOCH_LOOPS = (dict(by_epoch=True, max_epochs=1),
                        dict(type='EpochBasedTrainLoop', max_epochs=1))
OTHER_LOOPS = ((dict(by_epoch=False, max_iters=2), IterBasedTrainLoop),
               (dict(type=CustomEpochLoop, max_epochs=1), CustomEpochLoop))


def test_plugin_runner_replaces_mmengine_epoch_loop_only(tmp_path):
    for train_cfg in UPSTREAM_EPOCH_LOOPS:
        runner = exact_toy_runner(tmp_path, length=4, train_cfg=train_cfg)
        assert type(runner.train_loop) is ExactResumeEpochBasedTrainLoop
    for train_cfg, loop_type in OTHER_LOOPS:
        runner = exact_toy_runner(tmp_path, length=4, train_cfg=train_cfg)
        assert type(runner.train_loop) is loop_type


def test_mmengine_runner_takes_the_loop_by_name(tmp_path):
    runner = exact_toy_runner(
        tmp_path,
        length=4,
        runner_class=Runner,
        train_cfg=dict(type='ExactResumeEpochBasedTrainLoop', max_epochs=1))
    assert type(runner.train_loop) is ExactResumeEpochBasedTrainLoop


def test_loop_cfg_is_not_changed_in_place():
    cfg = dict(by_epoch=True, max_epochs=2)
    assert exact_resume_loop_cfg(cfg) == dict(
        type=ExactResumeEpochBasedTrainLoop, max_epochs=2)
    assert cfg == dict(by_epoch=True, max_epochs=2)
    both = dict(type='EpochBasedTrainLoop', by_epoch=True)
    assert exact_resume_loop_cfg(both) is both  # mmengine refuses it


def test_skipping_sampler_keeps_the_wrapped_one_s_length_and_epoch():
    from mmengine.dataset import DefaultSampler
    sampler = DefaultSampler(list(range(7)), shuffle=True, seed=3)
    sampler.set_epoch(2)
    order = list(sampler)
    skipping = SkipFirstIndices(sampler, 4)
    assert list(skipping) == order[4:] and len(skipping) == 7
    skipping.set_epoch(5)
    assert sampler.epoch == 5 and skipping.seed == 3


class FlipRecorder(Hook):
    """(iteration, batch index, [(sample index, flipped?)]) of every batch.
    """

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.batches: List[list] = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.batches.append([
            runner.iter, batch_idx,
            [(s.sample_idx, s.flip) for s in data_batch['data_samples']]
        ])


def train_mmae_fmnist(repo_root: str, work_dir: Any,
                      **kwargs: Any) -> Dict[str, Any]:
    """The shipped M-MAE pretraining on 64 Fashion-MNIST images, 4
    iterations an epoch, a random flip in the pipeline (re-seeded per
    sample by ``ReseedHook``, as MAE's masks are per iteration), iteration
    checkpoints every 3 iterations.

    Args:
        repo_root: The repository.
        work_dir: Work folder.
        **kwargs: ``stop_after`` (iteration) or ``resume=True``.

    Returns:
        ``batches`` (:class:`FlipRecorder`) and ``state`` (the model's).
    """
    from mmengine.config import Config
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs/fashion_mnist/mmae_fmnist.py'))
    cfg.work_dir = str(work_dir)
    cfg.train_cfg.max_epochs = 2
    cfg.resume = kwargs.get('resume', False)
    cfg.default_hooks.checkpoint.update(
        by_epoch=False, interval=CHECKPOINT_INTERVAL, max_keep_ckpts=-1)
    loader = cfg.train_dataloader
    loader.update(batch_size=16, num_workers=0, persistent_workers=False)
    loader.dataset.indices = 64
    loader.dataset.pipeline = [
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackInputs')
    ]
    runner = RUNNERS.build(cfg)  # runner_type, as tools/train.py builds it
    assert isinstance(runner, MMAERunner)
    recorder = FlipRecorder()
    runner.register_hook(recorder, priority='LOWEST')
    if kwargs.get('stop_after'):
        runner.register_hook(StopAfter(kwargs['stop_after']), 'LOWEST')
        with pytest.raises(Interrupted):
            runner.train()
    else:
        runner.train()
    return dict(batches=recorder.batches, state=runner.model.state_dict())


def test_shipped_pretraining_resumes_inside_an_epoch_bit_exact(
        repo_root, tmp_path):
    """Random masks and flips: iter_6 is 2 batches into epoch 2."""
    unbroken = train_mmae_fmnist(repo_root, tmp_path / 'unbroken')
    assert len(unbroken['batches']) == 8
    train_mmae_fmnist(repo_root, tmp_path / 'resumed', stop_after=6)
    resumed = train_mmae_fmnist(repo_root, tmp_path / 'resumed', resume=True)
    assert resumed['batches'] == unbroken['batches'][6:]
    assert [batch[1] for batch in resumed['batches']] == [2, 3]
    assert differing(resumed['state'], unbroken['state']) == []
    assert differing(
        saved_state(tmp_path / 'resumed' / 'iter_8.pth'),
        saved_state(tmp_path / 'unbroken' / 'iter_8.pth')) == []


# --------------------------------------------------------------------------
# 2 gloo processes
# --------------------------------------------------------------------------
def _two_rank_runs(root: str, rank: int, world: int) -> Dict[str, Any]:
    """Unbroken, stopped after iter_9 and resumed, on this rank."""
    torch.set_num_threads(1)
    # What torchrun sets; mmengine reads them for the launcher 'pytorch'.
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    settings = dict(
        length=20,
        launcher='pytorch',
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
        log_name=f'requests_rank{rank}.txt')
    runs = {}
    for name, work_dir, extra in (
        ('unbroken', os.path.join(root, 'unbroken'), {}),
        ('stopped', os.path.join(root, 'resumed'), dict(stop_after=9)),
        ('resumed', os.path.join(root, 'resumed'), dict(resume=True)),
    ):
        run = train_recorded(
            work_dir, experiment_name=name, **settings, **extra)
        runs[name] = dict(
            batches=run['batches'],
            requested=run['requested'],
            iter=run['iter'],
            state={k: v.flatten().tolist()
                   for k, v in run['state'].items()})
    return runs


def test_two_processes_skip_the_same_batches_and_end_bit_exact(tmp_path):
    from _helpers_gloo import run_gloo_ranks
    ranks = run_gloo_ranks(
        functools.partial(_two_rank_runs, str(tmp_path)),
        2,
        tmp_path,
        timeout=400)
    # 20 samples on 2 ranks at 2 a step: 5 batches an epoch, iter_9 is 4
    # batches into epoch 2 on both ranks.
    for runs in ranks:
        unbroken, resumed = runs['unbroken'], runs['resumed']
        assert len(unbroken['batches']) == unbroken['iter'] == 15
        assert runs['stopped']['batches'] == unbroken['batches'][:9]
        assert resumed['batches'] == unbroken['batches'][9:]
        assert resumed['batches'][0][1:3] == [1, 4]
        assert resumed['requested'] == flat(unbroken['batches'][9:])
        assert resumed['iter'] == 15
        assert resumed['state'] == unbroken['state']
    assert ranks[0]['resumed']['state'] == ranks[1]['resumed']['state']
    shards = [set(flat(runs['unbroken']['batches'][5:10])) for runs in ranks]
    assert not shards[0] & shards[1]  # the ranks' shards of epoch 2
    final = 'iter_15.pth'
    assert differing(
        saved_state(tmp_path / 'resumed' / final),
        saved_state(tmp_path / 'unbroken' / final)) == []
    assert saved_iterations(tmp_path / 'resumed') == \
        saved_iterations(tmp_path / 'unbroken')
