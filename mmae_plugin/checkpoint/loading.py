"""Verification before any of the plugin's loads of a checkpoint.

The plugin's runners (resume, ``load_from``, ``Pretrained`` init), the
frozen-encoder evaluation and the model zoo call :func:`verify_before_loading`
before handing a path to mmengine or torch; remote paths (``scheme://``)
are left to mmengine.
"""
import os
import os.path as osp
from typing import Any

from .discovery import newest_intact_sentence
from .integrity import verify_checkpoint


def is_local_checkpoint(filename: Any) -> bool:
    """Whether mmengine would read ``filename`` from this filesystem."""
    return isinstance(filename, (str, os.PathLike)) and \
        '://' not in os.fspath(filename) and \
        not os.fspath(filename).startswith('pavi:')


def verify_before_loading(filename: Any) -> None:
    """Refuse a damaged local checkpoint by name; leave others to mmengine.

    Args:
        filename: What ``resume`` / ``load_checkpoint`` was given.

    Raises:
        FileNotFoundError: The path is empty.
        CorruptCheckpointError: The checkpoint is damaged.
    """
    if not is_local_checkpoint(filename):
        return
    path = osp.expanduser(os.fspath(filename))
    if not path.strip():
        raise FileNotFoundError(
            'the checkpoint path is empty (load_from="" or --resume ""): '
            'name a checkpoint file')
    if osp.exists(path):
        verify_checkpoint(path, newest_intact_sentence(path))
