"""The results and verdicts of the mosaic study (docs/mosaic.md) from its
runs.json, against the criteria fixed before the runs.

Example::

    bash dev/mosaic_study.sh export   # work_dirs/mosaic -> docs/mosaic/
    python tools/analysis/mosaic_report.py --runs docs/mosaic/runs.json \\
        --page docs/mosaic.md --cost docs/mosaic/cost.json
"""
import argparse
import json
import os.path as osp
import sys
from typing import Optional, Sequence

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--runs', required=True, help="the study's runs.json")
    parser.add_argument(
        '--page',
        required=True,
        help='the page; what follows its results marker is rewritten')
    parser.add_argument(
        '--cost',
        help="the study's cost.json (written by dev/mosaic_study.sh export)"
        '; adds a cost section')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from studies.mosaic_report import write_page
    with open(args.runs) as f:
        runs = json.load(f)
    costs = None
    if args.cost:
        with open(args.cost) as f:
            costs = json.load(f)
    write_page(args.page, runs, costs)
    print(f'[mosaic] results written to {args.page}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
