"""The plugin's models in mmpretrain's model zoo (``list_models``, ``get_model``).

``model-index.yml`` (shipped beside the configs, mmpretrain's layout) lists a
metafile per algorithm. Importing ``mmae_plugin`` registers it with
mmpretrain's :class:`~mmpretrain.apis.ModelHub`, so::

    mmpretrain.list_models('*mmae*')
    mmpretrain.get_model('mmae_vit-tiny-p4_fmnist_linear', pretrained=True)

work like they do for mmpretrain's own models. The ImageNet entries carry the
paper's results and no weights; the Fashion-MNIST entries carry the results
measured by ``tools/benchmarks/run_evidence.py`` and weights addressed as
``mmae-zoo://<file>``, which this module resolves to the plugin's checkpoint
folder and loads with ``weights_only=True`` like every other checkpoint.

mmpretrain's ``get_model(name, pretrained=True)`` only warns and returns a
randomly initialised model when an entry has no weights. So that a user who
asked for pretrained weights never gets a random model by mistake, the
registered copies of the plugin's weightless entries point at
``mmae-zoo://unpublished/<name>``, which :func:`load_from_zoo` refuses with a
message naming the entry and what to pass instead. (The metafiles keep
``Weights: null``, so ``mim search`` shows no weights for them.)
"""
import os
import os.path as osp
from typing import List, Optional

import torch
from mmengine.runner import CheckpointLoader

ZOO_SCHEME = 'mmae-zoo://'
#: Weights of registered entries that publish none (see the module docstring).
UNPUBLISHED = ZOO_SCHEME + 'unpublished/'
#: Environment variable naming an extra folder of zoo checkpoints.
ZOO_DIR_ENV = 'MMAE_PLUGIN_ZOO_DIR'
BUILD_COMMAND = ('python tools/benchmarks/run_evidence.py && '
                 'python tools/benchmarks/run_evidence.py --export-zoo')

_PACKAGE_DIR = osp.dirname(osp.abspath(__file__))


def resource_roots() -> List[str]:
    """Folders that may hold ``model-index.yml``, ``configs/``, ``checkpoints/``.

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
        raise ValueError(unpublished_weights_message(
            filename[len(UNPUBLISHED):]))
    return torch.load(resolve_zoo_checkpoint(filename),
                      map_location=map_location, weights_only=True)


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
        f"load any. Use get_model({name!r}, pretrained=False) to build the "
        f"untrained recipe, or get_model({name!r}, "
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
        if metainfo.weights is None and filepath.startswith(index_dir + os.sep):
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
