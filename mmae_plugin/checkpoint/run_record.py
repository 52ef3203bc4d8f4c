"""The run record: every checkpoint a run finalized, written down in order.

``<work_dir>/checkpoint_record.jsonl`` is the one source of truth about a
run's checkpoints. :class:`~mmae_plugin.engine.hooks.SafeCheckpointHook`
appends one JSON line per event, each written with ``O_APPEND`` and
fsync'ed before anything depends on it:

* ``start``: a training run starts (``run_id``, ``config_digest``,
  ``launch``; ``resumed_iter``, the iteration it continues from, or None);
* ``saved``: a checkpoint was finalized (``path``, ``epoch``, ``iter``,
  ``size``, ``sha256`` (of the bytes as they were written:
  :mod:`.digest_write`), ``layout``, ``best``, ``run_id``,
  ``config_digest``, ``launch``);
* ``removed``: retention retires a checkpoint (written before the file
  goes).

Reading folds the lines in order: a later ``saved`` of a path replaces the
earlier (the file was written again), ``removed`` drops it, and a ``start``
that resumed at iteration I drops the run's entries after I (a branch the
user abandoned). A line that is not a complete, well-formed event (a
truncated last line, garbage, NUL bytes left by a crash) is skipped and
counted: it costs its own entry only. Nothing is inferred from file names,
modification times or ``last_checkpoint``.
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


def record_path(work_dir: str) -> str:
    """Where the run record of ``work_dir`` is."""
    return osp.join(str(work_dir), RECORD_NAME)


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
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK,
                 0o644)
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
        work_dir: The work folder (relative paths are relative to it).
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
        """The checkpoint's local path."""
        return osp.normpath(osp.join(self.work_dir, self.fields['path']))

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
        work_dir: The work folder.
        run_id: The run of the last ``start`` (None without one).
        entries: Finalized checkpoints that were not removed, by path.
        damaged: Line numbers (1-based) of lines skipped as damaged.
        exists: Whether the record file exists.
        unreadable: Why the record could not be read at all, or None.
    """
    work_dir: str
    run_id: Optional[str] = None
    entries: Dict[str, Entry] = field(default_factory=dict)
    damaged: List[int] = field(default_factory=list)
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
        return (f'{len(self.damaged)} damaged line(s) of '
                f'{record_path(self.work_dir)} skipped (line {lines}{more}).')


def _valid_saved(event: Dict[str, Any]) -> bool:
    return all(type(event.get(k)) is int and event[k] >= 0
               for k in _INT_FIELDS) and \
        all(isinstance(event.get(k), str) and event[k]
            for k in _STR_FIELDS) and \
        re.fullmatch(r'[0-9a-f]{64}', event['sha256']) is not None


def _parse(line: str) -> Optional[Dict[str, Any]]:
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
        return event if isinstance(event.get('path'), str) else None
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
        if event is None:
            record.damaged.append(number)
        else:
            _fold(record, event)
    return record


def _fold(record: RunRecord, event: Dict[str, Any]) -> None:
    kind = event['event']
    if kind == 'saved':
        record.entries[event['path']] = Entry(event, record.work_dir)
    elif kind == 'removed':
        record.entries.pop(event['path'], None)
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


def recorded_path(work_dir: str, checkpoint: str) -> str:
    """How the record names ``checkpoint``: relative to the work folder
    when inside it, else absolute."""
    relative = osp.relpath(osp.abspath(checkpoint), osp.abspath(work_dir))
    return osp.abspath(checkpoint) if relative.startswith('..') \
        else relative
