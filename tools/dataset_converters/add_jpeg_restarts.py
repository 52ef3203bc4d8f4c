"""Copy an image dataset with a restart marker after every MCU of its JPEGs.

The recipes' loader (``DecodeRandomResizedCrop`` with the region decoder of
``mmae_plugin/datasets/transforms/jpeg_region.py``) decodes only the crop
box of each baseline JPEG. In a JPEG restarted at every MCU (DRI = 1) it
also skips the Huffman decoding of every MCU outside the box: about 15%
less decode time per image. This script makes such a copy of a dataset
(ImageNet has no restart markers) with libjpeg-turbo's ``jpegtran -copy all
-optimize -restart 1B``, which is lossless: the same DCT coefficients, so
the same pixels, EXIF / ICC markers kept, progressive files written as
sequential ones, and with ``-optimize`` photographs about 2% smaller than
the originals despite the markers.

Every file under ``SRC`` is mirrored into ``DST`` at the same relative path:
JPEGs (by content, whatever the extension) converted, anything else
(annotation lists, PNGs, JPEGs ``jpegtran`` refuses) copied byte for byte.
``DST`` must be new, empty, or an earlier (possibly killed) conversion of
``SRC``: its record ``DST/.mmae_jpeg_restarts.jsonl`` lets a rerun skip the
files already done, and a file in ``DST`` that this tool did not write is
never overwritten (see :mod:`mmae_plugin.datasets.jpeg_restarts`).
``--verify`` checks each conversion's pixels with OpenCV.

Needs ``jpegtran`` (Debian / Ubuntu: ``apt-get install libjpeg-turbo-progs``).
A refused argument or folder and a failed check are answered with one line
on stderr and exit status 1.

Usage:
    python tools/dataset_converters/add_jpeg_restarts.py SRC DST \\
        [--workers N] [--verify] [--jpegtran PATH]
"""
import argparse
import sys
import time

from mmae_plugin.datasets.jpeg_restarts import convert_tree

# Seconds between progress lines on a terminal.
PROGRESS_INTERVAL_S = 10.0


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's arguments."""
    parser = argparse.ArgumentParser(
        description='Copy an image dataset with a restart marker after '
        'every MCU of its JPEGs (lossless; faster crop decoding)')
    parser.add_argument('src', help='the dataset folder')
    parser.add_argument(
        'dst',
        help='the output folder (new, empty, or an '
        "earlier run's output to resume)")
    parser.add_argument(
        '--workers',
        type=int,
        default=1,
        help='processes converting files (default: 1)')
    parser.add_argument(
        '--verify',
        action='store_true',
        help='check that each converted JPEG decodes to the same pixels')
    parser.add_argument(
        '--jpegtran',
        default='jpegtran',
        help='the jpegtran executable (default: jpegtran from $PATH)')
    return parser.parse_args(argv)


class Progress:
    """Prints (files done, files in all) to stderr now and then, on a
    terminal only (a log would fill with them)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if sys.stderr.isatty() and now - self.last >= PROGRESS_INTERVAL_S:
            self.last = now
            print(f'{done}/{total} files', file=sys.stderr, flush=True)


def summary(counts: dict) -> str:
    """One line saying what was done and how the size changed."""
    change = (100.0 * (counts['bytes_out'] - counts['bytes_in']) /
              counts['bytes_in'] if counts['bytes_in'] else 0.0)
    return (f"converted {counts['converted']} JPEGs, copied "
            f"{counts['copied']} files, skipped {counts['skipped']} done "
            f"before; {counts['bytes_in']} bytes in, {counts['bytes_out']} "
            f'bytes out ({change:+.2f}%)')


def main(argv=None) -> int:
    """Run the command; the exit status."""
    args = parse_args(argv)
    try:
        counts = convert_tree(
            args.src,
            args.dst,
            workers=args.workers,
            jpegtran=args.jpegtran,
            verify=args.verify,
            progress=Progress())
    except (ValueError, RuntimeError, OSError) as error:
        # One line naming the problem; the type says which kind it is.
        print(
            f'add_jpeg_restarts.py: error: {type(error).__name__}: {error}',
            file=sys.stderr)
        return 1
    print(summary(counts))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
