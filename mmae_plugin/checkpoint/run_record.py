"""The run record: every checkpoint a run finalized, written down in order.

``checkpoint_record.jsonl`` in the run's checkpoint folder is the one
source of truth about a run's checkpoints.
:class:`~mmae_plugin.engine.hooks.SafeCheckpointHook` appends one fsync'ed
JSON line per event:

* ``start``: ``run_id``, ``config_digest``, ``launch``, ``resumed_iter``;
* ``saved``: ``path``, ``epoch``, ``iter``, ``size``, ``sha256`` (of the
  bytes as written, :mod:`.digest_write`), ``file_id`` (device, inode,
  modification time), ``layout``, ``best``, ``run_id``,
  ``config_digest``, ``launch``;
* ``removed``: written before retention deletes a file (``left``: why a
  file was left in place instead).

``path`` is a bare name in the record's folder (:func:`is_bare_name`);
anything else is skipped as damaged. Reading folds the lines in order: a
later ``saved`` replaces an earlier one, ``removed`` drops it, a ``start``
that resumed at iteration I drops the run's entries after I, and a damaged
line costs its own entry only. The contract:
docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own.
"""
import hashlib
import json
import os
import os.path as osp
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .atomic_write import fsync_folder
from .bounded_read import UnsafeFileError, file_kind, read_small_text

RECORD_NAME = 'checkpoint_record.jsonl'
#: Largest record read (a line is ~400 bytes: ~150,000 saves).
RECORD_LIMIT = 64 << 20
_CHUNK = 1 << 22
_RANK_FILE = re.compile(r'^rank(\d+)\.pth$')
_INT_FIELDS = ('epoch', 'iter', 'size')
_STR_FIELDS = ('path', 'sha256', 'run_id')
_LINK_REFUSAL = ('run record {path} is a symbolic link; refusing to {verb} '
                 'it (a record describes the files of its own folder, and a '
                 'link may lead to another run\'s). Replace it with the '
                 'record file itself, or remove it.')


def record_path(folder: str) -> str:
    """Where the run record of a checkpoint folder is."""
    return osp.join(str(folder), RECORD_NAME)


def checkpoint_folder(work_dir: str, out_dir: Optional[str] = None) -> str:
    """The folder a checkpoint hook with ``out_dir`` saves into.

    Args:
        work_dir: The runner's work folder.
        out_dir: The hook's ``out_dir`` as configured (None: the work
            folder).

    Returns:
        ``work_dir``, or ``<out_dir>/<work folder name>`` as mmengine's
        ``CheckpointHook`` places checkpoints outside the work folder.
    """
    work_dir = str(work_dir)
    if out_dir is None or str(out_dir) == work_dir:  # as mmengine compares
        return work_dir
    return osp.join(str(out_dir), osp.basename(work_dir.rstrip(osp.sep)))


def is_bare_name(path: Any) -> bool:
    """Whether ``path`` names a file of the record's own folder only.

    Args:
        path: A record entry's ``path``.

    Returns:
        False for anything with a separator, ``.``, ``..``, an absolute
        path or a NUL byte.
    """
    return isinstance(path, str) and path not in ('', '.', '..') and \
        not any(c in path for c in ('/', '\\', '\x00')) and \
        not osp.isabs(path)


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


def rank_files(folder: str) -> List[str]:
    """The ``rank<i>.pth`` files of an FSDP checkpoint folder, by rank."""
    names = [n for n in os.listdir(folder) if _RANK_FILE.match(n)]
    return sorted(names, key=lambda n: int(_RANK_FILE.match(n).group(1)))


@dataclass(frozen=True)
class FileDigest:
    """Size and SHA-256 of a file's bytes, taken as they were written.

    Args:
        size: Bytes written.
        sha256: Hex digest of those bytes.
    """
    size: int
    sha256: str


#: Digests taken while files were written, by absolute path.
WrittenDigests = Mapping[str, FileDigest]


def _file_fingerprint(path: str, written: WrittenDigests) -> FileDigest:
    # A digest taken while the file was written stands for it only while
    # the file has the size written; anything else is hashed from disk.
    size = os.path.getsize(path)
    known = written.get(osp.abspath(path))
    if known is not None and known.size == size:
        return known
    return FileDigest(size, file_sha256(path))


def fingerprint(
    checkpoint: str,
    written: Optional[WrittenDigests] = None
) -> Tuple[int, str, Optional[int]]:
    """Size, SHA-256 and rank count of a checkpoint file or FSDP folder.

    A folder's size is the sum of its rank files' and its digest the
    SHA-256 of their ``sha256sum`` lines (``<digest>  rank<i>.pth``).

    Args:
        checkpoint: Local path.
        written: Digests taken while files were written, by absolute path
            (:class:`~.digest_write.DigestingLocalBackend`); a file not in it,
            or whose size differs, is read and hashed.

    Returns:
        ``(size, sha256, ranks)``; ``ranks`` None for a file.
    """
    written = written or {}
    if not osp.isdir(checkpoint):
        digest = _file_fingerprint(checkpoint, written)
        return digest.size, digest.sha256, None
    ranks = rank_files(checkpoint)
    digests = [
        _file_fingerprint(osp.join(checkpoint, r), written) for r in ranks
    ]
    lines = ''.join(f'{d.sha256}  {r}\n' for d, r in zip(digests, ranks))
    size = sum(d.size for d in digests)
    return size, hashlib.sha256(lines.encode()).hexdigest(), len(ranks)


def append_event(work_dir: str, event: Dict[str, Any]) -> None:
    """Append one event line to the record and fsync it.

    A previous writer killed mid-line left no newline; one is written
    first, so the damage stays in that line.

    Args:
        work_dir: The run's work folder.
        event: JSON-serialisable fields (``event`` names the kind).

    Raises:
        UnsafeFileError: The record's path holds something other than a
            regular file (a FIFO, a device, a folder), named.
        OSError: A failed write (a full disk), naming the record; the
            errno is the system's.
    """
    path = record_path(work_dir)
    line = json.dumps(event, sort_keys=True, separators=(',', ':')) + '\n'
    if osp.isdir(path):
        raise UnsafeFileError(
            f'run record {path} is a directory, not a regular file; '
            'refusing to append to it. Move it out of the work folder: the '
            'record is a file the plugin writes itself.')
    try:
        size = _append_line(path, line)
    except UnsafeFileError:
        raise
    except OSError as err:
        raise OSError(
            err.errno, f'{err.strerror or err} (appending to the run '
            f'record {path}; it keeps its intact entries: a partly written '
            'last line costs only that entry)', path) from err
    if size == 0:
        fsync_folder(str(work_dir))


def _append_line(path: str, line: str) -> int:
    """Append ``line`` to the regular file ``path``; its size before."""
    if osp.islink(path):
        raise UnsafeFileError(
            _LINK_REFUSAL.format(path=path, verb='append to'))
    fd = os.open(
        path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
        | getattr(os, 'O_NOFOLLOW', 0), 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(
                f'run record {path} is {file_kind(info.st_mode)}, not a '
                'regular file; refusing to append to it. Move it out of the '
                'work folder: the record is a file the plugin writes itself.')
        size = info.st_size
        if size and os.pread(fd, 1, size - 1) != b'\n':
            line = '\n' + line
        data = line.encode('utf-8')
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


@dataclass
class Entry:
    """One finalized checkpoint of the record.

    Args:
        fields: The ``saved`` event as written.
        work_dir: The record's folder (``path`` is a name in it).
    """
    fields: Dict[str, Any]
    work_dir: str

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__['fields'][name]
        except KeyError as err:
            raise AttributeError(name) from err

    @property
    def location(self) -> str:
        """The checkpoint's local path (in the record's folder)."""
        return osp.join(self.work_dir, self.fields['path'])

    def removal_problem(self) -> Optional[str]:
        """Why retention must leave this checkpoint's file, or None.

        The file is the one the run wrote when its device, inode,
        modification time and size are the recorded ones, or (a copied or
        moved experiment) its size and SHA-256 are.

        Returns:
            None when it may be deleted; ``'missing'`` when it is gone.
        """
        try:
            info = os.lstat(self.location)
        except FileNotFoundError:
            return 'missing'
        except OSError as err:
            return f'it cannot be read ({err})'
        if stat.S_ISLNK(info.st_mode):
            return ('it is a symbolic link now, not the checkpoint the run '
                    'wrote')
        if self.fields.get('file_id') == _file_id(info) and \
                stat.S_ISREG(info.st_mode) and info.st_size == self.size:
            return None
        return self.problem()

    def problem(self) -> Optional[str]:
        """Why the file no longer is what was recorded, or None.

        Returns:
            None when the file or folder has the recorded size and hash.
        """
        path = self.location
        try:
            if not (osp.isfile(path) or osp.isdir(path)):
                return 'it does not exist (any more)' \
                    if not osp.lexists(path) else \
                    'it is not a regular file or a checkpoint folder'
            size, digest, ranks = _cached_fingerprint(path)
        except OSError as err:
            return f'it cannot be read ({err})'
        if size != self.size:
            return (f'it has {size} bytes, not the {self.size} recorded when '
                    'it was saved (truncated or replaced since)')
        if digest != self.sha256:
            return ('its SHA-256 differs from the one recorded when it was '
                    'saved (corrupted or replaced since)')
        return None


_FINGERPRINTS: Dict[Tuple, Tuple[int, str, Optional[int]]] = {}


def _cached_fingerprint(path: str) -> Tuple[int, str, Optional[int]]:
    # Resume verifies the chosen checkpoint, then loads it; hashing a
    # multi-GB file twice would double the resume time for nothing.
    paths = [path] + ([osp.join(path, r)
                       for r in rank_files(path)] if osp.isdir(path) else [])
    key = tuple((p, s.st_ino, s.st_size, s.st_mtime_ns)
                for p, s in ((p, os.stat(p)) for p in paths))
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = fingerprint(path)
    return _FINGERPRINTS[key]


@dataclass
class RunRecord:
    """The record of a work folder, folded.

    Args:
        work_dir: The record's folder (the run's checkpoint folder).
        run_id: The run of the last ``start`` (None without one).
        entries: Finalized checkpoints that were not removed, by path.
        written: The run id that last saved each name not removed since,
            entries of abandoned branches included: whose file it is.
        damaged: Line numbers (1-based) of lines skipped as damaged.
        uncontained: ``(line, path)`` of entries skipped for naming
            something other than a file of the record's folder.
        exists: Whether the record file exists.
        unreadable: Why the record could not be read at all, or None.
    """
    work_dir: str
    run_id: Optional[str] = None
    entries: Dict[str, Entry] = field(default_factory=dict)
    written: Dict[str, str] = field(default_factory=dict)
    damaged: List[int] = field(default_factory=list)
    uncontained: List[Tuple[int, str]] = field(default_factory=list)
    exists: bool = False
    unreadable: Optional[str] = None

    def checkpoints(self,
                    run_id: Optional[str] = None,
                    best: bool = False) -> List[Entry]:
        """The run's entries, newest (highest global iteration) first.

        Args:
            run_id: Whose entries; the current run's by default.
            best: Best-metric checkpoints instead of the regular ones.

        Returns:
            The entries.
        """
        run_id = run_id or self.run_id
        found = [
            e for e in self.entries.values()
            if e.run_id == run_id and bool(e.fields.get('best')) == best
        ]
        return sorted(found, key=lambda e: (-e.iter, -e.epoch, e.path))

    def find(self, path: str) -> Optional[Entry]:
        """The entry of a checkpoint path (any run), or None."""
        wanted = osp.realpath(path)
        for entry in self.entries.values():
            if osp.realpath(entry.location) == wanted:
                return entry
        return None

    def damage_note(self) -> str:
        """A sentence on skipped lines, or ``''`` when none was."""
        if self.unreadable:
            return f'The run record cannot be read: {self.unreadable}.'
        if not self.damaged:
            return ''
        lines = ', '.join(map(str, self.damaged[:10]))
        more = f' and {len(self.damaged) - 10} more' \
            if len(self.damaged) > 10 else ''
        named = ', '.join(f'line {n}: {p!r}' for n, p in self.uncontained[:5])
        outside = (f' {len(self.uncontained)} of them name a path outside '
                   f'the record\'s folder ({named}); an entry names a file '
                   'of its own folder only.') if self.uncontained else ''
        return (f'{len(self.damaged)} damaged line(s) of '
                f'{record_path(self.work_dir)} skipped (line {lines}{more}).'
                f'{outside}')


def _valid_saved(event: Dict[str, Any]) -> bool:
    return all(type(event.get(k)) is int and event[k] >= 0
               for k in _INT_FIELDS) and \
        all(isinstance(event.get(k), str) and event[k]
            for k in _STR_FIELDS) and \
        re.fullmatch(r'[0-9a-f]{64}', event['sha256']) is not None


def _parse(line: str) -> Optional[Dict[str, Any]]:
    """The event of a well-formed line, else None (paths not checked)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    kind = event.get('event')
    if kind == 'saved':
        return event if _valid_saved(event) else None
    if kind == 'removed':
        return event if isinstance(event.get('path'), str) and \
            event['path'] else None
    if kind == 'start':
        resumed = event.get('resumed_iter')
        return event if isinstance(event.get('run_id'), str) and \
            event['run_id'] and (resumed is None or type(resumed) is int) \
            else None
    return None


def read_record(work_dir: str) -> RunRecord:
    """Read and fold the record of ``work_dir``.

    Args:
        work_dir: The work folder.

    Returns:
        The folded record (empty when there is none).
    """
    record = RunRecord(str(work_dir))
    if osp.islink(record_path(work_dir)):
        record.exists = True
        record.unreadable = _LINK_REFUSAL.format(
            path=record_path(work_dir), verb='read').rstrip('.')
        return record
    try:
        text = read_small_text(
            record_path(work_dir), 'run record', RECORD_LIMIT)
    except FileNotFoundError:
        return record
    except OSError as err:
        record.exists, record.unreadable = True, str(err)
        return record
    record.exists = True
    for number, line in enumerate(text.split('\n'), 1):
        if not line.strip():
            continue
        event = _parse(line)
        if event is not None and 'path' in event and \
                not is_bare_name(event['path']):
            record.uncontained.append((number, event['path']))
            event = None
        if event is None:
            record.damaged.append(number)
        else:
            _fold(record, event)
    return record


def _fold(record: RunRecord, event: Dict[str, Any]) -> None:
    kind = event['event']
    if kind == 'saved':
        record.entries[event['path']] = Entry(event, record.work_dir)
        record.written[event['path']] = event['run_id']
    elif kind == 'removed':
        record.entries.pop(event['path'], None)
        record.written.pop(event['path'], None)
    else:
        record.run_id = event['run_id']
        resumed = event.get('resumed_iter')
        if resumed is not None:
            for path, entry in list(record.entries.items()):
                if entry.run_id == record.run_id and entry.iter > resumed \
                        and not entry.fields.get('best'):
                    del record.entries[path]


def _stable_name(value: Any) -> str:
    # Classes and functions in a config: their import path, not their repr
    # (which holds a memory address).
    return f'{getattr(value, "__module__", "")}.' \
        f'{getattr(value, "__qualname__", type(value).__qualname__)}'


def config_digest(model: Any) -> str:
    """A digest of what a checkpoint's weights mean: the model's config.

    Args:
        model: The config's ``model`` dict, or a model object (a runner
            built from objects, not a config).

    Returns:
        16 hex digits of a SHA-256.
    """
    if isinstance(model, dict):
        text = json.dumps(model, sort_keys=True, default=_stable_name)
    else:
        text = _stable_name(type(model))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_path(folder: str, checkpoint: str) -> str:
    """How the record of ``folder`` names ``checkpoint``: its bare name.

    Args:
        folder: The record's folder.
        checkpoint: A checkpoint file or FSDP folder in it.

    Returns:
        The name.

    Raises:
        ValueError: ``checkpoint`` is not directly in ``folder``.
    """
    parent = osp.dirname(osp.abspath(str(checkpoint)))
    if parent != osp.abspath(str(folder)):
        raise ValueError(
            f'checkpoint {checkpoint} is not in the run record\'s folder '
            f'{folder}: a record names files of its own folder only')
    return osp.basename(str(checkpoint))


def file_id(path: str) -> List[int]:
    """Device, inode and modification time (ns) of a path, not following a
    symbolic link: a file replaced since (even one given the freed inode
    number) has another."""
    return _file_id(os.lstat(path))


def _file_id(info: os.stat_result) -> List[int]:
    return [info.st_dev, info.st_ino, info.st_mtime_ns]


def newest_intact_sentence(path: str) -> str:
    """What to resume from instead of a damaged ``path``.

    Args:
        path: The damaged checkpoint.

    Returns:
        A sentence naming the newest intact checkpoint recorded beside it.
    """
    folder = osp.dirname(osp.abspath(osp.normpath(path)))
    for entry in read_record(folder).checkpoints():
        if osp.realpath(entry.location) != osp.realpath(path) and \
                entry.problem() is None:
            return (f'The newest intact checkpoint recorded in {folder} is '
                    f'{entry.location} (pass --resume {entry.location}, or '
                    'resume automatically).')
    return f'No intact checkpoint of this run is recorded in {folder}.'
