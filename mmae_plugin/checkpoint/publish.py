"""Putting a completely written checkpoint in place, and clearing what a
killed save left.

A checkpoint (a file, or an FSDP folder of ``rank<i>.pth``) is written
under a hidden partial name (``.<name>.pth.partial``), fsync'ed and renamed
into place; a save killed before the rename leaves only the partial name,
which the next start removes.
"""
import os
import os.path as osp
import re
import shutil

from .atomic_write import fsync_folder
from .integrity import remove_sidecars

PARTIAL_SUFFIX = '.partial'
_PARTIAL_NAME = re.compile(r'^\..+\.pth' + re.escape(PARTIAL_SUFFIX) + '$')


def remove_path(path: str) -> None:
    if osp.isdir(path) and not osp.islink(path):
        shutil.rmtree(path)
    elif osp.lexists(path):
        os.remove(path)


def remove_path_quietly(path: str) -> None:
    try:
        remove_path(path)
    except OSError:
        pass  # a later start removes it (remove_partial_checkpoints)


def _fsync_tree(path: str) -> None:
    files = [path] if osp.isfile(path) else \
        [osp.join(path, name) for name in os.listdir(path)]
    for file in files:
        with open(file, 'rb') as handle:
            os.fsync(handle.fileno())
    if osp.isdir(path):
        fsync_folder(path)


def publish_checkpoint(partial: str, final: str) -> None:
    """Move a completely written checkpoint into place.

    A checksum sidecar of plugin 0.3 and earlier describing the replaced
    file goes first (the record is what describes checkpoints now).

    Args:
        partial: The written file or FSDP folder.
        final: Its name.
    """
    _fsync_tree(partial)
    remove_sidecars(final)
    if osp.isdir(partial):
        # A folder cannot be renamed over a non-empty one: move the old one
        # aside first (a re-save of the same name).
        if osp.lexists(final):
            aside = f'{partial}.old'
            remove_path(aside)
            os.replace(final, aside)
            os.replace(partial, final)
            remove_path(aside)
        else:
            os.replace(partial, final)
    else:
        os.replace(partial, final)
    fsync_folder(osp.dirname(final) or '.')


def remove_partial_checkpoints(folder: str) -> None:
    """Delete ``.<name>.pth.partial`` files and folders of killed saves.

    Args:
        folder: A checkpoint folder (main process only).
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if _PARTIAL_NAME.match(name) or (name.endswith('.partial.old')
                                         and name.startswith('.')):
            remove_path(osp.join(folder, name))
