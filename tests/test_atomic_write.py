"""Atomic writes of the checkpoint hook's files (sidecars, last_checkpoint).

``write_atomically`` itself on real files, and what the plugin's hook and
runner leave in a work dir: a reader of ``last_checkpoint`` sees the old or
the new text, never half; temporaries of dead writers of this host are
removed, every other writer's are kept; modes, groups and xattrs survive.
"""
import errno
import os

import pytest
from checkpoint_fault_tools import toy_runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.checkpoint.atomic_write import (atomic_write_target,
                                                 write_atomically,
                                                 writer_identity)


@pytest.fixture
def umask():
    """Set the umask for one test and restore it."""
    saved = os.umask(0o022)
    yield os.umask
    os.umask(saved)


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / 'last_checkpoint'
    write_atomically('epoch_1.pth', str(path), mode='w')
    with pytest.raises(TypeError):
        write_atomically(object(), str(path))  # cannot be written
    assert path.read_text() == 'epoch_1.pth'
    assert os.listdir(tmp_path) == ['last_checkpoint']


def test_last_checkpoint_is_replaced_not_rewritten_in_place(tmp_path):
    last = tmp_path / 'last_checkpoint'
    last.write_text('stale')
    reader = open(last)  # a reader of the old file keeps a whole old file
    old_inode = last.stat().st_ino
    toy_runner(tmp_path, max_epochs=1).train()
    assert last.read_text() == str(tmp_path / 'epoch_1.pth')
    assert last.stat().st_ino != old_inode  # renamed over, not truncated
    assert reader.read() == 'stale'
    reader.close()


def own_temporary(name, pid, suffix='abcdefgh'):
    """A temporary named as this host's writer ``pid`` names it."""
    return f'.{name}.{writer_identity()}.{pid}.{suffix}.tmp'


def test_orphan_temporaries_removed_at_start_and_on_next_write(tmp_path):
    dead = 999999999  # above Linux's pid_max: no such process
    orphans = [
        own_temporary('.epoch_1.pth.sha256', dead, 'k2j4_x9a'),
        own_temporary('last_checkpoint', dead)
    ]
    host, boot, namespace = writer_identity().rsplit('-', 2)
    kept = [
        '.hidden.tmp',
        f'epoch_0.pth.{dead}.abcdefgh.tmp',
        'notes.txt',
        own_temporary('epoch_1.pth', os.getpid()),  # a live writer: us
        # Writers whose pids this process cannot see: another host on the
        # shared filesystem, another boot, another pid namespace.
        f'.epoch_1.pth.otherhost-{boot}-{namespace}.{dead}.abcdefgh.tmp',
        f'.epoch_1.pth.{host}-00000000-{namespace}.{dead}.abcdefgh.tmp',
        f'.epoch_1.pth.{host}-{boot}-1.{dead}.abcdefgh.tmp'
    ]
    for name in orphans + kept:
        (tmp_path / name).write_bytes(b'half')
    toy_runner(tmp_path, max_epochs=1).train()
    left = set(os.listdir(tmp_path))
    assert not left & set(orphans)
    assert set(kept) | {'epoch_1.pth', 'last_checkpoint'} <= left
    (tmp_path / own_temporary('a.txt', dead)).write_bytes(b'half')
    (tmp_path / own_temporary('b.txt', dead)).write_bytes(b'half')
    write_atomically(b'data', str(tmp_path / 'a.txt'))
    assert not (tmp_path / own_temporary('a.txt', dead)).exists()
    assert (tmp_path / own_temporary('b.txt', dead)).exists()


def test_foreign_writers_live_temporary_survives_our_write(tmp_path):
    """Writer B on another host is half-way through the same file."""
    target = tmp_path / 'metrics.json'
    foreign = tmp_path / ('.metrics.json.node-b-0123abcd-4026531836.'
                          '999999999.q1w2e3r4.tmp')
    foreign.write_text('{"acc": 1')
    write_atomically('{"acc": 0.5}', str(target), mode='w')
    assert target.read_text() == '{"acc": 0.5}'
    with open(foreign, 'a') as b_file:
        b_file.write('}')
    os.replace(foreign, target)
    assert target.read_text() == '{"acc": 1}'


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to chgrp')
def test_replacement_keeps_group_mode_and_xattrs(tmp_path, umask):
    path = tmp_path / '.epoch_1.pth.sha256'
    path.write_bytes(b'old')
    os.chown(path, -1, 12345)
    os.chmod(path, 0o640)
    try:
        os.setxattr(path, 'user.origin', b'cluster-a')
        has_xattrs = True
    except OSError:  # filesystem without user xattrs
        has_xattrs = False
    umask(0o077)
    inode = path.stat().st_ino
    write_atomically(b'new', str(path))
    info = path.stat()
    assert info.st_ino != inode
    assert (path.read_bytes(), info.st_gid, info.st_mode & 0o7777) == \
        (b'new', 12345, 0o640)
    if has_xattrs:
        assert os.getxattr(path, 'user.origin') == b'cluster-a'


@pytest.mark.parametrize('mask', [0o022, 0o077, 0o002])
def test_new_files_follow_the_umask_like_open(tmp_path, umask, mask):
    umask(mask)
    write_atomically(b'x', str(tmp_path / 'ours'))
    with open(tmp_path / 'plain', 'wb'):
        pass
    assert os.stat(tmp_path / 'ours').st_mode == \
        os.stat(tmp_path / 'plain').st_mode


def test_disk_full_error_names_the_file(small_disk):
    path = small_disk / 'last_checkpoint'
    path.write_bytes(b'old')
    with pytest.raises(OSError, match='last_checkpoint') as info:
        write_atomically(b'x' * (2 << 20), str(path))
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == b'old'
    assert os.listdir(small_disk) == ['last_checkpoint']


def test_rename_is_used_only_where_it_equals_an_in_place_write(tmp_path):
    assert atomic_write_target('/dev/null') is None
    first = tmp_path / 'a'
    first.write_bytes(b'x')
    os.link(first, tmp_path / 'b')
    assert atomic_write_target(str(first)) is None  # a hard link
    link = tmp_path / 'link'
    link.symlink_to(tmp_path / 'new')
    assert atomic_write_target(str(link)) == str(tmp_path / 'new')
