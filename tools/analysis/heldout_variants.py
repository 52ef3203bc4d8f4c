"""Measure a comparison's kept checkpoints again with MatrixInfoHook's
held-out pass under other estimator settings (Renyi order, kernel, batch
size, BatchNorm mode, branch output), and tabulate how each quantity
changes over training under each (see
``mmae_plugin.comparison.heldout_variants``).

Example::

    python tools/analysis/heldout_variants.py --out-dir work_dirs/siamese \\
        --arms simclr byol barlowtwins spectral --seeds 0 1 2 3 4 \\
        --epochs 1 10 30 --report docs/siamese/heldout_variants.md

With three epochs (first, mid-training, last) each of the paper's
statements is decided again under each estimator, as
``tools/analysis/information_flow.py`` decides it on the logged curves;
with two, only the rises are tabulated.
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
    parser.add_argument('--epochs', type=int, nargs='+', required=True,
                        metavar='EPOCH',
                        help='FIRST [MID] LAST: kept checkpoint epochs')
    parser.add_argument('--arm', action='append', default=[],
                        metavar='ROLE=NAME',
                        help='arm of a statement\'s role (simclr, byol, '
                        'barlowtwins, spectral); default the role name')
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS),
                        help='default: all')
    parser.add_argument('--report', required=True,
                        help='markdown table written here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if len(args.epochs) not in (2, 3):
        print(f'--epochs takes FIRST [MID] LAST, got {args.epochs}',
              file=sys.stderr)
        return 2
    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.comparison import spec as layout
    from mmae_plugin.comparison.heldout_variants import (measure_variants,
                                                         variant_report)
    from mmae_plugin.comparison.information_flow import resolve_roles
    spec = layout.load(args.out_dir)
    labels = {arm.name: arm.label for arm in spec.arms}
    first, last = args.epochs[0], args.epochs[-1]
    mid = args.epochs[1] if len(args.epochs) == 3 else None
    try:
        roles = resolve_roles(args.arms, dict(
            item.partition('=')[::2] for item in args.arm))
    except ValueError as error:
        print(f'heldout_variants.py: error: {error}', file=sys.stderr)
        return 2
    rows = measure_variants(args.out_dir, args.arms, args.seeds,
                            args.epochs, args.variants)
    with open(args.report, 'w') as f:
        f.write('\n'.join(variant_report(rows, roles, labels, first, mid,
                                         last)) + '\n')
    print(f'[heldout_variants] {len(rows)} measurements; table written to '
          f'{args.report}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
