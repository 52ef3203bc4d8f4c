"""Verification before any of the plugin's loads of a checkpoint.

The plugin's runners (resume, ``load_from``, ``Pretrained`` init), the
frozen-encoder evaluation and the model zoo call :func:`verify_before_loading`
before handing a path to mmengine or torch; remote paths (``scheme://``)
are left to mmengine. A checkpoint recorded in the run record of its folder
is checked against its recorded size and SHA-256; any other against its
checksum sidecar (a downloaded zoo file) or its zip CRC-32s.
"""
import os
import os.path as osp
from typing import Any, Dict, Optional, Tuple

from .integrity import CorruptCheckpointError, verify_checkpoint
from .run_record import read_record


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
    from .discovery import newest_intact_sentence
    if not is_local_checkpoint(filename):
        return
    path = osp.expanduser(os.fspath(filename))
    if not path.strip():
        raise FileNotFoundError(
            'the checkpoint path is empty (load_from="" or --resume ""): '
            'name a checkpoint file')
    if not osp.exists(path):
        return
    entry = read_record(osp.dirname(osp.abspath(path))).find(path)
    if entry is None:
        verify_checkpoint(path, newest_intact_sentence(path))
        return
    problem = entry.problem()
    if problem is not None:
        raise CorruptCheckpointError(
            f'checkpoint {path} is damaged: {problem}. '
            f'{newest_intact_sentence(path)} If you replaced it on purpose, '
            'load it from another name or folder (a file outside the run '
            'record is checked by its zip structure only).')


def read_meta(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The ``meta`` of a resumable checkpoint, loaded with weights_only.

    Args:
        path: A local checkpoint file or FSDP folder (its ``rank0.pth``).

    Returns:
        ``(meta, None)``, or ``(None, why it is not a checkpoint mmengine
        can resume)``.
    """
    import torch
    file = osp.join(path, 'rank0.pth') if osp.isdir(path) else path
    try:
        checkpoint = torch.load(
            file, map_location='cpu', weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 (any failure: not resumable)
        return None, f'it cannot be loaded with weights_only ({err})'[:300]
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict):
        return None, ('it has no meta (a plain state dict or converted '
                      'weights, not a training checkpoint)')
    for key in ('epoch', 'iter'):
        if type(meta.get(key)) is not int or meta[key] < 0:
            return None, (f'its meta does not say its {key} (got '
                          f'{meta.get(key)!r}): not a training checkpoint')
    if 'state_dict' not in checkpoint or 'message_hub' not in checkpoint:
        return None, ('it lacks state_dict or message_hub: not a training '
                      'checkpoint mmengine can resume')
    return meta, None
