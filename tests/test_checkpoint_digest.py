"""Checkpoints hashed while written, verified while loaded (issue 44, I6).

The digest the run record holds must be the SHA-256 of the file on disk,
taken from the bytes ``torch.save`` writes (never by reading the file
back), for a file and for an FSDP folder of rank files; a checkpoint
changed after saving must still be refused by name when it is loaded.
"""
import os
import os.path as osp
import shutil

import pytest
import torch
from _helpers_gloo import run_gloo_ranks
from checkpoint_fault_tools import toy_runner
from mmengine.fileio.backends import LocalBackend
from mmengine.runner import checkpoint as checkpoint_module

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.checkpoint.digest_write import (BACKEND_NAME,
                                                 DigestingLocalBackend,
                                                 DigestingWriter, take_digests)
from mmae_plugin.checkpoint.integrity import CorruptCheckpointError
from mmae_plugin.checkpoint.loading import (load_verified, start_verification,
                                            verify_before_loading)
from mmae_plugin.checkpoint.run_record import (FileDigest, file_sha256,
                                               fingerprint, read_record)
from mmae_plugin.engine.hooks import SafeCheckpointHook


def state(seed: int = 0) -> dict:
    """Tensors above and below the helper thread's threshold, a shared
    storage and a non-contiguous view: every kind of record torch writes.
    """
    generator = torch.Generator().manual_seed(seed)
    big = torch.randn(600, 600, generator=generator)  # 1.4 MB
    return dict(
        state_dict=dict(big=big, small=torch.arange(10.), view=big[::7, 1]),
        optimizer=dict(
            state={
                0: dict(exp_avg=torch.randn(700, 500, generator=generator))
            }),
        meta=dict(epoch=1, iter=2))


class AppendOnlyFile:
    """A file object with write and flush only: a seek or tell by
    ``torch.save`` would fail the save instead of passing unseen."""

    def __init__(self) -> None:
        self.chunks = []

    def write(self, data) -> int:
        self.chunks.append(bytes(data))
        return len(self.chunks[-1])

    def flush(self) -> None:
        pass


def test_torch_save_writes_a_file_object_front_to_back():
    out = AppendOnlyFile()
    torch.save(state(), out)
    assert sum(map(len, out.chunks)) > 2 << 20


@pytest.mark.parametrize('parallel_from', [1, 1 << 20, 1 << 40])
def test_digest_is_the_sha256_of_the_file_on_disk(tmp_path, parallel_from):
    path = str(tmp_path / 'ckpt.pth')
    with open(path, 'wb') as file, \
            DigestingWriter(file, parallel_from) as writer:
        torch.save(state(), writer)
    assert writer.size == osp.getsize(path)
    assert writer.hexdigest() == file_sha256(path)


def test_the_digesting_backend_writes_what_mmengine_writes(tmp_path):
    """mmengine's own save_checkpoint, through the registered backend: the
    same bytes as its LocalBackend, and the digest of those bytes; a save
    that does not name the backend records nothing."""
    folder = tmp_path / '.epoch_1.pth.partial'
    for rank in (0, 1):  # FSDP's local shards, or one file
        checkpoint_module.save_checkpoint(
            state(rank),
            str(folder / f'rank{rank}.pth'),
            backend_args=dict(backend=BACKEND_NAME))
    plain = str(tmp_path / 'plain.pth')
    checkpoint_module.save_checkpoint(state(0), plain)
    assert take_digests(plain) == {}
    taken = take_digests(str(folder))
    assert sorted(taken) == ['rank0.pth', 'rank1.pth']
    for name, digest in taken.items():
        path = str(folder / name)
        assert digest == FileDigest(osp.getsize(path), file_sha256(path))
    with open(plain, 'rb') as a, open(folder / 'rank0.pth', 'rb') as b:
        assert a.read() == b.read()
    assert take_digests(str(folder)) == {}  # taken once


def test_the_backend_is_mmengine_s_local_one_in_its_registry():
    from mmengine.fileio import get_file_backend
    backend = get_file_backend(
        'x.pth', backend_args=dict(backend=BACKEND_NAME))
    assert isinstance(backend, DigestingLocalBackend)
    assert isinstance(backend, LocalBackend)
    # Nothing else changes: a plain local path still gets mmengine's.
    assert type(get_file_backend('x.pth')) is LocalBackend


def test_fingerprint_uses_a_written_digest_only_at_its_size(tmp_path):
    path = str(tmp_path / 'ckpt.pth')
    torch.save(state(), path)
    real = FileDigest(osp.getsize(path), file_sha256(path))
    stand_in = FileDigest(real.size, 'f' * 64)
    assert fingerprint(path, {osp.abspath(path): stand_in}) == \
        (real.size, 'f' * 64, None)
    wrong_size = FileDigest(real.size + 1, 'f' * 64)
    assert fingerprint(path, {osp.abspath(path): wrong_size}) == \
        (real.size, real.sha256, None)


def test_the_record_holds_the_digest_taken_while_writing(tmp_path):
    runner = toy_runner(tmp_path, 2, max_keep_ckpts=-1)
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, SafeCheckpointHook))
    newest = osp.abspath(str(tmp_path / 'epoch_2.pth'))
    assert list(hook._written) == [newest]
    entries = read_record(str(tmp_path)).entries
    assert sorted(entries) == ['epoch_1.pth', 'epoch_2.pth']
    for name, entry in entries.items():
        path = str(tmp_path / name)
        assert (entry.size, entry.sha256) == \
            (osp.getsize(path), file_sha256(path))
    assert entries['epoch_2.pth'].sha256 == hook._written[newest].sha256


def _folder_save(rank: int, world: int) -> list:
    """One gloo rank: the hook saves an FSDP-style folder of rank files."""
    import tempfile

    from mmengine.dist import broadcast_object_list
    folder = [tempfile.mkdtemp() if rank == 0 else None]
    broadcast_object_list(folder)
    hook = SafeCheckpointHook(interval=1)
    hook.file_backend = LocalBackend()
    hook.save_atomically(FolderSavingRunner(), folder[0], 'epoch_1.pth')
    if rank != 0:
        return []
    final = osp.join(folder[0], 'epoch_1.pth')
    try:
        return [
            list(fingerprint(final, hook._written)),
            list(fingerprint(final)),
            sorted(hook._written)
        ]
    finally:
        shutil.rmtree(folder[0])


class FolderSavingRunner:
    """Saves as ``FSDPStrategy`` with a local state dict: each rank its
    ``rank<i>.pth`` inside the folder, through mmengine's function."""

    def save_checkpoint(self, out_dir: str, filename: str) -> None:
        from mmengine.dist import get_rank
        from mmengine.runner.checkpoint import save_checkpoint
        folder = osp.join(out_dir, filename)
        os.makedirs(folder, exist_ok=True)
        save_checkpoint(
            state(get_rank()), osp.join(folder, f'rank{get_rank()}.pth'))


def test_an_fsdp_folder_is_recorded_with_every_rank_s_digest(tmp_path):
    """mmengine's FSDPStrategy saves its rank files without the hook's
    backend_args, so they are hashed from disk (documented limit), and
    every rank's save is gathered before the folder is published."""
    digested, from_disk, names = run_gloo_ranks(_folder_save, 2,
                                                str(tmp_path))[0]
    assert digested == from_disk
    assert digested[2] == 2  # ranks
    assert names == []


@pytest.fixture
def saved(tmp_path):
    """A run's recorded checkpoint, saved through the plugin's hook."""
    toy_runner(tmp_path, 1, max_keep_ckpts=-1).train()
    return str(tmp_path / 'epoch_1.pth')


def _flip_byte_inside_a_tensor(path: str) -> None:
    with open(path, 'r+b') as file:
        data = bytearray(file.read())
        # The buffer ``table`` holds 0., 1., ... 63. (float32).
        at = data.index(
            torch.arange(8, 16, dtype=torch.float32).numpy().tobytes())
        file.seek(at)
        file.write(bytes([data[at] ^ 0xFF]))


def test_a_verified_load_returns_the_checkpoint(saved):
    checkpoint = load_verified(saved)
    assert checkpoint['meta']['epoch'] == 1


def test_an_altered_checkpoint_is_refused_by_name(saved):
    _flip_byte_inside_a_tensor(saved)
    with pytest.raises(
            CorruptCheckpointError,
            match=f'checkpoint {saved} is damaged: its SHA-256'):
        load_verified(saved)
    with pytest.raises(CorruptCheckpointError, match='SHA-256'):
        start_verification(saved).wait()


def test_a_truncated_checkpoint_is_refused_by_name_not_by_torch(saved):
    os.truncate(saved, osp.getsize(saved) // 2)
    # torch.load fails on the zip first; the refusal says what happened.
    with pytest.raises(
            CorruptCheckpointError,
            match=f'checkpoint {saved} is damaged: it has'):
        load_verified(saved)


def test_an_altered_checkpoint_is_refused_at_resume(saved, tmp_path):
    _flip_byte_inside_a_tensor(saved)
    with pytest.raises(CorruptCheckpointError, match='epoch_1.pth'):
        verify_before_loading(saved)
    runner = toy_runner(tmp_path, 2, resume=True, load_from=saved)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    with pytest.raises(CorruptCheckpointError, match='epoch_1.pth'):
        runner.train()
    # Refused before anything loaded reached the model.
    after = runner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_empty_path_is_refused_before_any_thread_starts():
    with pytest.raises(FileNotFoundError, match='empty'):
        start_verification('')
