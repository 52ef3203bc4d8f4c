"""Figures 1-3 of *Information Flow in Self-Supervised Learning* and a
verdict on each of its statements, from a ``tools/compare.py`` comparison
of Siamese methods trained with ``MatrixInfoHook`` (its per-epoch curves
in ``runs.json``; see ``studies.information_flow``).

Example::

    python tools/analysis/information_flow.py --out-dir docs/siamese \\
        --report docs/siamese_information_flow.md

Arms are found by name (``simclr``, ``byol``, ``barlowtwins``,
``spectral``); ``--arm ROLE=NAME`` maps other names.
"""
import argparse
import os.path as osp
import shlex
import sys
from typing import Optional, Sequence

# The studies (studies/) are this repository's, not the plugin's: run from a
# checkout, with its root importable wherever the script is started from.
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from studies.information_flow import ROLES, resolve_roles  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--out-dir',
        required=True,
        help='the comparison folder (or one holding only '
        'its runs.json)')
    parser.add_argument('--report', required=True, help='markdown page')
    parser.add_argument(
        '--arm',
        action='append',
        default=[],
        metavar='ROLE=NAME',
        help=f'arm of a role ({", ".join(ROLES)}); default '
        'the role name (spectral is optional)')
    parser.add_argument(
        '--first',
        type=int,
        default=1,
        help='epoch a rise is measured from (0: init)')
    parser.add_argument(
        '--mid', type=int, help='mid-training epoch (default half the epochs)')
    parser.add_argument(
        '--prefixes',
        nargs='+',
        default=['minfo_heldout', 'minfo'],
        help='MatrixInfoHook key prefixes to decide on and '
        'draw')
    parser.add_argument(
        '--feature-dim',
        type=int,
        default=128,
        help='embedding width d (the figures draw ln d)')
    parser.add_argument('--kernel', default='cov', choices=('cov', 'gram'))
    parser.add_argument('--notes', help='markdown appended to the page')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from mmae_compare.records import read_runs
    from studies.information_flow_report import write_information_flow_page
    given = dict(item.partition('=')[::2] for item in args.arm)
    try:
        if args.feature_dim < 2:
            raise ValueError(f'--feature-dim must be >= 2, got '
                             f'{args.feature_dim}')
        names = [a.name for a in read_runs(args.out_dir)[0].arms]
        arms = resolve_roles(names, given)
        command = 'python tools/analysis/information_flow.py ' + ' '.join(
            map(shlex.quote, argv))
        path = write_information_flow_page(args.out_dir, args.report, arms,
                                           command, args.first, args.mid,
                                           args.prefixes, args.kernel,
                                           args.notes, args.feature_dim)
    except (ValueError, FileNotFoundError) as error:
        print(f'information_flow.py: error: {error}', file=sys.stderr)
        return 2
    print(f'[information_flow] page written to {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
