"""Add a restart marker after every MCU of a dataset's JPEGs, losslessly.

The recipes' loader (:mod:`mmae_plugin.datasets.transforms.jpeg_region`)
decodes only the crop box of a baseline JPEG. When the file has a restart
marker after every MCU (DRI = 1), it decodes a small JPEG made of the MCUs
around the box and skips the Huffman decoding of all the others: about 15%
less decode time per image. Datasets such as ImageNet have no such markers,
so :func:`convert_tree` adds them offline with libjpeg-turbo's ``jpegtran``
(:data:`JPEGTRAN_ARGS`; Debian: ``apt-get install libjpeg-turbo-progs``).
It changes no pixel (the DCT coefficients are copied), keeps the EXIF / ICC
markers, writes progressive files as sequential ones and, with
``-optimize``, makes photographs about 2% smaller despite the markers.

:func:`convert_tree` mirrors a folder: JPEGs (found by content) converted,
every other file (and every JPEG ``jpegtran`` refuses) copied byte for
byte. What it has done is recorded in ``DST/.mmae_jpeg_restarts.jsonl``
(:data:`RECORD_NAME`), so a killed run resumes where it stopped and a file
in ``DST`` that it did not write is never overwritten.
"""
import filecmp
import json
import multiprocessing
import os
import os.path as osp
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import cv2
import numpy as np

#: ``jpegtran``'s options: keep every marker (EXIF, ICC), optimal Huffman
#: tables, a restart marker after every MCU.
JPEGTRAN_ARGS = ('-copy', 'all', '-optimize', '-restart', '1B')
#: The record of a conversion, at the root of the output folder.
RECORD_NAME = '.mmae_jpeg_restarts.jsonl'
#: Every JPEG starts with the SOI marker.
JPEG_START = b'\xff\xd8'
INSTALL_HINT = ('Debian / Ubuntu: apt-get install libjpeg-turbo-progs; or '
                'give the path of a jpegtran executable')
MODES = ('converted', 'copied')
COPY_CHUNK = 1 << 20

# One source file to do: (relative path, size, mtime_ns, listed in the
# record), and what came of it: a record entry.
Task = Tuple[str, int, int, bool]
Entry = Dict[str, object]
# Called with (files done, files in all).
Progress = Callable[[int, int], None]


class JpegtranNotFoundError(FileNotFoundError):
    """No ``jpegtran`` executable where one was named."""


class ForeignFileError(ValueError):
    """A file in the output folder that this tool did not write."""


def jpegtran_not_found(jpegtran: str) -> JpegtranNotFoundError:
    """The error for a missing ``jpegtran``, saying how to install it."""
    return JpegtranNotFoundError(
        f'no jpegtran executable {jpegtran!r} found ({INSTALL_HINT})')


def find_jpegtran(jpegtran: str = 'jpegtran') -> str:
    """The path of the ``jpegtran`` executable.

    Args:
        jpegtran: A command name looked up in ``$PATH``, or a path.

    Returns:
        The executable's path.

    Raises:
        JpegtranNotFoundError: There is none.
    """
    path = shutil.which(jpegtran)
    if path is None:
        raise jpegtran_not_found(jpegtran)
    return path


def add_restarts(data: bytes, jpegtran: str = 'jpegtran') -> Optional[bytes]:
    """A JPEG with a restart marker after every MCU, same pixels.

    Args:
        data: The bytes of a file.
        jpegtran: The ``jpegtran`` command name or path.

    Returns:
        The converted JPEG, or None when ``data`` is not a JPEG or
        ``jpegtran`` fails on it (corrupt or truncated data, a kind it
        cannot transcode): the caller then keeps the file unchanged.

    Raises:
        JpegtranNotFoundError: ``jpegtran`` is not found.
    """
    if not data.startswith(JPEG_START):
        return None
    try:
        done = subprocess.run([jpegtran, *JPEGTRAN_ARGS],
                              input=data,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              check=False)
    except FileNotFoundError as error:
        raise jpegtran_not_found(jpegtran) from error
    # Status 2 is a warning (e.g. premature end of data): the output would
    # be a repaired file, not the same one.
    if done.returncode != 0 or not done.stdout.startswith(JPEG_START):
        return None
    return done.stdout


def check_lossless(name: str, source: bytes, output: bytes) -> None:
    """Check that two JPEGs decode to the same pixels with OpenCV.

    Args:
        name: The file's name, for the error.
        source: The original file.
        output: The converted file.

    Raises:
        RuntimeError: The pixels differ, or the output does not decode.
    """
    decoded = [
        cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        for data in (source, output)
    ]
    if decoded[1] is None:
        raise RuntimeError(f'{name}: the converted file does not decode')
    if decoded[0] is None or not np.array_equal(*decoded):
        raise RuntimeError(
            f'{name}: the converted file decodes to other pixels than the '
            'source')


def write_atomically(path: str,
                     mode: int,
                     data: Optional[bytes] = None,
                     source: Optional[str] = None) -> int:
    """Write a file through a temporary beside it, renamed over it.

    Args:
        path: The file to write; its folder is created.
        mode: The permission bits of the new file.
        data: Its content, or None to copy the file ``source``.
        source: The file to copy when ``data`` is None.

    Returns:
        The size of the file written.
    """
    folder, name = osp.split(path)
    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        dir=folder, prefix=f'.{name}.', suffix='.tmp')
    try:
        with os.fdopen(descriptor, 'wb') as file:
            if data is None:
                # Streamed: a non-JPEG may be an archive of any size.
                with open(source, 'rb') as reader:
                    shutil.copyfileobj(reader, file, COPY_CHUNK)
            else:
                file.write(data)
            file.flush()
            size = file.tell()
        # mkstemp makes files only their owner can read.
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if osp.lexists(temporary):
            os.unlink(temporary)
        raise
    return size


def holds(path: str, data: Optional[bytes], source: str) -> bool:
    """Whether ``path`` is a regular file with ``data`` (or, when None, the
    same bytes as the file ``source``)."""
    if osp.islink(path) or not osp.isfile(path):
        return False
    if data is None:
        return filecmp.cmp(path, source, shallow=False)
    if osp.getsize(path) != len(data):
        return False
    with open(path, 'rb') as file:
        return file.read() == data


class Converter:
    """Converts or copies one file of the tree (in this process or a pool
    worker: it is picklable).

    Args:
        src: The source folder.
        dst: The output folder.
        jpegtran: The ``jpegtran`` executable.
        verify: Whether to check that each conversion keeps the pixels.
        mode: The permission bits of the files written.
    """

    def __init__(self, src: str, dst: str, jpegtran: str, verify: bool,
                 mode: int) -> None:
        self.src = src
        self.dst = dst
        self.jpegtran = jpegtran
        self.verify = verify
        self.mode = mode

    def convert(self, source: str) -> Optional[bytes]:
        """The converted file ``source``; None where it is to be copied (no
        JPEG, or one ``jpegtran`` refuses)."""
        with open(source, 'rb') as file:
            if file.read(len(JPEG_START)) != JPEG_START:
                return None
            file.seek(0)
            data = file.read()
        output = add_restarts(data, self.jpegtran)
        if output is not None and self.verify:
            check_lossless(source, data, output)
        return output

    def __call__(self, task: Task) -> Entry:
        """Do one file.

        Args:
            task: (relative path, source size, source mtime_ns, whether the
                record lists the path).

        Returns:
            The file's record entry.

        Raises:
            ForeignFileError: The output path holds a file the record does
                not list, with other content than the output.
            RuntimeError: ``verify`` found other pixels.
        """
        path, size, mtime_ns, listed = task
        source = osp.join(self.src, path)
        target = osp.join(self.dst, path)
        output = self.convert(source)
        # An unlisted file is the user's, unless a run was killed between
        # writing it and recording it: then it holds exactly this output.
        if not listed and osp.lexists(target):
            if not holds(target, output, source):
                raise ForeignFileError(
                    f'{target} exists and is not in the record '
                    f'{osp.join(self.dst, RECORD_NAME)}: this tool did not '
                    'write it and will not overwrite it; move it away')
            out_size = osp.getsize(target)
        else:
            out_size = write_atomically(target, self.mode, output, source)
        return dict(
            path=path,
            size=size,
            mtime_ns=mtime_ns,
            mode='copied' if output is None else 'converted',
            out_size=out_size)


def check_folders(src: str, dst: str) -> None:
    """Refuse a missing ``src`` and nested folders.

    Raises:
        ValueError: ``src`` is not a folder, or one folder is (in) the
            other.
    """
    if not osp.isdir(src):
        raise ValueError(f'src={src!r}: no such folder')
    real_src, real_dst = osp.realpath(src), osp.realpath(dst)
    for inner, outer in ((real_dst, real_src), (real_src, real_dst)):
        if osp.commonpath([inner, outer]) == outer:
            raise ValueError(
                f'dst={dst!r} and src={src!r} are nested ({inner} is inside '
                f'{outer}): the output must be outside the source')
    if osp.lexists(dst) and not osp.isdir(dst):
        raise ValueError(f'dst={dst!r} exists and is not a folder')


def record_header(src: str) -> Dict[str, object]:
    """The record's first line for a conversion of ``src``."""
    return dict(src=osp.abspath(src), args=list(JPEGTRAN_ARGS))


def parse_entry(line: str) -> Optional[Entry]:
    """A record line's entry; None where the line is not a valid one (a
    line cut by a kill)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get('path'), str):
        return None
    numbers = [entry.get(key) for key in ('size', 'mtime_ns', 'out_size')]
    if not all(type(number) is int for number in numbers):
        return None
    return entry if entry.get('mode') in MODES else None


def read_record(src: str, dst: str) -> Dict[str, Entry]:
    """The entries of the record in ``dst``, last per path.

    Args:
        src: The source folder of this conversion.
        dst: The output folder (existing).

    Returns:
        The entries by relative path; empty for an empty ``dst``.

    Raises:
        ValueError: ``dst`` holds files but no record, or the record of
            another source or other ``jpegtran`` options.
    """
    path = osp.join(dst, RECORD_NAME)
    if not osp.isfile(path):
        if os.listdir(dst):
            raise ValueError(
                f'dst={dst!r} is not empty and holds no record '
                f'{RECORD_NAME} of an earlier conversion: give an empty or '
                'new folder')
        return {}
    with open(path) as file:
        lines = file.read().splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or not isinstance(header.get('src'), str):
        raise ValueError(
            f'dst={dst!r}: its record {path} has no valid first line')
    if osp.realpath(header['src']) != osp.realpath(src):
        raise ValueError(
            f"dst={dst!r} holds the conversion of {header['src']!r}, not "
            f'of src={src!r}')
    if header.get('args') != list(JPEGTRAN_ARGS):
        raise ValueError(
            f"dst={dst!r} was converted with jpegtran {header.get('args')}, "
            f'not {list(JPEGTRAN_ARGS)}')
    entries = (parse_entry(line) for line in lines[1:])
    return {entry['path']: entry for entry in entries if entry is not None}


def write_record(src: str, dst: str, entries: Dict[str, Entry]) -> None:
    """Rewrite the record with one line per entry: drops the lines that a
    kill cut (a line appended after one would be lost with it)."""
    lines = [record_header(src), *entries.values()]
    text = ''.join(json.dumps(line) + '\n' for line in lines)
    write_atomically(osp.join(dst, RECORD_NAME), file_mode(), text.encode())


def file_mode() -> int:
    """The permission bits a plain ``open(path, 'w')`` gives (the umask's)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def walk_files(src: str) -> Iterator[str]:
    """The relative paths of the files under ``src``, sorted (symbolic links
    to files followed, to folders not).

    Raises:
        ValueError: An entry that is no regular file (a broken link, a
            pipe).
    """
    for root, folders, names in os.walk(src):
        folders.sort()
        for name in sorted(names):
            if root == src and name == RECORD_NAME:
                continue  # src is itself an output: its record stays there
            path = osp.join(root, name)
            if not osp.isfile(path):
                raise ValueError(
                    f'{path} is not a regular file (a broken link?)')
            yield osp.relpath(path, src)


def plan(src: str, dst: str,
         entries: Dict[str, Entry]) -> Tuple[List[Task], List[Entry]]:
    """Split the source files into those to do and those an earlier run did.

    Args:
        src: The source folder.
        dst: The output folder.
        entries: The record's entries.

    Returns:
        The tasks, and the entries of the files skipped.
    """
    tasks, skipped = [], []
    for path in walk_files(src):
        stat = os.stat(osp.join(src, path))
        entry = entries.get(path)
        if entry is not None and entry['size'] == stat.st_size and \
                entry['mtime_ns'] == stat.st_mtime_ns and \
                output_size(osp.join(dst, path)) == entry['out_size']:
            skipped.append(entry)
        else:
            listed = entry is not None
            tasks.append((path, stat.st_size, stat.st_mtime_ns, listed))
    return tasks, skipped


def output_size(path: str) -> Optional[int]:
    """The size of the regular file ``path``; None where there is none."""
    return osp.getsize(path) if osp.isfile(path) else None


def run_tasks(converter: Converter, tasks: List[Task],
              workers: int) -> Iterator[Entry]:
    """The entries of the tasks done, in the order they finish."""
    if workers == 1 or len(tasks) <= 1:
        yield from map(converter, tasks)
        return
    with multiprocessing.Pool(workers) as pool:
        # Small chunks: a kill loses the records of few finished files.
        yield from pool.imap_unordered(converter, tasks, chunksize=4)
        pool.close()
        pool.join()


def convert_tree(src: str,
                 dst: str,
                 workers: int = 1,
                 jpegtran: str = 'jpegtran',
                 verify: bool = False,
                 progress: Optional[Progress] = None) -> Dict[str, int]:
    """Mirror ``src`` into ``dst`` with restart markers in every JPEG.

    Each JPEG (by content, whatever its extension) is converted with
    :func:`add_restarts`; every other file, and every JPEG ``jpegtran``
    refuses, is copied byte for byte. Outputs are written atomically and
    recorded in ``dst/.mmae_jpeg_restarts.jsonl`` after they are in place,
    so a rerun after a kill skips the files recorded with the source's
    current size and mtime and redoes the others.

    Args:
        src: The source folder.
        dst: The output folder: absent, empty, or holding the record of an
            earlier conversion of ``src``.
        workers: Processes converting files (1: this one).
        jpegtran: The ``jpegtran`` command name or path.
        verify: Check that each conversion decodes (OpenCV) to the
            source's pixels.
        progress: Called with (files done, files in all) before the first
            file is done (the files skipped count as done) and after each.

    Returns:
        ``converted``, ``copied`` and ``skipped`` (done by an earlier run)
        file counts; ``bytes_in`` and ``bytes_out``, the sizes of all source
        files and of their outputs, the skipped ones included.

    Raises:
        ValueError: Bad ``workers``, missing ``src``, nested folders, a
            ``dst`` this tool did not make for ``src``, or a file in
            ``dst`` that is not in its record (:class:`ForeignFileError`).
        JpegtranNotFoundError: ``jpegtran`` is not found.
        RuntimeError: ``verify`` found a conversion with other pixels.
    """
    if type(workers) is not int or workers < 1:
        raise ValueError(f'workers={workers!r}: expected an integer >= 1')
    check_folders(src, dst)
    jpegtran = find_jpegtran(jpegtran)
    os.makedirs(dst, exist_ok=True)
    entries = read_record(src, dst)
    write_record(src, dst, entries)
    tasks, skipped = plan(src, dst, entries)
    counts = dict(
        converted=0,
        copied=0,
        skipped=len(skipped),
        bytes_in=sum(entry['size'] for entry in skipped),
        bytes_out=sum(entry['out_size'] for entry in skipped))
    total, done = len(tasks) + len(skipped), len(skipped)
    if progress is not None:
        progress(done, total)
    converter = Converter(src, dst, jpegtran, verify, file_mode())
    with open(osp.join(dst, RECORD_NAME), 'a') as record:
        for entry in run_tasks(converter, tasks, workers):
            record.write(json.dumps(entry) + '\n')
            record.flush()
            counts[entry['mode']] += 1
            counts['bytes_in'] += entry['size']
            counts['bytes_out'] += entry['out_size']
            done += 1
            if progress is not None:
                progress(done, total)
    return counts
