"""Verification before any of the plugin's loads of a checkpoint.

The plugin's runners, the frozen-encoder evaluation and the model zoo call
:func:`verify_before_loading` before handing a local path to mmengine or
torch (remote ``scheme://`` paths are left to mmengine): a checkpoint of
its folder's run record is checked against its recorded size and SHA-256,
any other against its checksum sidecar or its zip CRC-32s.
:func:`start_verification` runs the same checks in a thread while the
caller loads the file (read from disk once), and :func:`load_verified`
does both for one file. See
docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own.
"""
import os
import os.path as osp
import threading
from typing import Any, Dict, Optional, Tuple

from .integrity import CorruptCheckpointError, verify_checkpoint
from .run_record import newest_intact_sentence, read_record


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


class BackgroundVerification:
    """:func:`verify_before_loading` of one checkpoint, run in a thread.

    Args:
        filename: What ``resume`` / ``load_checkpoint`` was given.
    """

    def __init__(self, filename: Any) -> None:
        self.filename = filename
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(
            target=self._run, name='checkpoint-verification', daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            verify_before_loading(self.filename)
        except BaseException as err:  # re-raised by wait(), in the caller
            self._error = err

    def wait(self) -> None:
        """Block until verified; raise what verification raised.

        Raises:
            CorruptCheckpointError: The checkpoint is damaged.
            OSError: It could not be read.
        """
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def start_verification(filename: Any) -> BackgroundVerification:
    """Start verifying a checkpoint; load it meanwhile, then ``wait()``.

    Nothing loaded may be used before :meth:`BackgroundVerification.wait`
    returned. The cheap refusals (an empty path) are raised at once.

    Args:
        filename: What ``resume`` / ``load_checkpoint`` was given.

    Returns:
        The running verification.

    Raises:
        FileNotFoundError: The path is empty.
    """
    if is_local_checkpoint(filename) and not os.fspath(filename).strip():
        verify_before_loading(filename)  # raises, naming the empty path
    return BackgroundVerification(filename)


def load_verified(filename: str, map_location: Any = 'cpu') -> Any:
    """``torch.load`` with ``weights_only``, verified in parallel.

    A damaged file raises :class:`CorruptCheckpointError` naming it, also
    when ``torch.load`` failed on it first (a truncated zip).

    Args:
        filename: A local checkpoint file.
        map_location: As for ``torch.load``.

    Returns:
        The loaded checkpoint, once verified.

    Raises:
        CorruptCheckpointError: The checkpoint is damaged.
    """
    import torch
    verification = start_verification(filename)
    try:
        checkpoint = torch.load(
            filename, map_location=map_location, weights_only=True)
    except Exception:
        verification.wait()  # a damaged file: say so, not how it failed
        raise
    verification.wait()
    return checkpoint


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
    problem = training_meta_problem(checkpoint)
    return (None, problem) if problem else (checkpoint['meta'], None)


def training_meta_problem(checkpoint: Any,
                          whole: bool = True) -> Optional[str]:
    """Why ``checkpoint`` is not a training checkpoint mmengine can resume.

    Args:
        checkpoint: A loaded checkpoint.
        whole: Also require ``state_dict`` and ``message_hub`` (a file as
            saved; a strategy's resume takes the weights out first).

    Returns:
        A sentence fragment, or None when its ``meta`` says its epoch and
        iteration (and, if ``whole``, it holds the two).
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    missing = [
        key for key in ('epoch', 'iter') if not isinstance(meta, dict)
        or type(meta.get(key)) is not int or meta[key] < 0
    ]
    if missing:
        return (f'its meta does not say its {" and ".join(missing)} (a '
                'plain state dict, converted weights or a classifier '
                'checkpoint, not a training checkpoint)')
    if whole and ('state_dict' not in checkpoint
                  or 'message_hub' not in checkpoint):
        return ('it lacks state_dict or message_hub: not a training '
                'checkpoint mmengine can resume')
    return None
