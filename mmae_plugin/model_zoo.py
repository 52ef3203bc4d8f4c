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
"""
import os
import os.path as osp
from typing import List, Optional

import torch
from mmengine.runner import CheckpointLoader

ZOO_SCHEME = 'mmae-zoo://'
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
    """
    return torch.load(resolve_zoo_checkpoint(filename),
                      map_location=map_location, weights_only=True)


def register_model_zoo() -> None:
    """Register the plugin's ``model-index.yml`` with mmpretrain (once)."""
    from mmpretrain.apis import ModelHub
    path = model_index_path()
    if path is None:
        return
    if getattr(ModelHub, '_mmae_plugin_index', None) == path:
        return
    ModelHub.register_model_index(path, config_prefix=osp.dirname(path))
    ModelHub._mmae_plugin_index = path
