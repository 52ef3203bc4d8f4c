"""Step 0 of the mosaic study (docs/mosaic.md) on existing checkpoints:
top-k principal-component probes, the whitened probe and the effective
rank of Fashion-MNIST features.

Example::

    python tools/analysis/mosaic_step0.py \\
        --checkpoint MAE=checkpoints/fmnist/mae_vit-tiny-p4_fmnist.pth \\
        --checkpoint M-MAE=checkpoints/fmnist/mmae_vit-tiny-p4_fmnist.pth \\
        --random-init 0 --out docs/mosaic/step0.json
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
from typing import Optional, Sequence

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--checkpoint',
        action='append',
        default=[],
        metavar='NAME=PATH',
        help='a checkpoint with backbone.* weights (repeat)')
    parser.add_argument(
        '--random-init',
        type=int,
        metavar='SEED',
        help='also the randomly initialised encoder of this seed')
    parser.add_argument('--out', required=True, help='results (JSON)')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    import mmae_plugin.registration  # noqa: F401
    from mmae_compare.protocol import random_init_state
    from studies import mosaic_step0
    checkpoints = dict(item.split('=', 1) for item in args.checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_init is not None:
            path = osp.join(tmp, 'random_init.pth')
            state = random_init_state(mosaic_step0.EVAL_CONFIG,
                                      args.random_init)
            torch.save({'state_dict': state}, path)
            checkpoints[f'random init (seed {args.random_init})'] = path
        results = {}
        for name, path in checkpoints.items():
            print(f'[step0] {name}: {path}', flush=True)
            results[name] = mosaic_step0.checkpoint_readings(path)
            os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
            mosaic_step0.write_json(args.out, results)
    for pooling in ('cls', 'mean'):
        print(f'\n{pooling}:\n' +
              mosaic_step0.markdown_table(results, pooling))
    return 0


if __name__ == '__main__':
    sys.exit(main())
