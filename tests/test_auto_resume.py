"""Auto-resume continues the newest intact checkpoint of the run record,
whatever else a work dir holds, and reads a hostile or broken record
without hanging or exhausting memory.

Real runs of the plugin's runner and checkpoint hook on the toy model; the
fallbacks must be in the run's own log file.
"""
import glob
import os
import shutil
import time

import pytest
import torch
from checkpoint_fault_tools import toy_runner
from mmengine.hooks import Hook

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.checkpoint import (CorruptCheckpointError, UnsafeFileError,
                                    read_small_text)
from mmae_plugin.checkpoint.discovery import choose_resume_checkpoint
from mmae_plugin.checkpoint.run_record import RECORD_NAME


class RecordStart(Hook):
    """The epoch and learning rate a (resumed) run starts with."""

    priority = 'VERY_LOW'

    def before_train(self, runner):
        self.epoch = runner.epoch
        self.lr = runner.optim_wrapper.optimizer.param_groups[0]['lr']


def resume(work_dir, max_epochs=4):
    record = RecordStart()
    toy_runner(
        work_dir,
        max_epochs=max_epochs,
        resume=True,
        max_keep_ckpts=-1,
        custom_hooks=[record]).train()
    return record


def run_logs(work_dir):
    return ''.join(
        open(log).read()
        for log in sorted(glob.glob(str(work_dir / '*' / '*.log'))))


@pytest.fixture
def two_epochs(tmp_path):
    toy_runner(tmp_path, max_epochs=2, max_keep_ckpts=-1).train()
    return tmp_path


def newest_mtime(path):
    future = time.time() + 60
    os.utime(path, (future, future))


def test_a_foreign_newer_pth_is_never_resumed(two_epochs):
    foreign = two_epochs / 'converted_backbone.pth'
    torch.save({'state_dict': {}}, foreign)  # no 'meta': upstream KeyError
    newest_mtime(foreign)
    (two_epochs / 'last_checkpoint').write_text(str(foreign))
    assert resume(two_epochs).epoch == 2
    assert 'auto-resume passed over' not in run_logs(two_epochs)


def test_best_checkpoint_is_never_resumed(two_epochs):
    best = two_epochs / 'best_acc_epoch_2.pth'
    shutil.copy(two_epochs / 'epoch_1.pth', best)
    newest_mtime(best)
    (two_epochs / 'last_checkpoint').write_text(str(best))
    record = resume(two_epochs)
    assert record.epoch == 2 and record.lr == 0.01


def test_an_older_epoch_copied_back_does_not_win_by_mtime(two_epochs):
    """``cp`` of an old epoch_1 gives it the newest mtime; epoch_2 is the
    newest by the iteration the record holds."""
    shutil.copy(two_epochs / 'epoch_1.pth', two_epochs / 'backup.pth')
    os.remove(two_epochs / 'epoch_1.pth')
    shutil.copy(two_epochs / 'backup.pth', two_epochs / 'epoch_1.pth')
    newest_mtime(two_epochs / 'epoch_1.pth')
    (two_epochs / 'last_checkpoint').write_text('')
    assert resume(two_epochs).epoch == 2


def test_last_checkpoint_naming_an_older_file_decides_nothing(two_epochs):
    """A kill after epoch_2 was recorded but before last_checkpoint was
    replaced: the record says epoch_2 is finalized, so it is used."""
    (two_epochs / 'last_checkpoint').write_text(
        str(two_epochs / 'epoch_1.pth'))
    assert resume(two_epochs).epoch == 2


def test_fresh_work_dir_starts_from_scratch_and_says_so(tmp_path):
    assert choose_resume_checkpoint(str(tmp_path)).path is None
    assert resume(tmp_path, max_epochs=1).epoch == 0
    assert f'auto-resume: no checkpoint yet in {tmp_path}; starting ' \
        'afresh' in run_logs(tmp_path)


def test_only_foreign_files_start_afresh(tmp_path):
    """No record and no file whose meta makes it a training checkpoint:
    nothing of this run to resume."""
    torch.save({}, tmp_path / 'converted.pth')
    torch.save({'state_dict': {}}, tmp_path / 'epoch_9.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_9.pth'))
    assert resume(tmp_path, max_epochs=1).epoch == 0


# --------------------------------------------------------------------------
# hostile metadata files: refused by name, at once
# --------------------------------------------------------------------------
def timed(function):
    start = time.monotonic()
    try:
        return function(), time.monotonic() - start
    except Exception as err:  # noqa: BLE001 (returned for the assertions)
        return err, time.monotonic() - start


def test_record_that_is_a_fifo_is_refused_by_name(two_epochs):
    record = two_epochs / RECORD_NAME
    os.remove(record)
    os.mkfifo(record)
    error, seconds = timed(lambda: resume(two_epochs))
    assert seconds < 60  # the run's own time, not a hang
    assert isinstance(error, CorruptCheckpointError)
    assert 'run record' in str(error) and 'is a FIFO' in str(error)
    assert 'is a FIFO' in run_logs(two_epochs)


def test_last_checkpoint_that_is_a_fifo_is_not_read(two_epochs):
    last = two_epochs / 'last_checkpoint'
    os.remove(last)
    os.mkfifo(last)
    choice, seconds = timed(lambda: choose_resume_checkpoint(str(two_epochs)))
    assert seconds < 1
    assert choice.path == str(two_epochs / 'epoch_2.pth')
    assert not choice.skipped


def test_record_linked_to_dev_zero_is_refused_at_once(two_epochs):
    record = two_epochs / RECORD_NAME
    os.remove(record)
    os.symlink('/dev/zero', record)
    error, seconds = timed(lambda: choose_resume_checkpoint(str(two_epochs)))
    assert seconds < 1
    assert f'run record {record} is a symbolic link' in str(error)


def test_huge_sparse_record_is_refused_at_once(two_epochs):
    with open(two_epochs / RECORD_NAME, 'r+b') as file:
        file.truncate(1 << 40)  # 1 TiB, sparse
    error, seconds = timed(lambda: choose_resume_checkpoint(str(two_epochs)))
    assert seconds < 1
    assert f'has {1 << 40} bytes' in str(error)


def test_read_small_text_names_what_it_refuses(tmp_path):
    os.mkfifo(tmp_path / 'fifo')
    for path, fragment in ((tmp_path / 'fifo', 'is a FIFO'),
                           ('/dev/zero', 'is a character device'),
                           (tmp_path, 'is a directory')):
        with pytest.raises(
                UnsafeFileError, match=rf'checksum file {path} {fragment}'):
            read_small_text(str(path), 'checksum file')
    (tmp_path / 'big').write_bytes(b'x' * 11)
    with pytest.raises(
            UnsafeFileError, match='has 11 bytes, more than the 10'):
        read_small_text(str(tmp_path / 'big'), 'checksum file', limit=10)
    assert read_small_text(str(tmp_path / 'big'), 'x', limit=11) == 'x' * 11


# --------------------------------------------------------------------------
# every load path of the plugin's runner verifies
# --------------------------------------------------------------------------
def test_pretrained_init_cfg_checkpoint_is_verified(tmp_path):
    """A linear probe's ``Pretrained`` backbone checkpoint, damaged on disk:
    the plugin's runner refuses it by name before initialising."""
    from conftest import ToyModel
    from mmengine.model import BaseModule

    from mmae_plugin.engine.runners import MMAERunner
    from mmae_plugin.engine.runners.resume_gate import pretrained_checkpoints

    toy_runner(tmp_path, max_epochs=1).train()
    path = str(tmp_path / 'epoch_1.pth')
    with open(path, 'r+b') as file:
        file.truncate(os.path.getsize(path) // 2)

    class Probe(ToyModel):

        def __init__(self):
            super().__init__()
            self.backbone = BaseModule(
                init_cfg=dict(
                    type='Pretrained', checkpoint=path, prefix='backbone.'))

    model = Probe()
    assert list(pretrained_checkpoints(model)) == [path]
    from conftest import make_toy_runner
    runner = make_toy_runner(tmp_path / 'probe', 1, runner_class=MMAERunner)
    runner.model = model
    with pytest.raises(
            CorruptCheckpointError, match=rf'checkpoint {path} is damaged'):
        runner._init_model_weights()


def test_frozen_evaluation_refuses_a_damaged_checkpoint(tmp_path, repo_root):
    from mmengine.config import Config

    from mmae_plugin.evaluation.frozen import evaluate_frozen_encoder
    toy_runner(tmp_path, max_epochs=1).train()
    path = str(tmp_path / 'epoch_1.pth')
    with open(path, 'r+b') as file:
        file.truncate(100)
    config = Config.fromfile(
        f'{repo_root}/configs/fashion_mnist/knn_fmnist.py')
    with pytest.raises(CorruptCheckpointError, match=rf'{path} is damaged'):
        evaluate_frozen_encoder(config, path)
