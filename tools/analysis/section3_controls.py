"""The section-3 statements of *Information Flow in Self-Supervised
Learning* under every reading (baselines, held-out or training batches,
"meet" as difference or equivalence), on the Siamese campaign and on its
width and length controls (``dev/section3_controls.sh``), side by side.

Example::

    python tools/analysis/section3_controls.py \\
        --control 'base=docs/siamese:128:projector 128, 30 epochs' \\
        --control 'width512=docs/siamese_controls/width512:512:projector \\
512, 30 epochs' \\
        --report docs/siamese_controls.md

The first ``--control`` is the base every other is compared with. Roles
(simclr, byol, barlowtwins, spectral) are the arms whose names start with
them (``simclr512``).
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


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--control',
        action='append',
        required=True,
        metavar='NAME=DIR:D:TITLE',
        help='a comparison folder holding runs.json, its '
        'embedding width D and what it changes (the first '
        'is the base)')
    parser.add_argument('--report', required=True, help='markdown page')
    parser.add_argument('--notes', help='markdown appended to the page')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from studies.section3_controls import parse_control, write_controls_page
    command = 'python tools/analysis/section3_controls.py ' + ' '.join(
        map(shlex.quote, argv))
    try:
        controls = [parse_control(text) for text in args.control]
        path = write_controls_page(controls, args.report, command, args.notes)
    except (ValueError, FileNotFoundError) as error:
        print(f'section3_controls.py: error: {error}', file=sys.stderr)
        return 2
    print(f'[section3_controls] page written to {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
