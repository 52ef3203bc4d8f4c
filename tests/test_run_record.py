"""Resume from the run's own record (issue 34), through the real Runner.

Each numbered case of the issue: retention across epoch <-> iteration
switches (1), order by global iteration (2), foreign files named like the
run's (3), damaged files (4), ``last_checkpoint`` and the record itself
damaged (5), explicit ``--resume`` of files outside the record and launch
records (6). Messages (7) are in ``test_divergence.py`` and here.
"""
import errno
import json
import os
import os.path as osp
import shutil

import pytest
import torch
from checkpoint_fault_tools import ToyModel, make_toy_runner
from conftest import run_local_ranks
from mmengine.hooks import Hook

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.checkpoint.bounded_read import UnsafeFileError
from mmae_plugin.checkpoint.discovery import choose_resume_checkpoint
from mmae_plugin.checkpoint.integrity import CorruptCheckpointError
from mmae_plugin.checkpoint.run_record import (RECORD_NAME, append_event,
                                               read_record)
from mmae_plugin.engine.runners import (ForeignCheckpointError,
                                        LaunchChangedError, MMAERunner)


class RecordStart(Hook):
    """The epoch and iteration a (resumed) run starts at."""

    priority = 'VERY_LOW'

    def before_train(self, runner):
        self.epoch, self.iter = runner.epoch, runner.iter


class OtherToyModel(ToyModel):
    """Another model config (another class) with the same parameters."""


def run(work_dir,
        max_epochs,
        by_epoch=True,
        interval=1,
        max_keep_ckpts=-1,
        model=None,
        out_dir=None,
        **kwargs):
    """The plugin's runner on 4 samples (2 iterations per epoch).

    Returns:
        The start hook, after training.
    """
    start = RecordStart()
    runner = make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=MMAERunner,
        dataset_length=4,
        default_hooks=dict(
            checkpoint=dict(
                type='SafeCheckpointHook',
                by_epoch=by_epoch,
                interval=interval,
                max_keep_ckpts=max_keep_ckpts,
                out_dir=out_dir)),
        custom_hooks=[start],
        **kwargs)
    if model is not None:
        runner.model = model
    runner.train()
    return start


def logs(work_dir):
    return ''.join(
        open(osp.join(root, name)).read()
        for root, _, names in os.walk(work_dir) for name in sorted(names)
        if name.endswith('.log'))


def entries(work_dir):
    return {
        p: (e.epoch, e.iter)
        for p, e in read_record(str(work_dir)).entries.items()
    }


@pytest.fixture(scope='module')
def iter_then_epoch(tmp_path_factory):
    """Iteration checkpoints every 3 iterations (iter_3; iter_4 is the
    last), then ``--resume iter_3.pth`` into a run with epoch checkpoints,
    max_keep_ckpts=2, to epoch 3."""
    work_dir = tmp_path_factory.mktemp('iter_then_epoch')
    run(work_dir, 2, by_epoch=False, interval=3)
    assert entries(work_dir) == {'iter_3.pth': (1, 3), 'iter_4.pth': (1, 4)}
    early = tmp_path_factory.mktemp('iter_then_epoch_early') / 'work'
    start = run(
        work_dir,
        2,
        max_keep_ckpts=2,
        resume=True,
        load_from=str(work_dir / 'iter_3.pth'))
    assert (start.epoch, start.iter) == (1, 3)
    shutil.copytree(work_dir, early)
    run(work_dir,
        3,
        max_keep_ckpts=2,
        resume=True,
        load_from=str(work_dir / 'iter_3.pth'))
    return early, work_dir


def test_1_switching_to_epoch_checkpoints_keeps_what_the_policy_keeps(
        iter_then_epoch):
    _, work_dir = iter_then_epoch
    kept = entries(work_dir)
    # The two newest by global iteration; the resumed run dropped iter_4
    # (the branch after iter_3 it abandoned) and retired iter_3. Resumed
    # inside epoch 2, it finished that epoch at the unbroken run's
    # iteration 4 (exact_resume).
    assert kept == {'epoch_2.pth': (2, 4), 'epoch_3.pth': (3, 6)}
    for name in kept:
        assert (work_dir / name).is_file(), name
    assert (work_dir / 'last_checkpoint').read_text() == \
        str(work_dir / 'epoch_3.pth')
    assert not (work_dir / 'iter_3.pth').exists()
    start = run(work_dir, 4, max_keep_ckpts=2, resume=True)
    assert (start.epoch, start.iter) == (3, 6)
    assert sorted(entries(work_dir)) == ['epoch_3.pth', 'epoch_4.pth']


def test_2_newest_is_by_global_iteration_not_by_the_name(iter_then_epoch):
    early, _ = iter_then_epoch
    assert entries(early) == {'iter_3.pth': (1, 3), 'epoch_2.pth': (2, 4)}
    choice = choose_resume_checkpoint(str(early))
    assert choice.path == str(early / 'epoch_2.pth') and not choice.skipped
    work_dir = early.parent / 'item2'  # a folder of its own (mktemp)
    shutil.copytree(early, work_dir)
    start = run(work_dir, 3, max_keep_ckpts=2, resume=True)
    assert (start.epoch, start.iter) == (2, 4)


@pytest.fixture
def two_epochs(tmp_path):
    run(tmp_path, 2)
    return tmp_path


def foreign_checkpoints(folder):
    """Files named like the run's: another config's real checkpoint, a
    plain state dict, ``{'state_dict': ...}``, a classifier's."""
    other = folder / 'other_run'
    run(other, 3, model=OtherToyModel())
    state = ToyModel().state_dict()
    return {
        'epoch_9.pth': other / 'epoch_3.pth',
        'epoch_5.pth': state,
        'epoch_6.pth': {
            'state_dict': state
        },
        'epoch_7.pth': {
            'state_dict': state,
            'meta': {
                'classes': [1]
            }
        }
    }


def test_3_files_named_like_the_runs_are_never_resumed(two_epochs,
                                                       tmp_path_factory):
    foreign = foreign_checkpoints(tmp_path_factory.mktemp('foreign'))
    for name, what in foreign.items():
        if isinstance(what, dict):
            torch.save(what, two_epochs / name)
        else:
            shutil.copy(what, two_epochs / name)
    (two_epochs / 'last_checkpoint').write_text(
        str(two_epochs / 'epoch_9.pth'))
    start = run(two_epochs, 3, resume=True)
    assert (start.epoch, start.iter) == (2, 4)
    assert 'auto-resume passed over' not in logs(two_epochs)


@pytest.mark.parametrize(
    'name,fragment',
    [('epoch_9.pth', r"model config digest \w+ is not this config's"),
     ('epoch_5.pth', 'does not say its epoch and iter'),
     ('epoch_6.pth', 'does not say its epoch and iter'),
     ('epoch_7.pth', 'does not say its epoch and iter')])
def test_3_explicit_resume_of_a_foreign_file_is_refused_by_name(
        tmp_path, name, fragment):
    what = foreign_checkpoints(tmp_path)[name]
    path = tmp_path / name
    if isinstance(what, dict):
        torch.save(what, path)
    else:
        shutil.copy(what, path)
    work_dir = tmp_path / 'work'
    with pytest.raises(
            ForeignCheckpointError,
            match=rf'cannot resume {path}: .*{fragment}'):
        run(work_dir, 4, resume=True, load_from=str(path))
    assert f'cannot resume {path}' in logs(work_dir)


def test_3_another_config_is_resumed_when_the_user_says_so(tmp_path):
    other = foreign_checkpoints(tmp_path)['epoch_9.pth']
    start = run(
        tmp_path / 'work',
        4,
        resume=True,
        load_from=str(other),
        cfg=dict(resume_other_run=True))
    assert (start.epoch, start.iter) == (3, 6)
    assert 'resume_other_run=True' in logs(tmp_path / 'work')


def test_3_another_runs_checkpoint_is_refused(two_epochs, tmp_path_factory):
    other = tmp_path_factory.mktemp('other')
    run(other, 3)
    with pytest.raises(
            ForeignCheckpointError,
            match=r'it was written by run \w+, not by the run '
            r'\w+ of this work folder'):
        run(two_epochs, 4, resume=True, load_from=str(other / 'epoch_3.pth'))


@pytest.mark.parametrize('damage', ['zero_first_4k', 'not_zip'])
def test_4_a_damaged_newest_file_falls_back_with_its_cost(two_epochs, damage):
    path = two_epochs / 'epoch_2.pth'
    if damage == 'zero_first_4k':
        with open(path, 'r+b') as file:
            file.write(b'\0' * 4096)
    else:
        path.write_bytes(b'not a zip archive at all')
    start = run(two_epochs, 3, resume=True)
    assert (start.epoch, start.iter) == (1, 2)
    assert f'auto-resume passed over {path}' in logs(two_epochs)
    assert '2 iterations (1 epoch) of training will be redone' in \
        logs(two_epochs)


def test_4_a_non_zip_file_outside_the_record_is_refused(two_epochs):
    outside = two_epochs / 'copies'
    outside.mkdir()
    (outside / 'epoch_2.pth').write_bytes(b'\0' * 4096 + b'rest')
    with pytest.raises(CorruptCheckpointError, match='not a zip archive'):
        run(two_epochs, 3, resume=True, load_from=str(outside / 'epoch_2.pth'))


@pytest.mark.parametrize(
    'text', ['\0' * 45, 'junk://x', 'http://example.invalid/epoch_9.pth'])
def test_5_last_checkpoint_never_sends_the_search_elsewhere(
        two_epochs, tmp_path_factory, monkeypatch, text):
    elsewhere = tmp_path_factory.mktemp('cwd')
    run(elsewhere, 3)  # a foreign epoch_3.pth in the current directory
    monkeypatch.chdir(elsewhere)
    (two_epochs / 'last_checkpoint').write_text(text)
    start = run(two_epochs, 3, resume=True)
    assert (start.epoch, start.iter) == (2, 4)


def damage_record(work_dir, how):
    record = work_dir / RECORD_NAME
    text = record.read_text()
    if how == 'truncated_last_line':
        record.write_text(text[:-40])
    elif how == 'garbage_line':
        lines = text.splitlines(keepends=True)
        lines[-1] = 'garbage {"event": "saved"\n'
        record.write_text(''.join(lines))
    elif how == 'nul_bytes':
        lines = text.splitlines(keepends=True)
        lines[-1] = '\0' * len(lines[-1])  # a crash's zero-filled block
        record.write_text(''.join(lines))


@pytest.mark.parametrize('how',
                         ['truncated_last_line', 'garbage_line', 'nul_bytes'])
def test_5_a_damaged_record_costs_only_its_damaged_entries(two_epochs, how):
    damage_record(two_epochs, how)
    record = read_record(str(two_epochs))
    assert len(record.damaged) == 1 and sorted(
        record.entries) == ['epoch_1.pth']
    start = run(two_epochs, 3, resume=True)
    assert (start.epoch, start.iter) == (1, 2)
    assert f'1 damaged line(s) of {two_epochs / RECORD_NAME}' in \
        logs(two_epochs)
    # Later lines are whole again: the damage stays in its own line.
    assert sorted(read_record(str(two_epochs)).entries) == [
        'epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'
    ]


def test_5_a_record_all_nul_is_an_error_not_a_search(two_epochs):
    record = two_epochs / RECORD_NAME
    record.write_bytes(b'\0' * record.stat().st_size)
    with pytest.raises(
            CorruptCheckpointError,
            match=r'no intact checkpoint recorded.*damaged'):
        run(two_epochs, 3, resume=True)


def without_launch(two_epochs, target, launch='delete'):
    """A copy of epoch_2 outside the record, its launch record removed or
    replaced."""
    state = torch.load(two_epochs / 'epoch_2.pth', weights_only=True)
    if launch == 'delete':
        del state['meta']['launch']
    else:
        state['meta']['launch'] = launch
    target.mkdir(exist_ok=True)
    torch.save(state, target / 'epoch_2.pth')
    return str(target / 'epoch_2.pth')


def test_6_no_launch_record_is_refused_unless_accepted(two_epochs):
    path = without_launch(two_epochs, two_epochs / 'copy')
    work_dir = two_epochs / 'continued'
    with pytest.raises(
            LaunchChangedError,
            match=r'has no launch record.*cannot be checked.*'
            'resume_launch_change=accept'):
        run(work_dir, 3, resume=True, load_from=path, batch_size=1)
    assert 'has no launch record' in logs(work_dir)
    start = run(
        work_dir,
        3,
        resume=True,
        load_from=path,
        cfg=dict(resume_launch_change='accept'))
    assert (start.epoch, start.iter) == (2, 4)


@pytest.mark.parametrize(
    'launch,fragment',
    [(dict(world_size=1, per_gpu_batch=2, iters_per_epoch=0,
           sharding=None), 'iters_per_epoch is 0, not a positive integer'),
     ('8 GPUs', "it is str '8 GPUs', not a dict"),
     (dict(world_size=1), 'iters_per_epoch is None')])
def test_6_malformed_launch_records_are_one_clear_line(two_epochs, launch,
                                                       fragment):
    path = without_launch(two_epochs, two_epochs / 'copy', launch)
    with pytest.raises(LaunchChangedError) as info:
        run(two_epochs / 'continued', 3, resume=True, load_from=path)
    message = str(info.value)
    assert '\n' not in message and fragment in message
    assert f'cannot resume {path}: its launch record is malformed' in message


def test_record_lines_are_one_event_each(two_epochs):
    lines = (two_epochs / RECORD_NAME).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e['event'] for e in events] == ['start', 'saved', 'saved']
    assert len({e['run_id'] for e in events}) == 1


def two_processes(work_dir, env, *args):
    """``launch_change_driver.py`` on 2 gloo processes; its output."""
    proc = run_local_ranks(
        'tests/launch_change_driver.py', str(work_dir), *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_two_processes_fall_back_alike_and_rank0_alone_records(
        tmp_path, cpu_dist_env_factory):
    """16 samples on 2 processes x 2: 4 iterations per epoch. The newest
    checkpoint damaged: both ranks resume the same older one, the fallback
    is in the log file, and the record holds each event once, with one run
    id (rank 0's, broadcast)."""
    two_processes(tmp_path, cpu_dist_env_factory(), '2')
    with open(tmp_path / 'epoch_2.pth', 'r+b') as file:
        file.write(b'\0' * 4096)
    out = two_processes(tmp_path, cpu_dist_env_factory(), '3', '--resume')
    assert 'rank 0 starts at iteration 4' in out
    assert 'rank 1 starts at iteration 4' in out
    assert f'auto-resume passed over {tmp_path}/epoch_2.pth' in logs(tmp_path)
    events = [
        json.loads(line)
        for line in (tmp_path / RECORD_NAME).read_text().splitlines()
    ]
    assert [(e['event'], e.get('path'), e.get('resumed_iter'))
            for e in events] == [('start', None, None),
                                 ('saved', 'epoch_1.pth', None),
                                 ('saved', 'epoch_2.pth', None),
                                 ('start', None, 4),
                                 ('saved', 'epoch_2.pth', None),
                                 ('saved', 'epoch_3.pth', None)]
    assert len({e['run_id'] for e in events}) == 1
    assert all(e['launch']['world_size'] == 2 for e in events)
    for entry in read_record(str(tmp_path)).checkpoints():
        assert entry.problem() is None
        assert torch.load(
            entry.location,
            weights_only=True)['meta']['run_id'] == events[0]['run_id']


@pytest.mark.parametrize('kind,fragment',
                         [('fifo', 'not a regular file'),
                          ('link to /dev/zero', 'is a symbolic link'),
                          ('dangling link', 'is a symbolic link'),
                          ('directory', 'not a regular file')])
def test_a_record_that_is_not_a_file_is_refused_by_name(
        tmp_path, kind, fragment):
    path = tmp_path / RECORD_NAME
    if kind == 'fifo':
        os.mkfifo(path)
    elif kind == 'link to /dev/zero':
        os.symlink('/dev/zero', path)
    elif kind == 'dangling link':  # appending would create its target
        os.symlink(tmp_path / 'elsewhere' / RECORD_NAME, path)
    else:
        path.mkdir()
    with pytest.raises(UnsafeFileError) as refused:
        append_event(str(tmp_path), dict(event='start', run_id='r'))
    assert str(path) in str(refused.value)
    assert fragment in str(refused.value)
    assert not (tmp_path / 'elsewhere').exists()


def test_a_full_disk_while_appending_names_the_record(small_disk):
    filler = small_disk / 'filler'
    with pytest.raises(OSError):
        with open(filler, 'wb') as f:  # fill the 1 MiB disk to the byte
            f.write(b'\0' * (2 << 20))
    with pytest.raises(OSError) as full:
        for _ in range(1000):  # the first line may still fit in a page
            append_event(str(small_disk), dict(event='start', run_id='r'))
    assert full.value.errno == errno.ENOSPC
    assert str(small_disk / RECORD_NAME) in str(full.value)
    # What was written before is still read, entry by entry.
    assert read_record(str(small_disk)).run_id in (None, 'r')


def test_a_record_garbled_before_the_first_checkpoint_starts_afresh(tmp_path):
    """Damage costs entries, not runs: a killed first launch left only a
    garbled line and no checkpoint, so the next launch trains from the
    start (it used to be refused at every launch)."""
    (tmp_path / RECORD_NAME).write_bytes(b'{"event": "sta\0\0\0')
    start = run(tmp_path, 1, resume=True)
    assert (start.epoch, start.iter) == (0, 0)
    assert 'starting afresh' in logs(tmp_path)
    record = read_record(str(tmp_path))
    assert record.damaged == [1] and sorted(record.entries) == ['epoch_1.pth']


def test_files_no_intact_entry_names_are_named_and_not_saved_over(two_epochs):
    record = two_epochs / RECORD_NAME
    record.write_bytes(b'\0' * record.stat().st_size)
    before = (two_epochs / 'epoch_1.pth').read_bytes()
    with pytest.raises(CorruptCheckpointError) as refused:
        run(two_epochs, 3, resume=True)
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        assert str(two_epochs / name) in str(refused.value)
    assert '--resume PATH' in str(refused.value)
    assert (two_epochs / 'epoch_1.pth').read_bytes() == before
