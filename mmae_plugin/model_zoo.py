"""The plugin's models in mmpretrain's zoo (``list_models``, ``get_model``).

Importing ``mmae_plugin`` registers ``model-index.yml`` with mmpretrain's
:class:`~mmpretrain.apis.ModelHub`, so::

    mmpretrain.list_models('*mmae*')
    mmpretrain.get_model('mmae_vit-tiny-p4_fmnist_linear', pretrained=True)

work as for mmpretrain's own models. Fashion-MNIST weights are
``mmae-zoo://<file>`` checkpoints, resolved here, verified against the
SHA-256 their metafile records (:func:`verify_zoo_checkpoint`) and loaded
with ``weights_only=True``. Entries without weights (ImageNet) point at
``mmae-zoo://unpublished/<name>``, which :func:`load_from_zoo` refuses,
naming what to pass instead. See docs/evaluation.md#model-zoo.
"""
import os
import os.path as osp
from typing import Dict, List, NamedTuple, Optional

import torch
import yaml
from mmengine.runner import CheckpointLoader

from mmae_plugin.checkpoint.integrity import (CorruptCheckpointError,
                                              file_sha256)

ZOO_SCHEME = 'mmae-zoo://'
#: Weights of registered entries that publish none (see the module docstring).
UNPUBLISHED = ZOO_SCHEME + 'unpublished/'
#: Environment variable naming an extra folder of zoo checkpoints.
ZOO_DIR_ENV = 'MMAE_PLUGIN_ZOO_DIR'
#: Metadata field of a metafile entry holding its weights' SHA-256.
DIGEST_FIELD = 'Weights SHA256'
BUILD_COMMAND = ('the sweep of docs/results/notes.md (python tools/compare.py '
                 'run ...), then python dev/export_zoo.py --out-dir ...')

_PACKAGE_DIR = osp.dirname(osp.abspath(__file__))


def resource_roots() -> List[str]:
    """Folders that may hold ``model-index.yml``, ``configs/`` and
    ``checkpoints/``.

    The installed package's ``.mim`` folder first (wheel installs), then the
    repository checkout the package was imported from (editable installs).

    Returns:
        Existing folders, most specific first.
    """
    candidates = [osp.join(_PACKAGE_DIR, '.mim'), osp.dirname(_PACKAGE_DIR)]
    return [path for path in candidates if osp.isdir(path)]


def model_index_path() -> Optional[str]:
    """The plugin's ``model-index.yml``, or None if it is not shipped."""
    for root in resource_roots():
        path = osp.join(root, 'model-index.yml')
        if osp.isfile(path):
            return path
    return None


def checkpoint_dirs() -> List[str]:
    """Where ``mmae-zoo://`` checkpoints are looked up, in order."""
    dirs = [os.environ[ZOO_DIR_ENV]] if os.environ.get(ZOO_DIR_ENV) else []
    return dirs + [osp.join(root, 'checkpoints') for root in resource_roots()]


def resolve_zoo_checkpoint(filename: str) -> str:
    """Local path of a zoo checkpoint ``mmae-zoo://<filename>``.

    Args:
        filename: Path below the checkpoint folder, e.g.
            ``'fmnist/mmae_vit-tiny-p4_fmnist.pth'``.

    Returns:
        The path of the existing file.

    Raises:
        FileNotFoundError: With the command that builds the checkpoints.
    """
    if filename.startswith(ZOO_SCHEME):
        filename = filename[len(ZOO_SCHEME):]
    if osp.isabs(filename) or '..' in filename.split('/'):
        raise ValueError(f'zoo checkpoint name {filename!r} must be a '
                         'relative path inside the checkpoint folder')
    searched = checkpoint_dirs()
    for folder in searched:
        path = osp.join(folder, filename)
        if osp.isfile(path):
            return path
    raise FileNotFoundError(
        f'model-zoo checkpoint {filename!r} is not built yet (looked in '
        f'{", ".join(searched)}). Build the Fashion-MNIST zoo from a '
        f'repository checkout with: {BUILD_COMMAND}; or set {ZOO_DIR_ENV} '
        'to a folder that holds it.')


@CheckpointLoader.register_scheme(prefixes=ZOO_SCHEME)
def load_from_zoo(filename: str, map_location=None, logger=None) -> dict:
    """mmengine checkpoint loader of the ``mmae-zoo://`` scheme.

    Args:
        filename: ``mmae-zoo://<file>``.
        map_location: As for :func:`torch.load`.
        logger: Unused; mmengine's loader signature.

    Returns:
        The loaded checkpoint.

    Raises:
        ValueError: For an entry without published weights, naming it and
            what to pass to ``get_model`` instead.
    """
    if filename.startswith(UNPUBLISHED):
        raise ValueError(
            unpublished_weights_message(filename[len(UNPUBLISHED):]))
    path = verify_zoo_checkpoint(filename)
    return torch.load(path, map_location=map_location, weights_only=True)


class RecordedDigest(NamedTuple):
    """The SHA-256 a metafile records for one ``mmae-zoo://`` file."""

    #: Hex SHA-256 of the file.
    sha256: str
    #: Entries whose ``Weights`` is this file.
    entries: List[str]
    #: The metafile recording it.
    metafile: str


def _zoo_file(weights: str) -> str:
    return weights[len(ZOO_SCHEME):] if weights.startswith(ZOO_SCHEME) \
        else weights


def metafile_paths() -> List[str]:
    """The metafiles ``model-index.yml`` imports, as existing paths.

    Returns:
        Absolute paths; empty when no index is shipped.
    """
    index = model_index_path()
    if index is None:
        return []
    with open(index, encoding='utf-8') as file:
        imports = (yaml.safe_load(file) or {}).get('Import') or []
    root = osp.dirname(index)
    return [
        osp.join(root, path) for path in imports
        if osp.isfile(osp.join(root, path))
    ]


def _add_digest(digests: Dict[str, RecordedDigest], entry: dict,
                metafile: str) -> None:
    """Record one entry's weights digest, refusing a conflicting one."""
    weights = entry.get('Weights') or ''
    if not weights.startswith(ZOO_SCHEME):
        return
    name = entry.get('Name', '?')
    digest = str((entry.get('Metadata') or {}).get(DIGEST_FIELD, '')).lower()
    if len(digest) != 64 or not all(c in '0123456789abcdef' for c in digest):
        raise ValueError(
            f'{metafile}: entry {name!r} has weights {weights} but no '
            f'valid `{DIGEST_FIELD}` in its Metadata (got {digest!r}); '
            'record the file\'s SHA-256 (sha256sum) there')
    file = _zoo_file(weights)
    known = digests.get(file)
    if known is None:
        digests[file] = RecordedDigest(digest, [name], metafile)
    elif known.sha256 != digest:
        raise ValueError(
            f'metafiles disagree on the SHA-256 of {weights}: '
            f'{known.sha256} ({known.entries[0]}, {known.metafile}) and '
            f'{digest} ({name}, {metafile})')
    else:
        known.entries.append(name)


def recorded_digests() -> Dict[str, RecordedDigest]:
    """The weights digests every shipped metafile records.

    Returns:
        ``{file below the checkpoint folder: RecordedDigest}``, e.g. key
        ``'fmnist/mmae_vit-tiny-p4_fmnist_linear.pth'``.

    Raises:
        ValueError: An entry with ``mmae-zoo://`` weights records no valid
            digest, or two entries of one file record different ones.
    """
    digests: Dict[str, RecordedDigest] = {}
    for metafile in metafile_paths():
        with open(metafile, encoding='utf-8') as file:
            models = (yaml.safe_load(file) or {}).get('Models') or []
        for entry in models:
            _add_digest(digests, entry, metafile)
    return digests


def verify_zoo_checkpoint(filename: str) -> str:
    """Resolve ``mmae-zoo://<filename>`` and check it against its metafile.

    Args:
        filename: ``mmae-zoo://<file>`` or ``<file>``.

    Returns:
        The local path of the intact file.

    Raises:
        ValueError: No metafile records the file (so nothing vouches for
            its bytes), naming it and how to load it instead.
        FileNotFoundError: The file is missing (see
            :func:`resolve_zoo_checkpoint`).
        CorruptCheckpointError: Its SHA-256 differs from the recorded one,
            naming the file, the entries and what to do.
    """
    file = _zoo_file(filename)
    path = resolve_zoo_checkpoint(file)
    recorded = recorded_digests().get(file)
    if recorded is None:
        raise ValueError(
            f'{ZOO_SCHEME}{file} ({path}) is not a file of the plugin\'s '
            'model zoo: no metafile records its SHA-256, so its bytes '
            'cannot be checked. Load a checkpoint of your own by its local '
            'path instead.')
    actual = file_sha256(path)
    if actual != recorded.sha256:
        raise CorruptCheckpointError(
            damaged_zoo_message(file, path, actual, recorded))
    return path


def damaged_zoo_message(file: str, path: str, actual: str,
                        recorded: RecordedDigest) -> str:
    """What :func:`verify_zoo_checkpoint` says about a changed file.

    Args:
        file: The file below the checkpoint folder.
        path: Its local path.
        actual: Its SHA-256 now.
        recorded: What the metafile records.

    Returns:
        The message, naming the file, the entries and the remedies.
    """
    return (
        f'model-zoo checkpoint {ZOO_SCHEME}{file} ({path}) is damaged: its '
        f'SHA-256 is {actual}, not {recorded.sha256} as {recorded.metafile} '
        f'records for {", ".join(recorded.entries)}; refusing to load it. '
        'Restore the file (reinstall mmae_plugin, or `git checkout` it in a '
        f'repository checkout), or point {ZOO_DIR_ENV} at a folder with an '
        f'intact copy. If you rebuilt the zoo on purpose, record the new '
        f'SHA-256 as `{DIGEST_FIELD}` in the metafile.')


def unpublished_weights_message(name: str) -> str:
    """Why ``get_model(name, pretrained=True)`` fails, and what works.

    Args:
        name: A model-zoo entry without published weights.

    Returns:
        The message of the error.
    """
    return (
        f'model-zoo entry {name!r} has no published weights (its results '
        "are the paper's, not reproduced here), so pretrained=True cannot "
        f'load any. Use get_model({name!r}, pretrained=False) to build the '
        f'untrained recipe, or get_model({name!r}, '
        "pretrained='path/to/checkpoint.pth') to load a checkpoint of your "
        'own (one its config trained, or a published one converted by '
        'tools/model_converters/mae_to_mmpretrain.py).')


def _point_weightless_entries_at_refusal(index_path: str) -> None:
    """Give the plugin's entries without weights the refusing URL.

    Only entries whose metafile lives under the plugin's own index folder are
    touched; mmpretrain's own entries keep mmpretrain's behaviour.
    """
    from mmpretrain.apis import ModelHub
    index_dir = osp.dirname(osp.abspath(index_path))
    for name, metainfo in ModelHub._models_dict.items():
        filepath = osp.abspath(getattr(metainfo, 'filepath', '') or '')
        if metainfo.weights is None and filepath.startswith(index_dir +
                                                            os.sep):
            metainfo.weights = UNPUBLISHED + name


def register_model_zoo() -> None:
    """Register the plugin's ``model-index.yml`` with mmpretrain (once)."""
    from mmpretrain.apis import ModelHub
    path = model_index_path()
    if path is None:
        return
    if getattr(ModelHub, '_mmae_plugin_index', None) == path:
        return
    ModelHub.register_model_index(path, config_prefix=osp.dirname(path))
    _point_weightless_entries_at_refusal(path)
    ModelHub._mmae_plugin_index = path
