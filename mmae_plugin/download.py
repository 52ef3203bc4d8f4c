"""Copy model-zoo entries to a folder: what ``mim download`` does for others.

``mim download`` fetches an entry's ``Weights`` URL with ``requests``, which
only speaks http(s). The plugin's Fashion-MNIST weights ship inside the
package as ``mmae-zoo://`` checkpoints (the project publishes no download
server), so ``mim download mmae_plugin --config NAME`` cannot fetch them.
This command does the same job from the installed package::

    python -m mmae_plugin.download mmae_vit-tiny-p4_fmnist_linear --dest ckpts

It copies the entry's checkpoint (``ckpts/mmae_vit-tiny-p4_fmnist_linear.pth``)
and dumps its full config (``ckpts/mmae_vit-tiny-p4_fmnist_linear.py``), as
``mim download`` does. For an entry without published weights it dumps the
config alone and says so.
"""
import argparse
import os
import os.path as osp
import shutil
import sys
from typing import List, Optional, Sequence

import mmae_plugin  # noqa: F401  (registers the plugin's model index)
from mmae_plugin.model_zoo import (UNPUBLISHED, ZOO_SCHEME,
                                   resolve_zoo_checkpoint)


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


def download_entry(name: str, dest: str) -> List[str]:
    """Copy one entry's checkpoint and dump its config into ``dest``.

    Args:
        name: A plugin entry of ``mmpretrain.list_models('*fmnist*')`` etc.
        dest: Destination folder (created if missing).

    Returns:
        The paths written: the config, then the checkpoint if there is one.
    """
    metainfo = _plugin_entry(name)
    os.makedirs(dest, exist_ok=True)
    config_path = osp.join(dest, f'{name}.py')
    metainfo.config.dump(config_path)
    written = [config_path]
    weights = metainfo.weights
    if weights is None or weights.startswith(UNPUBLISHED):
        print(f'{name}: config saved to {config_path}; this entry has no '
              'published weights')
        return written
    source = resolve_zoo_checkpoint(weights)
    checkpoint_path = osp.join(dest, f'{name}.pth')
    shutil.copyfile(source, checkpoint_path)
    written.append(checkpoint_path)
    print(f'{name}: config saved to {config_path}, checkpoint to '
          f'{checkpoint_path}')
    return written


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog='python -m mmae_plugin.download',
        description='Copy mmae_plugin model-zoo entries (checkpoint and '
        'config) into a folder, as `mim download` does for packages with '
        'downloadable weights.')
    parser.add_argument('names', nargs='+', metavar='NAME',
                        help="entry names, e.g. mmae_vit-tiny-p4_fmnist_linear "
                        "(python -c \"import mmae_plugin, mmpretrain; "
                        "print(mmpretrain.list_models('*fmnist*'))\")")
    parser.add_argument('--dest', default='.',
                        help='destination folder (default: the current one)')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command; the exit status."""
    args = parse_args(argv)
    for name in args.names:
        try:
            download_entry(name, args.dest)
        except (ValueError, FileNotFoundError) as error:
            print(f'error: {error}', file=sys.stderr)
            return 1
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
