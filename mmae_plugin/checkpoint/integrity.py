"""What is wrong with a checkpoint that is not in a run record.

Checked against its hidden checksum sidecar ``.<name>.sha256``
(``sha256sum -c`` format, as ``python -m mmae_plugin.download`` and plugin
0.3 wrote; 0.2.0 wrote a visible ``<name>.sha256``) when it has one, else
by its zip structure (members against their CRC-32s). An FSDP folder is
checked by its ``rank<i>.pth`` files; anything else is refused.
"""
import os
import os.path as osp
import re
import zipfile
from typing import Dict, Optional, Tuple

from .atomic_write import write_atomically
from .bounded_read import UnsafeFileError, read_small_text
from .run_record import file_sha256, rank_files

SIDECAR_SUFFIX = '.sha256'
_DIGEST = re.compile(r'^[0-9a-f]{64}$')


class CorruptCheckpointError(RuntimeError):
    """A checkpoint that is truncated, or whose bytes changed after saving."""


def sidecar_path(checkpoint: str) -> str:
    """Where the checksums of ``checkpoint`` are written.

    Args:
        checkpoint: Path of a checkpoint file or FSDP folder.

    Returns:
        ``<folder>/.<name>.sha256``: hidden, so listings by name (``best*``,
        ``epoch_*``) see only the checkpoints.
    """
    folder, name = osp.split(osp.normpath(checkpoint))
    return osp.join(folder, f'.{name}{SIDECAR_SUFFIX}')


def legacy_sidecar_path(checkpoint: str) -> str:
    """Where plugin 0.2.0 wrote the checksum of ``checkpoint``."""
    return osp.normpath(checkpoint) + SIDECAR_SUFFIX


def sidecar_paths(checkpoint: str) -> Tuple[str, str]:
    """Every place a checksum of ``checkpoint`` may be kept, newest first."""
    return sidecar_path(checkpoint), legacy_sidecar_path(checkpoint)


def write_sidecar(checkpoint: str) -> None:
    """Write the hidden sidecar of a complete checkpoint file (atomically).

    A 0.2.0 sidecar of the same name described the file this write
    replaced, so it goes once the new digest is on disk.

    Args:
        checkpoint: Local path of the checkpoint file just written.
    """
    line = f'{file_sha256(checkpoint)}  {osp.basename(checkpoint)}\n'
    write_atomically(
        line, sidecar_path(checkpoint), mode='w', encoding='utf-8')
    try:
        os.remove(legacy_sidecar_path(checkpoint))
    except (FileNotFoundError, IsADirectoryError):
        pass


def remove_sidecars(checkpoint: str) -> None:
    """Delete every sidecar of ``checkpoint`` (after it was removed)."""
    for sidecar in sidecar_paths(checkpoint):
        if osp.isfile(sidecar):
            os.remove(sidecar)


def recorded_digests(checkpoint: str) -> Optional[Dict[str, str]]:
    """The digests a sidecar of ``checkpoint`` records, by relative name.

    Args:
        checkpoint: Local checkpoint file.

    Returns:
        ``{name relative to the parent: digest}`` from the first sidecar
        present, or None without any.

    Raises:
        CorruptCheckpointError: A sidecar exists but is not a small regular
            file of ``sha256sum`` lines.
    """
    for sidecar in sidecar_paths(checkpoint):
        try:
            text = read_small_text(sidecar, 'checksum file')
        except FileNotFoundError:
            continue
        except (UnsafeFileError, IsADirectoryError) as err:
            raise CorruptCheckpointError(str(err)) from err
        digests = {}
        for line in text.splitlines():
            digest, _, name = line.strip().partition('  ')
            if not _DIGEST.match(digest) or not name:
                raise CorruptCheckpointError(
                    f'checksum file {sidecar} holds no SHA-256 line '
                    f'(got {line[:80]!r}); delete it to load {checkpoint} '
                    'unchecked')
            digests[name.lstrip('*')] = digest
        if not digests:
            raise CorruptCheckpointError(
                f'checksum file {sidecar} is empty; delete it to load '
                f'{checkpoint} unchecked')
        return digests
    return None


def zip_problem(path: str) -> Optional[str]:
    """What is wrong with a checkpoint file that has no sidecar, if anything.

    Args:
        path: Local checkpoint file.

    Returns:
        None if it is a zip archive whose members match their CRC-32s;
        else the problem.
    """
    with open(path, 'rb') as file:
        magic = file.read(4)
    if magic != b'PK\x03\x04':
        return 'it is empty' if not magic else (
            'it is not a zip archive, the format torch.save has written '
            f'since torch 1.6 (it starts with {magic!r}: overwritten or '
            'zero-filled?)')
    try:
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        return f'it is not a complete zip archive (truncated?): {err}'
    if bad_member is not None:
        return f'the CRC-32 of its record {bad_member!r} does not match'
    return None


def _folder_problem(folder: str) -> Optional[str]:
    ranks = rank_files(folder)
    if not ranks:
        return 'it is a folder without rank<i>.pth files'
    expected = [f'rank{i}.pth' for i in range(len(ranks))]
    if ranks != expected:
        return (f'its rank files {ranks} are not rank0.pth ... '
                f'rank{len(ranks) - 1}.pth')
    for rank in ranks:
        problem = zip_problem(osp.join(folder, rank))
        if problem is not None:
            return f'{rank}: {problem}'
    return None


def _digest_mismatch(checkpoint: str, digests: Dict[str,
                                                    str]) -> Optional[str]:
    parent = osp.dirname(osp.normpath(checkpoint))
    name = osp.basename(osp.normpath(checkpoint))
    if name not in digests:
        return f'its checksum file records {sorted(digests)}, not {name}'
    for relative, digest in digests.items():
        actual = file_sha256(osp.join(parent, relative))
        if actual != digest:
            return (f'the SHA-256 of {relative} is {actual}, not {digest} as '
                    'recorded at save time (truncated or corrupted since; if '
                    'you replaced it on purpose, delete the checksum file '
                    f'{sidecar_path(checkpoint)})')
    return None


def _compute_problem(checkpoint: str) -> Optional[str]:
    # An FSDP folder is checked by the zip structure of its rank files (the
    # record holds its digest; 0.3's folder sidecars are not read).
    try:
        if osp.isdir(checkpoint):
            return _folder_problem(checkpoint)
        digests = recorded_digests(checkpoint)
        if digests is not None:
            return _digest_mismatch(checkpoint, digests)
        return zip_problem(checkpoint)
    except CorruptCheckpointError as err:
        return str(err)
    except OSError as err:
        return f'it cannot be read ({err})'


def checkpoint_problem(checkpoint: str) -> Optional[str]:
    """Why ``checkpoint`` is not an intact checkpoint, or None if it is.

    Args:
        checkpoint: Local path of a checkpoint file or FSDP folder.

    Returns:
        None if intact; else a sentence fragment saying what is wrong.
    """
    if not osp.lexists(checkpoint):
        return 'it does not exist'
    if not (osp.isdir(checkpoint) or osp.isfile(checkpoint)):
        return 'it is not a regular file or a checkpoint folder'
    return _compute_problem(checkpoint)


def verify_checkpoint(checkpoint: str, instead: str = '') -> None:
    """Raise unless ``checkpoint`` is intact.

    Args:
        checkpoint: Local checkpoint file or folder.
        instead: A sentence saying what to use instead (appended).

    Raises:
        CorruptCheckpointError: Naming the file and what is wrong.
    """
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        raise CorruptCheckpointError(
            f'checkpoint {checkpoint} is damaged: {problem}. {instead}'.strip(
            ))
