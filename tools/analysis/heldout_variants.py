"""Measure a comparison's kept checkpoints again with MatrixInfoHook's
held-out pass under other estimator settings (Renyi order, kernel, batch
size, BatchNorm mode, branch output), and tabulate how each quantity
changes over training under each (see
``mmae_plugin.comparison.heldout_variants``).

Example::

    python tools/analysis/heldout_variants.py --out-dir docs/siamese \\
        --arms simclr byol barlowtwins spectral --seeds 0 1 2 \\
        --epochs 1 30 --report work_dirs/variants.md
"""
import argparse
import sys
from typing import Optional, Sequence


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from mmae_plugin.comparison.heldout_variants import VARIANTS
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out-dir', required=True,
                        help='the comparison folder (with its checkpoints)')
    parser.add_argument('--arms', nargs='+', required=True)
    parser.add_argument('--seeds', type=int, nargs='+', required=True)
    parser.add_argument('--epochs', type=int, nargs=2, required=True,
                        metavar=('FIRST', 'LAST'),
                        help='two kept checkpoint epochs compared')
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS),
                        help='default: all')
    parser.add_argument('--report', required=True,
                        help='markdown table written here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.comparison import spec as layout
    from mmae_plugin.comparison.heldout_variants import (measure_variants,
                                                         variant_table)
    spec = layout.load(args.out_dir)
    labels = {arm.name: arm.label for arm in spec.arms}
    rows = measure_variants(args.out_dir, args.arms, args.seeds,
                            args.epochs, args.variants)
    first, last = args.epochs
    with open(args.report, 'w') as f:
        f.write('\n'.join(variant_table(rows, first, last, labels)) + '\n')
    print(f'[heldout_variants] {len(rows)} measurements; table written to '
          f'{args.report}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
