"""Damaged checkpoints, full disks and kills mid-save, on the real Runner.

Each fault is real: files truncated or overwritten on disk, a 1 MiB tmpfs
that runs out of space, SIGKILL delivered by the kernel (strace) on entering
a syscall of the save.
"""
import errno
import glob
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from checkpoint_fault_tools import ToyModel, make_toy_runner, toy_runner
from mmengine.fileio import register_backend
from mmengine.fileio.backends import BaseStorageBackend
from mmengine.hooks import Hook

import mmae_plugin.registration  # noqa: F401  (the hook and the runner)
from mmae_plugin.checkpoint.integrity import (CorruptCheckpointError,
                                              legacy_sidecar_path,
                                              sidecar_path)
from mmae_plugin.checkpoint.run_record import (RECORD_NAME, file_sha256,
                                               read_record)
from mmae_plugin.engine.hooks import SafeCheckpointHook
from mmae_plugin.engine.runners import MMAERunner

HERE = osp.dirname(osp.abspath(__file__))


class RecordStart(Hook):
    """The epoch a (resumed) run starts at."""

    priority = 'VERY_LOW'

    def __init__(self):
        self.start_epoch = None

    def before_train(self, runner):
        self.start_epoch = runner.epoch


@pytest.fixture
def three_epochs(tmp_path):
    """A work dir holding epoch_1..3.pth (kept), their record and
    last_checkpoint naming epoch_3.pth."""
    toy_runner(tmp_path, max_epochs=3, max_keep_ckpts=-1).train()
    return tmp_path


def resume(work_dir, max_epochs=4, load_from=None, out_dir=None):
    """Resume (automatically, or from ``load_from``) and train on.

    Returns:
        The epoch the resumed run started at.
    """
    record = RecordStart()
    toy_runner(
        work_dir,
        max_epochs=max_epochs,
        resume=True,
        max_keep_ckpts=-1,
        load_from=load_from,
        out_dir=out_dir,
        custom_hooks=[record]).train()
    return record.start_epoch


def truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(int(size * keep))


def flip_bytes_inside_tensor(path, record_suffix, count=64):
    """Invert ``count`` bytes inside the data of one tensor record."""
    with zipfile.ZipFile(path) as archive:
        info = next(
            i for i in archive.infolist()
            if i.filename.endswith(record_suffix) and i.file_size >= count)
        with archive.open(info) as member:
            original = member.read()
    with open(path, 'r+b') as f:
        # The local header's name and extra lengths (torch pads the extra
        # field to align tensor data; the central directory's differs).
        f.seek(info.header_offset + 26)
        name_length, extra_length = (
            int.from_bytes(f.read(2), 'little') for _ in range(2))
        data_offset = info.header_offset + 30 + name_length + extra_length
        f.seek(data_offset)
        assert f.read(len(original)) == original  # found the tensor bytes
        f.seek(data_offset)
        f.write(bytes(b ^ 0xFF for b in original[:count]))
    return info.filename


def table_record(path):
    """The zip record name of ToyModel's 256-byte ``table`` buffer."""
    with zipfile.ZipFile(path) as archive:
        sizes = {i.filename: i.file_size for i in archive.infolist()}
    return next(name for name, size in sizes.items()
                if '/data/' in name and size == 64 * 4)


def load_through_runner(work_dir, path):
    """Load ``path`` with the plugin's runner (which verifies it)."""
    return toy_runner(work_dir, max_epochs=1).load_checkpoint(path)


def run_logs(work_dir):
    """The text of every run log mmengine wrote under ``work_dir``."""
    return ''.join(
        open(log).read()
        for log in sorted(glob.glob(str(work_dir / '*' / '*.log'))))


def fallback_logged(work_dir, skipped, resumed, lost):
    """Whether a run's log says it passed over ``skipped`` for ``resumed``
    and how many epochs that costs."""
    logs = run_logs(work_dir)
    return re.search(
        rf'auto-resume passed over [^\n]*{re.escape(skipped)}[^\n]*'
        rf'Resuming from [^\n]*{re.escape(resumed)}: {lost} iterations? '
        rf'\({lost} epochs?\) of training will be redone', logs) is not None


# --------------------------------------------------------------------------
# the run record
# --------------------------------------------------------------------------
def recorded(work_dir):
    """The record's saved entries as ``{path: entry fields}``."""
    return {
        path: entry.fields
        for path, entry in read_record(str(work_dir)).entries.items()
    }


def test_every_checkpoint_is_recorded_and_nothing_beside_it(three_epochs):
    entries = recorded(three_epochs)
    assert sorted(entries) == ['epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth']
    run_ids = {e['run_id'] for e in entries.values()}
    assert len(run_ids) == 1
    for epoch in (1, 2, 3):
        path = str(three_epochs / f'epoch_{epoch}.pth')
        entry = entries[f'epoch_{epoch}.pth']
        assert (entry['epoch'], entry['iter']) == (epoch, epoch)
        assert entry['size'] == os.path.getsize(path)
        assert entry['sha256'] == file_sha256(path)
        assert entry['layout'] == dict(ranks=None, sharding=None)
        assert entry['launch']['world_size'] == 1
        meta = torch.load(path, weights_only=True)['meta']
        assert meta['run_id'] in run_ids
        assert meta['config_digest'] == entry['config_digest']
    # What listings by name see (mmengine's own tests count ``best*``).
    assert sorted(glob.glob('*epoch*', root_dir=three_epochs)) == [
        'epoch_1.pth', 'epoch_2.pth', 'epoch_3.pth'
    ]
    assert not glob.glob('.*sha256', root_dir=three_epochs)


def test_save_best_leaves_one_file_starting_with_best(tmp_path):
    """What mmengine's test_checkpoint_hook::test_after_val_epoch counts:
    one ``best*`` file in the work dir, however often the best changes."""
    runner = toy_runner(tmp_path, max_epochs=1)
    runner.train()
    hook = SafeCheckpointHook(interval=2, by_epoch=True, save_best='acc')
    hook.before_train(runner)
    for acc in (0.5, 0.7):  # the second best replaces the first
        hook.after_val_epoch(runner, dict(acc=acc))
        best = [n for n in os.listdir(tmp_path) if n.startswith('best')]
        assert best == ['best_acc_epoch_1.pth'], best
    assert recorded(tmp_path)['best_acc_epoch_1.pth']['best'] is True
    runner.load_checkpoint(str(tmp_path / best[0]))
    # Never resumed automatically: no optimizer state to continue.
    assert resume(tmp_path, max_epochs=2) == 1


def test_retention_removes_what_the_record_retired(tmp_path):
    toy_runner(tmp_path, max_epochs=3, max_keep_ckpts=1).train()
    assert sorted(n for n in os.listdir(tmp_path) if 'epoch' in n) == \
        ['epoch_3.pth']
    assert sorted(recorded(tmp_path)) == ['epoch_3.pth']


def test_legacy_work_dir_is_migrated_once(tmp_path):
    """A work dir of mmengine's hook (no record, no run id, no launch): the
    checkpoint whose meta says it is newest is resumed, logged once; the
    record starts with the next save."""
    toy_runner(
        tmp_path, max_epochs=2, upstream=True, max_keep_ckpts=-1).train()
    assert not osp.exists(tmp_path / RECORD_NAME)
    shutil.copy(tmp_path / 'epoch_1.pth', tmp_path / 'backup.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'backup.pth'))
    record = RecordStart()
    toy_runner(
        tmp_path,
        max_epochs=3,
        resume=True,
        cfg=dict(resume_launch_change='accept'),
        custom_hooks=[record]).train()
    assert record.start_epoch == 2
    assert run_logs(tmp_path).count('Migrating: resuming') == 1
    assert re.search(
        r'Migrating: resuming \S+/epoch_2\.pth, the newest of '
        r'3 checkpoint', run_logs(tmp_path))
    assert sorted(recorded(tmp_path)) == ['epoch_3.pth']
    assert resume(tmp_path, max_epochs=4) == 3
    assert run_logs(tmp_path).count('Migrating') == 1


def test_partial_saves_of_a_killed_run_are_removed_at_start(tmp_path):
    toy_runner(tmp_path, max_epochs=1, max_keep_ckpts=-1).train()
    (tmp_path / '.epoch_2.pth.partial').write_bytes(b'half a checkpoint')
    (tmp_path / '.epoch_3.pth.partial').mkdir()  # an FSDP folder's
    assert resume(tmp_path, max_epochs=2) == 1
    assert not [n for n in os.listdir(tmp_path) if 'partial' in n]


class InMemoryBackend(BaseStorageBackend):
    """A real mmengine storage backend that keeps files in a dict (object
    storage on this machine: nothing reaches the local filesystem)."""

    files = {}

    def get(self, filepath):
        return self.files[str(filepath)]

    def get_text(self, filepath, encoding='utf-8'):
        return self.files[str(filepath)].decode(encoding)

    def put(self, obj, filepath):
        self.files[str(filepath)] = bytes(obj)

    def isfile(self, filepath):
        return str(filepath) in self.files

    def isdir(self, filepath):
        return False

    def remove(self, filepath):
        del self.files[str(filepath)]

    def join_path(self, filepath, *filepaths):
        return osp.join(filepath, *filepaths)


def test_hook_saving_to_another_backend_writes_nothing_locally(tmp_path):
    """``backend_args`` naming object storage: upstream's writes, no local
    sidecar or partial file; retention still removes after saving."""
    register_backend('mmae_test_in_memory', InMemoryBackend, force=True)
    InMemoryBackend.files.clear()
    runner = make_toy_runner(
        tmp_path / 'work',
        3,
        runner_class=MMAERunner,
        default_hooks=dict(
            checkpoint=dict(
                type='SafeCheckpointHook',
                interval=1,
                max_keep_ckpts=1,
                out_dir=str(tmp_path / 'remote'),
                backend_args=dict(backend='mmae_test_in_memory'))))
    runner.train()
    saved = sorted(osp.basename(p) for p in InMemoryBackend.files)
    assert saved == ['epoch_3.pth']
    assert not osp.exists(tmp_path / 'remote')


# --------------------------------------------------------------------------
# checksum sidecars of plugin 0.3 and earlier, and of downloaded files
# --------------------------------------------------------------------------
def test_sidecar_of_a_file_outside_any_record_is_honoured(three_epochs):
    """A checkpoint copied without its record, with a 0.2.0 sidecar:
    flipped bytes whose CRC-32s were rewritten are caught by the SHA-256."""
    other = three_epochs / 'copied'
    other.mkdir()
    bad = str(other / 'epoch_3.pth')
    state = torch.load(three_epochs / 'epoch_3.pth', weights_only=True)
    torch.save(state, bad)
    with open(legacy_sidecar_path(bad), 'w') as f:
        f.write(f'{file_sha256(bad)}  epoch_3.pth\n')
    load_through_runner(three_epochs, bad)
    state['state_dict']['table'][0] += 1  # same layout, other bytes
    torch.save(state, bad)
    with pytest.raises(
            CorruptCheckpointError,
            match=r'SHA-256.*recorded at save time.*'
            r'epoch_3\.pth\.sha256'):
        load_through_runner(three_epochs, bad)


def test_a_new_save_removes_a_stale_sidecar_of_its_name(three_epochs):
    """An earlier version's sidecar describing the file a save replaces
    goes (it would refuse the new file outside the record)."""
    stale = sidecar_path(str(three_epochs / 'epoch_3.pth'))
    with open(stale, 'w') as f:
        f.write('0' * 64 + '  epoch_3.pth\n')
    resume(
        three_epochs,
        max_epochs=3,
        load_from=str(three_epochs / 'epoch_2.pth'))  # saves epoch_3 again
    assert not osp.exists(stale)
    assert resume(three_epochs, max_epochs=4) == 3


# --------------------------------------------------------------------------
# truncated and corrupted checkpoints
# --------------------------------------------------------------------------
def test_truncated_checkpoint_auto_resume_falls_back(three_epochs):
    truncate(three_epochs / 'epoch_3.pth')
    assert resume(three_epochs) == 2
    assert fallback_logged(three_epochs, 'epoch_3.pth', 'epoch_2.pth', 1)


def test_truncated_checkpoint_explicit_resume_names_both_files(three_epochs):
    bad = str(three_epochs / 'epoch_3.pth')
    truncate(bad)
    with pytest.raises(CorruptCheckpointError) as info:
        resume(three_epochs, load_from=bad)
    message = str(info.value)
    assert bad in message and 'not the' in message
    assert 'recorded when it was saved' in message
    assert str(three_epochs / 'epoch_2.pth') in message
    assert message in run_logs(three_epochs)


def copied_outside_the_record(work_dir, name='epoch_3.pth'):
    """A copy of a checkpoint in a folder without a record."""
    other = work_dir / 'copied'
    other.mkdir(exist_ok=True)
    shutil.copy(work_dir / name, other / name)
    return str(other / name)


def test_truncated_checkpoint_outside_the_record_is_caught_too(three_epochs):
    """A checkpoint copied without its record: the zip structure tells a
    truncated file."""
    bad = copied_outside_the_record(three_epochs)
    truncate(bad, keep=0.9)
    with pytest.raises(
            CorruptCheckpointError, match=r'epoch_3\.pth is damaged.*zip'):
        load_through_runner(three_epochs, bad)


@pytest.mark.parametrize('recorded_file', [True, False])
def test_flipped_bytes_inside_a_tensor_are_detected(three_epochs,
                                                    recorded_file):
    bad = str(three_epochs / 'epoch_3.pth') if recorded_file else \
        copied_outside_the_record(three_epochs)
    flip_bytes_inside_tensor(bad, table_record(bad))
    # What upstream sees: torch loads the damaged tensor without a word.
    state = torch.load(bad, weights_only=True)['state_dict']
    assert not torch.equal(state['table'], torch.arange(64.))
    expected = 'SHA-256' if recorded_file else 'CRC-32'
    with pytest.raises(CorruptCheckpointError, match=expected):
        resume(three_epochs, load_from=bad)
    if recorded_file:
        assert resume(three_epochs) == 2
        assert fallback_logged(three_epochs, 'epoch_3.pth', 'epoch_2.pth', 1)


def test_empty_last_checkpoint_decides_nothing(three_epochs):
    (three_epochs / 'last_checkpoint').write_text('')
    assert resume(three_epochs) == 3
    assert 'auto-resume passed over' not in run_logs(three_epochs)
    with pytest.raises(FileNotFoundError, match='checkpoint path is empty'):
        load_through_runner(three_epochs, '')


def test_no_intact_checkpoint_left_is_an_error_naming_the_file(tmp_path):
    toy_runner(tmp_path, max_epochs=1).train()
    truncate(tmp_path / 'epoch_1.pth')
    with pytest.raises(
            CorruptCheckpointError,
            match=r'no intact checkpoint.*epoch_1\.pth'):
        resume(tmp_path)


def test_intact_resume_is_unchanged(three_epochs):
    assert resume(three_epochs) == 3
    assert 'auto-resume passed over' not in run_logs(three_epochs)


def test_checkpoint_replaced_by_hand_says_what_to_do(tmp_path):
    toy_runner(tmp_path, max_epochs=1).train()
    path = str(tmp_path / 'epoch_1.pth')
    torch.save({'state_dict': ToyModel().state_dict()}, path)  # by hand
    with pytest.raises(
            CorruptCheckpointError,
            match=r'replaced since.*If you replaced it on '
            'purpose, load it from another name'):
        load_through_runner(tmp_path, path)
    load_through_runner(tmp_path,
                        copied_outside_the_record(tmp_path, 'epoch_1.pth'))


# --------------------------------------------------------------------------
# full disk
# --------------------------------------------------------------------------
def fill(folder):
    """Write a filler file until the filesystem is full."""
    with open(osp.join(folder, 'filler'), 'wb', buffering=0) as f:
        try:
            while True:
                f.write(b'\0' * 512)
        except OSError as err:
            assert err.errno == errno.ENOSPC


def test_disk_full_during_a_save_names_the_file_and_keeps_the_old(
        tmp_path, small_disk):

    class FillDiskBeforeSave(Hook):
        priority = 'LOW'  # before SafeCheckpointHook

        def after_train_epoch(self, runner):
            if runner.epoch == 1:
                fill(str(small_disk))

    work_dir = tmp_path / 'work'  # logs here, checkpoints on the small disk
    runner = toy_runner(
        work_dir,
        max_epochs=2,
        custom_hooks=[FillDiskBeforeSave()],
        out_dir=str(small_disk))
    with pytest.raises(OSError) as info:
        runner.train()
    out_dir = osp.join(str(small_disk), 'work')
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == osp.join(out_dir, 'epoch_2.pth')
    assert 'epoch_2.pth' in str(info.value)
    # The old checkpoint is whole, last_checkpoint still names it.
    assert sorted(n for n in os.listdir(out_dir) if 'epoch' in n) == \
        ['epoch_1.pth']
    assert (work_dir / 'last_checkpoint').read_text() == \
        osp.join(out_dir, 'epoch_1.pth')
    os.remove(osp.join(str(small_disk), 'filler'))
    assert resume(work_dir, max_epochs=2, out_dir=str(small_disk)) == 1


# --------------------------------------------------------------------------
# retention order and kills mid-save
# --------------------------------------------------------------------------
def test_old_checkpoint_is_removed_only_after_last_checkpoint(tmp_path):
    """What exists on disk at each removal of the epoch-2 save."""
    seen = []
    original_remove = os.remove

    def spying_remove(path, *args, **kwargs):
        if 'epoch_1.pth' in osp.basename(str(path)):
            seen.append(
                (osp.basename(str(path)),
                 sorted(
                     n for n in os.listdir(tmp_path) if not n.startswith('2')),
                 (tmp_path / 'last_checkpoint').read_text(),
                 sorted(recorded(tmp_path))))
        return original_remove(path, *args, **kwargs)

    os.remove = spying_remove
    try:
        toy_runner(tmp_path, max_epochs=2, max_keep_ckpts=1).train()
    finally:
        os.remove = original_remove
    assert [name for name, _, _, _ in seen] == ['epoch_1.pth']
    _, files, last, entries = seen[0]
    assert 'epoch_2.pth' in files
    assert last == str(tmp_path / 'epoch_2.pth')
    assert entries == ['epoch_2.pth']  # epoch_1 retired in the record first


def run_kill_driver(tmp_path, *args):
    if shutil.which('strace') is None:
        pytest.skip('strace is not installed (apt-get install strace)')
    out = tmp_path / 'kills.json'
    proc = subprocess.run([
        sys.executable,
        osp.join(HERE, 'checkpoint_kill_driver.py'),
        str(out), *args
    ],
                          capture_output=True,
                          text=True,
                          timeout=1200)
    if 'strace did not attach' in proc.stderr:
        pytest.skip('ptrace is not permitted here')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_sigkill_at_syscalls_of_a_save_always_resumes(tmp_path):
    """max_keep_ckpts=1, SIGKILL at syscalls of the epoch-2 save.

    A sample (every 4th of the ~50 file syscalls of the save) keeps the
    suite short; ``MMAE_FULL_KILL_SWEEP=1`` kills at every one.
    """
    every = '1' if os.environ.get('MMAE_FULL_KILL_SWEEP') == '1' else '4'
    summary = run_kill_driver(tmp_path, '--every', every)
    assert summary['points'] >= 10
    assert summary['killed'] == summary['points']
    assert summary['failures'] == []


def test_the_sweep_finds_upstream_removal_order(tmp_path):
    """With mmengine's own order (remove, then write) a kill on the first
    write of the save, the checkpoint's, leaves nothing to resume."""
    summary = run_kill_driver(tmp_path, '--upstream-retention', '--points',
                              'write:1,write:2')
    assert summary['killed'] == 2
    assert summary['survived'] == 0
