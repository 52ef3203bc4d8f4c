"""The plugin touches only what its own run wrote (issue 44, I1 and I2).

Through the real runner: a record entry names a file of its own folder
only (forged ``../`` and absolute entries are damaged lines, never resumed
or deleted); a copied experiment with its own ``out_dir`` continues from
its own copies and leaves the original's alone; retention leaves a file
that is no longer the one the run wrote; no launch (auto-resume without a
record, a new run, an explicit resume) saves over checkpoint files its run
did not write; the "redone" figure counts only possible entries.
"""
import json
import os
import shutil

import pytest
from test_run_record import logs, run

from mmae_plugin.checkpoint.discovery import CheckpointsInTheWay
from mmae_plugin.checkpoint.integrity import CorruptCheckpointError
from mmae_plugin.checkpoint.run_record import (RECORD_NAME, append_event,
                                               file_sha256, read_record)


def snapshot(folder):
    """Every file under ``folder`` with its SHA-256."""
    return {
        os.path.relpath(os.path.join(root, name), folder):
        file_sha256(os.path.join(root, name))
        for root, _, names in os.walk(folder) for name in names
    }


def forge(folder, path, source, **fields):
    """Append a ``saved`` line naming ``path`` with ``source``'s size and
    digest, as the run's newest checkpoint."""
    record = read_record(str(folder))
    event = dict(
        event='saved',
        path=str(path),
        epoch=2,
        iter=99,
        size=os.path.getsize(source),
        sha256=file_sha256(source),
        best=False,
        run_id=record.run_id,
        config_digest='x')
    event.update(fields)
    append_event(str(folder), event)


@pytest.fixture
def victim(tmp_path):
    """A sibling run with two checkpoints, and a folder beside it."""
    run(tmp_path / 'victim', 2)
    (tmp_path / 'victim' / 'victimdir').mkdir()
    (tmp_path / 'victim' / 'victimdir' / 'keep.txt').write_text('mine')
    return tmp_path / 'victim'


@pytest.mark.parametrize('how', ['relative', 'absolute', 'folder'])
def test_forged_entries_outside_the_folder_are_never_resumed_or_deleted(
        tmp_path, victim, how):
    work = tmp_path / 'work'
    run(work, 2)
    target = {
        'relative': '../victim/epoch_2.pth',
        'absolute': str(victim / 'epoch_2.pth'),
        'folder': '../victim/victimdir',
    }[how]
    forge(work, target, victim / 'epoch_2.pth')
    before = snapshot(victim)
    record = read_record(str(work))
    assert record.uncontained and target not in record.entries
    start = run(work, 4, max_keep_ckpts=1, resume=True)
    assert (start.epoch, start.iter) == (2, 4)  # its own epoch_2
    assert snapshot(victim) == before
    assert 'name a path outside the record\'s folder' in logs(work)
    assert sorted(read_record(str(work)).entries) == ['epoch_4.pth']


def test_a_copied_experiment_continues_from_its_own_copies(tmp_path):
    """Checkpoints in ``out_dir`` outside the work folder; the experiment
    (work folder and checkpoint folder) is copied and the copy continues
    with its own ``out_dir``, auto-resume and ``max_keep_ckpts=1``."""
    original, copy = tmp_path / 'a' / 'exp', tmp_path / 'b' / 'exp'
    out_a, out_b = tmp_path / 'ckpt_a', tmp_path / 'ckpt_b'
    run(original, 3, out_dir=str(out_a))
    assert sorted(read_record(str(out_a / 'exp')).entries) == [
        'epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'
    ]
    shutil.copytree(original, copy)
    shutil.copytree(out_a, out_b)
    before = snapshot(out_a)
    start = run(copy, 5, max_keep_ckpts=1, resume=True, out_dir=str(out_b))
    assert (start.epoch, start.iter) == (3, 6)
    assert snapshot(out_a) == before  # the original: every byte kept
    assert sorted(os.listdir(
        out_b / 'exp')) == ['checkpoint_record.jsonl', 'epoch_5.pth']


@pytest.mark.parametrize('how', ['same size, other bytes', 'link'])
def test_retention_confirms_each_file_before_deleting_it(tmp_path, how):
    run(tmp_path, 2)
    path = tmp_path / 'epoch_1.pth'
    data = bytearray(path.read_bytes())
    os.remove(path)
    if how == 'link':  # deleting must not reach what it points at
        (tmp_path / 'mine.pth').write_bytes(bytes(data))
        os.symlink(tmp_path / 'mine.pth', path)
    else:
        data[-30] ^= 0xFF
        path.write_bytes(bytes(data))
    run(tmp_path, 4, max_keep_ckpts=1, resume=True)
    assert path.read_bytes() == bytes(data)  # left, and said so
    assert os.path.islink(path) == (how == 'link')
    assert f'retention left {path} in place' in logs(tmp_path)
    assert sorted(read_record(str(tmp_path)).entries) == ['epoch_4.pth']
    removed = [
        json.loads(line) for line in open(tmp_path / RECORD_NAME)
        if '"removed"' in line
    ]
    assert sorted(
        (e['path'], 'left' in e) for e in removed) == [('epoch_1.pth', True),
                                                       ('epoch_2.pth', False),
                                                       ('epoch_3.pth', False)]


@pytest.mark.parametrize('record', ['deleted', 'empty'])
def test_no_fresh_start_over_the_runs_files_without_a_record(tmp_path, record):
    run(tmp_path, 2)
    if record == 'deleted':
        os.remove(tmp_path / RECORD_NAME)
    else:
        (tmp_path / RECORD_NAME).write_bytes(b'')
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointsInTheWay) as refused:
        run(tmp_path, 3, resume=True)
    message = str(refused.value)
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        assert f'{tmp_path / name} (it is not in the run record and its ' \
            'meta names run' in message
    assert '--resume PATH' in message and 'new work folder' in message
    assert {k: v for k, v in snapshot(tmp_path).items()
            if k.endswith('.pth')} == \
        {k: v for k, v in before.items() if k.endswith('.pth')}
    assert message in logs(tmp_path)


def test_a_dangling_record_link_stops_naming_the_link_and_the_files(tmp_path):
    run(tmp_path, 2)
    os.remove(tmp_path / RECORD_NAME)
    os.symlink(tmp_path / 'gone' / RECORD_NAME, tmp_path / RECORD_NAME)
    with pytest.raises(CorruptCheckpointError) as refused:
        run(tmp_path, 3, resume=True)
    assert 'is a symbolic link' in str(refused.value)
    assert str(tmp_path / 'epoch_2.pth') in str(refused.value)
    assert not (tmp_path / 'gone').exists()


def test_a_checkpoint_copied_into_a_new_folder_is_named_not_saved_over(
        tmp_path):
    run(tmp_path / 'old', 3)
    new = tmp_path / 'new'
    new.mkdir()
    shutil.copy(tmp_path / 'old' / 'epoch_3.pth', new / 'epoch_3.pth')
    with pytest.raises(CheckpointsInTheWay, match='epoch_3.pth'):
        run(new, 4, resume=True)
    # The command the message gives continues from it.
    start = run(new, 4, resume=True, load_from=str(new / 'epoch_3.pth'))
    assert (start.epoch, start.iter) == (3, 6)
    assert sorted(read_record(str(new)).entries) == ['epoch_4.pth']


def test_a_new_run_never_saves_over_an_earlier_runs_files(tmp_path):
    run(tmp_path, 2)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointsInTheWay) as refused:
        run(tmp_path, 2)  # resume=False
    assert str(refused.value).startswith('a new run would train from the '
                                         'start')
    assert 'the run record says run' in str(refused.value)
    assert {k: v for k, v in snapshot(tmp_path).items()
            if k.endswith('.pth')} == \
        {k: v for k, v in before.items() if k.endswith('.pth')}


def test_forged_positions_count_nothing_in_the_redone_figure(tmp_path):
    run(tmp_path, 2)
    forge(
        tmp_path,
        'epoch_7.pth',
        tmp_path / 'epoch_2.pth',
        iter=10**18,
        epoch=7)
    forge(tmp_path, 'iter_9.pth', tmp_path / 'epoch_2.pth', iter=9, epoch=0)
    start = run(tmp_path, 3, resume=True)
    assert (start.epoch, start.iter) == (2, 4)
    assert ': 0 iterations (0 epochs) of training will be redone' in \
        logs(tmp_path)


def test_every_recorded_file_gone_and_none_left_starts_afresh(tmp_path):
    """I5: with no checkpoint file to lose, a record whose entries all lost
    their files costs those entries, not the run (found by the soak)."""
    run(tmp_path, 2)
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        os.remove(tmp_path / name)
    start = run(tmp_path, 1, resume=True)
    assert (start.epoch, start.iter) == (0, 0)
    assert 'starting afresh. Passed over: ' in logs(tmp_path)


def test_a_checkpoint_whose_saved_line_was_lost_is_resumed(tmp_path):
    """A launch killed between its first checkpoint's rename and its
    ``saved`` line leaves a record with only ``start``: the file's own meta
    names that run, so auto-resume continues from it."""
    run(tmp_path, 1)
    record = tmp_path / RECORD_NAME
    lines = record.read_text().splitlines(keepends=True)
    record.write_text(''.join(line for line in lines if '"start"' in line))
    start = run(tmp_path, 2, resume=True)
    assert (start.epoch, start.iter) == (1, 2)
    assert 'Migrating: resuming' in logs(tmp_path)
