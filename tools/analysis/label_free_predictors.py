"""Do label-free representation statistics predict linear-probe accuracy?

Spearman and Kendall (tau-b) rank correlations between each statistic
(``<pooling>/repr/<statistic>``) and the accuracy of a ``tools/compare.py``
comparison (its out dir or a ``runs.json``), with 95 % bootstrap intervals
over seeds: (a) across arms at a fixed epoch, (b) across epochs within an
arm, (c) across lambda. The logic is
``studies.predictors``.

Example::

    python tools/analysis/label_free_predictors.py docs/study/runs.json \\
        --pooling cls --epoch 20 --json /tmp/predictors.json
"""
import argparse
import os.path as osp
import sys
from typing import Optional, Sequence

# The studies (studies/) are this repository's, not the plugin's: run from a
# checkout, with its root importable wherever the script is started from.
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from studies import predictors  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        'runs_json', help="a comparison's out dir or "
        'runs.json')
    parser.add_argument(
        '--pooling',
        default='cls',
        help='feature pooling (cls, cls+mean, mean)')
    parser.add_argument(
        '--accuracy',
        default='linear_top1',
        help='accuracy metric (default linear_top1)')
    parser.add_argument(
        '--epoch',
        type=int,
        help='fixed budget of (a) and (c) (default: the '
        "reference arm's last epoch, or without it the "
        'last epoch every trained arm reached)')
    parser.add_argument(
        '--reference', default='mae', help='the arm that is lambda = 0 in (c)')
    parser.add_argument(
        '--statistics', nargs='+', default=list(predictors.STATISTICS))
    parser.add_argument('--resamples', type=int, default=10000)
    parser.add_argument(
        '--seed', type=int, default=0, help='seed of the bootstrap')
    parser.add_argument('--json', help='also write the numbers here')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print the correlations' table (and write them as JSON)."""
    args = parse_args(argv)
    try:
        rows = predictors.load_rows(args.runs_json)
        epoch = predictors.fixed_epoch(rows, args.epoch, args.reference)
        results = predictors.correlations(rows, args.pooling, args.accuracy,
                                          epoch, args.reference,
                                          args.statistics, args.resamples,
                                          args.seed)
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise SystemExit(f'label_free_predictors.py: error: {error}')
    notes = predictors.inapplicable(rows, epoch, args.reference)
    print('\n'.join(
        predictors.report_lines(rows, results, args.pooling, args.accuracy,
                                args.resamples, notes)))
    if args.json:
        predictors.write_json(args.json, results)


if __name__ == '__main__':
    sys.exit(main())
