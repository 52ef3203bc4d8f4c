"""Copy model-zoo entries to a folder: what ``mim download`` does for others.

``mim download`` speaks only http(s) and cannot fetch the plugin's
``mmae-zoo://`` weights. This command copies an entry's checkpoint and
dumps its full config (the config alone for an entry without weights)::

    python -m mmae_plugin.download mmae_vit-tiny-p4_fmnist_linear --dest ckpts

The source is checked against its metafile's SHA-256 before copying and
the copy after (exit status 1 and no copy when damaged); the copy gets the
``.NAME.pth.sha256`` sidecar the runner verifies. Without ``--force`` no
existing file or symlink is written over; with it each file is replaced
atomically. A ``--dest`` that is a file or the zoo folder itself exits
with status 2. See docs/evaluation.md#model-zoo.
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, NamedTuple, Optional, Sequence

import mmae_plugin.registration  # noqa: F401  (the plugin's model index)
from mmae_plugin.checkpoint.atomic_write import write_atomically
from mmae_plugin.checkpoint.integrity import (CorruptCheckpointError,
                                              file_sha256, remove_sidecars,
                                              sidecar_paths, write_sidecar)
from mmae_plugin.model_zoo import (UNPUBLISHED, ZOO_SCHEME, recorded_digests,
                                   resolve_zoo_checkpoint,
                                   verify_zoo_checkpoint)

PROG = 'python -m mmae_plugin.download'
#: Exit status of a bad ``--dest`` or a refused overwrite (argparse's).
EXIT_USAGE = 2
#: Exit status of an unknown entry or a damaged zoo file.
EXIT_FAILURE = 1


class DestinationError(ValueError):
    """``--dest``, or a file the command would write there, is refused."""


class Download(NamedTuple):
    """What one entry writes, and from where."""

    name: str
    config_text: str
    config_path: str
    #: The zoo checkpoint (``mmae-zoo://...``), or None without weights.
    weights: Optional[str]
    checkpoint_path: Optional[str]


def _plugin_entry(name: str):
    """The registered metainfo of a plugin entry.

    Raises:
        ValueError: If ``name`` is unknown, or an entry of another package
            (those have http(s) weights ``mim download`` fetches itself).
    """
    from mmpretrain.apis import ModelHub
    metainfo = ModelHub.get(name)
    weights = metainfo.weights
    if weights is not None and not weights.startswith(ZOO_SCHEME):
        raise ValueError(
            f'{name!r} is not an mmae_plugin model-zoo entry (its weights '
            f'are {weights}): use mim download mmpretrain --config {name}')
    return metainfo


def plan_download(name: str, dest: str) -> Download:
    """What downloading ``name`` into ``dest`` writes (nothing written yet).

    Args:
        name: A plugin entry.
        dest: The destination folder.

    Returns:
        The plan.

    Raises:
        ValueError: ``name`` is unknown or not a plugin entry.
    """
    metainfo = _plugin_entry(name)
    weights = metainfo.weights
    if weights is None or weights.startswith(UNPUBLISHED):
        weights = None
    return Download(name, metainfo.config.dump(), osp.join(dest, f'{name}.py'),
                    weights,
                    osp.join(dest, f'{name}.pth') if weights else None)


def _link_note(path: str) -> str:
    try:
        return f' (to {os.readlink(path)})'
    except OSError:
        return ''


def destination_problem(dest: str, force: bool,
                        source_folders: Sequence[str] = ()
                        ) -> Optional[str]:  # yapf: disable
    """Why ``--dest`` is refused, or None.

    Args:
        dest: The ``--dest`` argument.
        force: Whether ``--force`` was given.
        source_folders: Folders the checkpoints are copied from.

    Returns:
        One sentence naming ``dest``, or None if it may be written into.
    """
    # normpath: 'link/' would make islink follow the link and say False.
    path = osp.normpath(dest)
    if osp.islink(path) and not force:
        return (f'--dest {dest} is a symlink{_link_note(path)}; refusing to '
                'write through it (pass --force to write into its target)')
    if osp.lexists(path) and not osp.exists(path):
        return f'--dest {dest} is a dangling symlink{_link_note(path)}'
    if osp.exists(path) and not osp.isdir(path):
        return f'--dest {dest} is a file, not a folder'
    if osp.realpath(path) in {osp.realpath(f) for f in source_folders}:
        return (f'--dest {dest} is the model-zoo folder the checkpoints are '
                'copied from; choose another folder')
    return None


def target_problem(path: str, force: bool) -> Optional[str]:
    """Why the file ``path`` may not be written, or None.

    Args:
        path: A file the command would write.
        force: Whether ``--force`` was given.

    Returns:
        One sentence naming ``path``, or None.
    """
    if osp.isdir(path) and not osp.islink(path):
        return f'{path} is a folder; refusing to replace it'
    if force or not osp.lexists(path):
        return None
    if osp.islink(path):
        return (f'{path} is a symlink{_link_note(path)}; refusing to write '
                'through it (pass --force to replace the link itself)')
    return f'{path} exists; refusing to overwrite it (pass --force)'


def plan_problems(plan: Download, force: bool) -> List[str]:
    """Every refusal for the files of one plan."""
    paths = [plan.config_path]
    if plan.checkpoint_path:
        paths.append(plan.checkpoint_path)
        # A folder where a sidecar goes would fail the write half-way.
        paths += [
            p for p in sidecar_paths(plan.checkpoint_path)
            if osp.isdir(p) and not osp.islink(p)
        ]
    problems = [target_problem(path, force) for path in paths]
    return [problem for problem in problems if problem]


def copy_verified(source: str, target: str, expected: str) -> None:
    """Copy a verified zoo checkpoint, check the copy, write its sidecar.

    Args:
        source: The zoo file, already checked by
            :func:`~mmae_plugin.model_zoo.verify_zoo_checkpoint`.
        target: Where the copy goes.
        expected: The SHA-256 its metafile records.

    Raises:
        CorruptCheckpointError: The copy differs from ``expected`` (the
            source changed since it was checked, or the write corrupted
            it); the copy is removed.
    """
    with open(source, 'rb') as file:
        data = file.read()  # zoo files are a few MB
    # Sidecars of a replaced file would describe other bytes: drop them
    # first, so a kill at any point leaves no stale one.
    remove_sidecars(target)
    write_atomically(data, target)
    actual = file_sha256(target)
    if actual != expected:
        os.remove(target)
        raise CorruptCheckpointError(
            f'the copy {target} of {source} has SHA-256 {actual}, not '
            f'{expected} as its metafile records (the source changed while '
            'it was copied, or the disk corrupted it); it was removed. Run '
            'the command again.')
    write_sidecar(target)


def write_download(plan: Download) -> List[str]:
    """Write the config, then the verified checkpoint, of one plan.

    Args:
        plan: From :func:`plan_download`, already checked.

    Returns:
        The paths written: the config, then the checkpoint if there is one.
    """
    write_atomically(
        plan.config_text, plan.config_path, mode='w', encoding='utf-8')
    if plan.weights is None:
        print(f'{plan.name}: config saved to {plan.config_path}; this entry '
              'has no published weights')
        return [plan.config_path]
    file = plan.weights[len(ZOO_SCHEME):]
    copy_verified(
        resolve_zoo_checkpoint(file), plan.checkpoint_path,
        recorded_digests()[file].sha256)
    print(f'{plan.name}: config saved to {plan.config_path}, checkpoint '
          f'(verified against its metafile SHA-256) to '
          f'{plan.checkpoint_path}')
    return [plan.config_path, plan.checkpoint_path]


def check_plans(plans: Sequence[Download], dest: str, force: bool) -> None:
    """Refuse the whole command before anything is written.

    Raises:
        DestinationError: Naming the first refused path.
    """
    sources = [
        osp.dirname(resolve_zoo_checkpoint(plan.weights)) for plan in plans
        if plan.weights
    ]
    problems = [destination_problem(dest, force, sources)]
    for plan in plans:
        problems += plan_problems(plan, force)
    problems = [problem for problem in problems if problem]
    if problems:
        raise DestinationError(problems[0])


def download_entries(names: Sequence[str],
                     dest: str,
                     force: bool = False) -> List[str]:
    """Copy entries' checkpoints and dump their configs into ``dest``.

    Every destination is checked before any file is written.

    Args:
        names: Plugin entries (``mmpretrain.list_models('*fmnist*')``).
        dest: Destination folder (created if missing).
        force: Replace existing files and write through a ``dest`` symlink.

    Returns:
        The paths written, per entry the config then the checkpoint.

    Raises:
        ValueError: An unknown or foreign entry.
        DestinationError: ``dest`` or a file in it is refused (see
            :func:`destination_problem`, :func:`target_problem`).
        CorruptCheckpointError: A zoo file differs from its metafile.
    """
    # A name given twice would overwrite its own fresh copy: once is enough.
    plans = [plan_download(name, dest) for name in dict.fromkeys(names)]
    check_plans(plans, dest, force)
    for plan in plans:  # a damaged source: refused before any file is written
        if plan.weights:
            verify_zoo_checkpoint(plan.weights)
    os.makedirs(dest, exist_ok=True)
    written = []
    for plan in plans:
        written += write_download(plan)
    return written


def download_entry(name: str, dest: str, force: bool = False) -> List[str]:
    """Copy one entry (see :func:`download_entries`)."""
    return download_entries([name], dest, force)


#: The command the help suggests for the entry names; it registers the
#: plugin explicitly, so it lists them whatever else was imported first.
LIST_COMMAND = ('python -c "import mmae_plugin.registration, mmpretrain; '
                "print(mmpretrain.list_models('*fmnist*'))\"")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description='Copy mmae_plugin model-zoo entries (checkpoint and '
        'config) into a folder, as `mim download` does for packages with '
        'downloadable weights. Each checkpoint is verified against the '
        'SHA-256 its metafile records.')
    parser.add_argument(
        'names',
        nargs='+',
        metavar='NAME',
        help='entry names, e.g. mmae_vit-tiny-p4_fmnist_linear '
        f'({LIST_COMMAND})')
    parser.add_argument(
        '--dest',
        default='.',
        help='destination folder (default: the current one)')
    parser.add_argument(
        '--force',
        action='store_true',
        help='replace existing files (atomically) and write '
        'into a --dest that is a symlink')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command; the exit status."""
    args = parse_args(argv)
    try:
        download_entries(args.names, args.dest, args.force)
    except DestinationError as error:
        print(f'{PROG}: error: {error}', file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError, CorruptCheckpointError) as error:
        print(f'{PROG}: error: {error}', file=sys.stderr)
        return EXIT_FAILURE
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
