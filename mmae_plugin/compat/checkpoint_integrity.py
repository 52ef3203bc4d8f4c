"""Checkpoints written without a checksum and resumed without a check.

Upstream: mmengine 0.10.7 writes checkpoints with nothing to verify them by
and resumes from whatever ``last_checkpoint`` names. A truncated checkpoint
fails in torch with ``PytorchStreamReader failed reading zip archive``
without naming the file and without trying the intact older checkpoint
beside it; bytes flipped inside a tensor record resume silently (torch does
not check the zip's CRC-32s); an empty ``last_checkpoint`` ends in
``FileNotFoundError:  can not be found.``; a full disk in ``[Errno 28] No
space left on device`` without the file's name. Not fixed in any mmengine
release as of 0.10.7.

What changes, for local files only (other backends, also a plain path saved
through ``backend_args=dict(backend='petrel')``, are left to upstream):

* ``save_checkpoint``: once the checkpoint is complete, its SHA-256 goes to
  the hidden file ``.<name>.sha256`` beside it (``sha256sum -c`` format,
  replaced atomically by :mod:`.atomic_checkpoint_write`); ``CheckpointHook``
  writes ``last_checkpoint`` only after that. An ``OSError`` of the write
  names the checkpoint. Hidden, because code that lists a work dir by name
  (mmengine's own tests count the files starting with ``best``; ``glob``
  patterns such as ``epoch_*``) must see only what mmengine wrote.
  ``<name>.sha256``, the visible sidecar plugin 0.2.0 wrote, is still read;
  a new save of the same name replaces it by the hidden one.
* The local loader (``load_from``, ``--resume``, ``Pretrained`` init,
  ``get_model``): a checkpoint that fails verification (below) raises
  :class:`CorruptCheckpointError` naming it and the newest intact
  checkpoint in its folder; every error of reading a checkpoint names the
  file; an empty path is refused by name. Verification reads the file once
  more before torch does (a SHA-256 or CRC-32 pass, about a second per GB;
  a file is verified once per process while unchanged).
* ``find_latest_checkpoint`` (auto-resume): what ``last_checkpoint`` names is
  verified; if ``last_checkpoint`` is empty or names a missing, truncated or
  corrupt file, a warning names the problem and the newest intact
  checkpoint of that folder is resumed instead; with none, the error names
  the bad file.

Intact means: the SHA-256 matches the digest of a sidecar (either name);
without one (written without the plugin, or a kill between checkpoint and
sidecar), a zip archive whose members all match their CRC-32 (Python's
``zipfile``). Files that are not zip archives (torch's legacy format) are
left to torch.
"""
import functools
import hashlib
import inspect
import os
import os.path as osp
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Optional, Tuple

SIDECAR_SUFFIX = '.sha256'
_CHUNK = 1 << 22
# Verification results by (path, inode, size, mtime, sidecar mtimes): resume
# verifies the candidate in find_latest_checkpoint and again when the loader
# opens it; hashing a multi-GB file twice would double the resume time for
# nothing.
_VERIFIED: Dict[Tuple[Any, ...], Optional[str]] = {}


class CorruptCheckpointError(RuntimeError):
    """A checkpoint that is truncated, or whose bytes changed after saving."""


class CheckpointIntegrityWarning(UserWarning):
    """Auto-resume skipped a damaged checkpoint."""


def sidecar_path(checkpoint: str) -> str:
    """Where the checksum of ``checkpoint`` is written.

    Args:
        checkpoint: Path of a checkpoint file.

    Returns:
        ``<folder>/.<name>.sha256``: hidden, so listings by name (``best*``,
        ``epoch_*``) see only the checkpoints.
    """
    folder, name = osp.split(checkpoint)
    return osp.join(folder, f'.{name}{SIDECAR_SUFFIX}')


def legacy_sidecar_path(checkpoint: str) -> str:
    """Where plugin 0.2.0 wrote the checksum of ``checkpoint``.

    Args:
        checkpoint: Path of a checkpoint file.

    Returns:
        ``<checkpoint>.sha256``.
    """
    return checkpoint + SIDECAR_SUFFIX


def sidecar_paths(checkpoint: str) -> Tuple[str, str]:
    """Every place a checksum of ``checkpoint`` may be kept, newest first.

    Args:
        checkpoint: Path of a checkpoint file.

    Returns:
        The hidden sidecar's path, then the 0.2.0 one's.
    """
    return sidecar_path(checkpoint), legacy_sidecar_path(checkpoint)


def is_local_path(path: Any) -> bool:
    """Whether mmengine would read ``path`` with its local file backend.

    Args:
        path: A checkpoint path or URI.

    Returns:
        True for a plain filesystem path (no ``scheme://`` prefix).
    """
    return isinstance(path, (str, os.PathLike)) and \
        '://' not in os.fspath(path)


def file_sha256(path: str) -> str:
    """SHA-256 of a file, read in chunks.

    Args:
        path: File to hash.

    Returns:
        The hex digest.
    """
    digest = hashlib.sha256()
    with open(path, 'rb') as file:
        for chunk in iter(lambda: file.read(_CHUNK), b''):
            digest.update(chunk)
    return digest.hexdigest()


def write_sidecar(checkpoint: str) -> None:
    """Write the hidden sidecar of a complete checkpoint.

    A 0.2.0 sidecar of the same name described the file this save replaced,
    so it goes once the new digest is on disk.

    Args:
        checkpoint: Local path of the checkpoint just written.
    """
    from mmengine.fileio.backends import LocalBackend
    line = f'{file_sha256(checkpoint)}  {osp.basename(checkpoint)}\n'
    LocalBackend().put_text(line, sidecar_path(checkpoint))
    try:
        os.remove(legacy_sidecar_path(checkpoint))
    except FileNotFoundError:
        pass


def read_sidecar(sidecar: str, checkpoint: str) -> Optional[str]:
    """The SHA-256 recorded in one sidecar, or None if it does not exist.

    Args:
        sidecar: The sidecar's path.
        checkpoint: The checkpoint it describes (for the message).

    Returns:
        The hex digest written at save time, or None.

    Raises:
        CorruptCheckpointError: The sidecar exists but holds no digest.
    """
    try:
        with open(sidecar) as file:
            text = file.read()
    except FileNotFoundError:
        return None
    digest = text.split()[0] if text.split() else ''
    if len(digest) != 64 or any(c not in '0123456789abcdef' for c in digest):
        raise CorruptCheckpointError(
            f'checksum file {sidecar} holds no SHA-256 '
            f'(got {text[:80]!r}); delete it to load {checkpoint} unchecked')
    return digest


def recorded_digests(checkpoint: str) -> Dict[str, str]:
    """Every SHA-256 recorded for ``checkpoint``, by sidecar path.

    Args:
        checkpoint: Local checkpoint path.

    Returns:
        ``{sidecar path: digest}`` for the sidecars present (hidden first);
        empty without any.

    Raises:
        CorruptCheckpointError: A sidecar exists but holds no digest.
    """
    digests = {}
    for sidecar in sidecar_paths(checkpoint):
        digest = read_sidecar(sidecar, checkpoint)
        if digest is not None:
            digests[sidecar] = digest
    return digests


def _mtime_or_absent(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1  # no sidecar (or removed since: verify again)


def zip_problem(path: str) -> Optional[str]:
    """What is wrong with a checkpoint that has no sidecar, if anything.

    Args:
        path: Local checkpoint path.

    Returns:
        None if it is a zip archive whose members match their CRC-32s or
        not a zip archive at all (left to torch); else the problem.
    """
    with open(path, 'rb') as file:
        magic = file.read(4)
    if magic != b'PK\x03\x04':
        return 'it is empty' if not magic else None
    try:
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        return f'it is not a complete zip archive (truncated?): {err}'
    if bad_member is not None:
        return f'the CRC-32 of its record {bad_member!r} does not match'
    return None


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` is not an intact checkpoint, or None if it is.

    Args:
        path: Local checkpoint path.

    Returns:
        None if intact; else a sentence fragment saying what is wrong.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return 'it does not exist'
    except OSError as err:
        return f'it cannot be read ({err})'
    key = (osp.realpath(path), info.st_ino, info.st_size, info.st_mtime_ns,
           *(_mtime_or_absent(sidecar) for sidecar in sidecar_paths(path)))
    if key not in _VERIFIED:
        _VERIFIED[key] = _compute_problem(path)
    return _VERIFIED[key]


def _compute_problem(path: str) -> Optional[str]:
    try:
        expected = recorded_digests(path)
        if not expected:
            return zip_problem(path)
        actual = file_sha256(path)
    except CorruptCheckpointError as err:
        return str(err)
    except OSError as err:
        return f'it cannot be read ({err})'
    # Either sidecar matching is a complete save: both exist after a kill
    # between writing the hidden one and removing the 0.2.0 one, or when
    # plugin 0.2.0 saved again over a checkpoint a later version wrote.
    if actual in expected.values():
        return None
    sidecar, digest = next(iter(expected.items()))
    return (f'its SHA-256 {actual} differs from {digest} recorded in '
            f'{sidecar} at save time (truncated or corrupted since; if you '
            'replaced the file on purpose, delete its checksum file '
            f'{" and ".join(expected)})')


def candidate_checkpoints(folder: str, exclude: str = '') -> List[str]:
    """Checkpoints in ``folder``, the most recently written first.

    Args:
        folder: Folder to look in.
        exclude: A path to leave out (the damaged one).

    Returns:
        ``*.pth`` regular files (``best_*`` last: they hold no optimizer
        state), newest modification time first.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    paths = []
    for name in names:
        path = osp.join(folder, name)
        if name.endswith('.pth') and osp.isfile(path) and \
                osp.realpath(path) != osp.realpath(exclude or '/nonexistent'):
            paths.append(path)

    def order(path: str) -> Tuple[bool, float, str]:
        return (osp.basename(path).startswith('best_'),
                -os.stat(path).st_mtime_ns, path)

    return sorted(paths, key=order)


def newest_intact_checkpoint(folder: str, exclude: str = '') -> Optional[str]:
    """The newest checkpoint in ``folder`` that passes verification.

    Args:
        folder: Folder to look in.
        exclude: A path to leave out.

    Returns:
        Its path, or None.
    """
    for path in candidate_checkpoints(folder, exclude):
        if checkpoint_problem(path) is None:
            return path
    return None


def alternative_sentence(path: str) -> str:
    """What to resume from instead of a damaged ``path``.

    Args:
        path: The damaged checkpoint.

    Returns:
        A sentence naming the newest intact checkpoint beside it, if any.
    """
    folder = osp.dirname(osp.abspath(path))
    intact = newest_intact_checkpoint(folder, exclude=path)
    if intact is None:
        return f'No intact checkpoint is left in {folder}.'
    return (f'The newest intact checkpoint in {folder} is {intact} '
            f'(pass --resume {intact}, or resume automatically).')


def error_naming_file(err: BaseException, path: str) -> BaseException:
    """``err`` with ``path`` in its message, same type where possible.

    Args:
        err: An exception raised while reading or writing ``path``.
        path: The checkpoint (or sidecar) concerned.

    Returns:
        A new exception to raise ``from err``, or ``err`` itself when its
        message already names the file or its type cannot be rebuilt.
    """
    if isinstance(err, OSError):
        if err.filename == path:
            return err
        if err.errno is not None:
            return OSError(err.errno, err.strerror, path)
        return OSError(f'{path}: {err}')
    if path in str(err):
        return err
    try:
        return type(err)(f'reading checkpoint {path} failed: {err}')
    except Exception:  # an exception type with another signature
        return err


def guard_local_loader(original: Callable) -> Callable:
    """Wrap mmengine's local checkpoint loader with verification.

    Args:
        original: The loader registered for local paths.

    Returns:
        A loader that refuses damaged checkpoints by name.
    """

    @functools.wraps(original)
    def load_from_local(filename: str, map_location=None) -> Any:
        if not os.fspath(filename).strip():
            raise FileNotFoundError(
                'the checkpoint path is empty (an empty last_checkpoint '
                'file, or load_from=""): name a checkpoint file')
        path = osp.expanduser(os.fspath(filename))
        if osp.isfile(path):
            problem = checkpoint_problem(path)
            if problem is not None:
                raise CorruptCheckpointError(
                    f'checkpoint {path} is damaged: {problem}. '
                    f'{alternative_sentence(path)}')
        try:
            return original(filename, map_location)
        except FileNotFoundError:
            raise  # mmengine's message names the file
        except Exception as err:
            if not osp.isfile(path):
                raise
            problem = zip_problem(path)
            named = error_naming_file(err, path)
            if problem is not None:
                raise CorruptCheckpointError(
                    f'checkpoint {path} is damaged: {problem}. '
                    f'{alternative_sentence(path)}') from err
            if named is err:
                raise
            raise named from err

    load_from_local._mmae_integrity = True
    return load_from_local


def verified_latest(original: Callable) -> Callable:
    """Wrap ``find_latest_checkpoint`` to skip damaged checkpoints.

    Args:
        original: mmengine's ``find_latest_checkpoint``.

    Returns:
        A function with the same signature and result type.
    """

    @functools.wraps(original)
    def find_latest_checkpoint(path: str) -> Optional[str]:
        last_saved = original(path)
        if last_saved is None or not is_local_path(path):
            return last_saved
        if not last_saved.strip():
            problem, folder = (f'{osp.join(path, "last_checkpoint")} is '
                               'empty'), path
        elif is_local_path(last_saved):
            damage = checkpoint_problem(last_saved)
            if damage is None:
                return last_saved
            problem = f'the last checkpoint {last_saved} is unusable: {damage}'
            folder = osp.dirname(osp.abspath(last_saved))
        else:
            return last_saved
        intact = newest_intact_checkpoint(folder, exclude=last_saved.strip())
        if intact is None:
            raise CorruptCheckpointError(
                f'cannot resume automatically: {problem}, and no intact '
                f'checkpoint is left in {folder}')
        warnings.warn(f'{problem}; resuming from {intact}, the newest intact '
                      'checkpoint in that folder, instead',
                      CheckpointIntegrityWarning)
        return intact

    find_latest_checkpoint._mmae_integrity = True
    return find_latest_checkpoint


def saved_to_local_file(filename: Any, file_client_args: Optional[dict],
                        backend_args: Optional[dict]) -> bool:
    """Whether mmengine's ``save_checkpoint`` writes ``filename`` locally.

    The path alone does not tell: ``CheckpointHook(backend_args=dict(
    backend='petrel'))`` saves a plain path such as ``/work/epoch_1.pth``
    to object storage. The backend is chosen as upstream chooses it.

    Args:
        filename: The checkpoint path or URI.
        file_client_args: The deprecated backend arguments, if given.
        backend_args: The backend arguments, if given.

    Returns:
        True when the file lands on this machine's filesystem.
    """
    if not is_local_path(filename) or \
            os.fspath(filename).startswith('pavi:'):
        return False
    from mmengine.fileio import FileClient, get_file_backend
    from mmengine.fileio.backends import LocalBackend
    if file_client_args is not None:
        backend = FileClient.infer_client(file_client_args, filename).client
    else:
        backend = get_file_backend(filename, backend_args=backend_args)
    return isinstance(backend, LocalBackend)


def checksummed_save(original: Callable) -> Callable:
    """Wrap mmengine's ``save_checkpoint`` to add the sidecar.

    Args:
        original: ``mmengine.runner.checkpoint.save_checkpoint``.

    Returns:
        The same function, followed by :func:`write_sidecar` for local
        files, with I/O errors naming the checkpoint.
    """
    signature = inspect.signature(original)

    @functools.wraps(original)
    def save_checkpoint(checkpoint, filename, *args, **kwargs) -> None:
        try:
            bound = signature.bind(checkpoint, filename, *args, **kwargs)
        except TypeError:  # upstream raises its own error for the call
            return original(checkpoint, filename, *args, **kwargs)
        local = saved_to_local_file(
            filename, bound.arguments.get('file_client_args'),
            bound.arguments.get('backend_args'))
        try:
            original(checkpoint, filename, *args, **kwargs)
            if local:
                write_sidecar(os.fspath(filename))
        except OSError as err:
            named = error_naming_file(err, os.fspath(filename)) \
                if local else err
            if named is err:
                raise
            raise named from err

    save_checkpoint._mmae_integrity = True
    return save_checkpoint


def _rebind(name: str, original: Callable, replacement: Callable) -> None:
    """Point every loaded mmengine module's ``name`` at ``replacement``.

    mmengine imports these functions by name into several modules
    (``runner``, ``runner.runner``, ``runner._flexible_runner``, strategies);
    each binding of the original is replaced.
    """
    import sys
    for module_name, module in list(sys.modules.items()):
        if module_name.split('.')[0] == 'mmengine' and \
                getattr(module, name, None) is original:
            setattr(module, name, replacement)


def verify_checkpoints() -> None:
    """Checksum sidecars on save; verification and fallback on load."""
    import mmengine.runner  # noqa: F401 (binds the names to rebind)
    import mmengine.runner._flexible_runner  # noqa: F401
    import mmengine.runner.checkpoint as checkpoint_module
    from mmengine.runner.checkpoint import CheckpointLoader

    local_loader = CheckpointLoader._schemes['']
    if not getattr(local_loader, '_mmae_integrity', False):
        CheckpointLoader.register_scheme(
            prefixes='', force=True)(guard_local_loader(local_loader))
    for name, wrap in (('save_checkpoint', checksummed_save),
                       ('find_latest_checkpoint', verified_latest)):
        original = getattr(checkpoint_module, name)
        if not getattr(original, '_mmae_integrity', False):
            _rebind(name, original, wrap(original))
