"""MAE vs M-MAE with controls, in a regime that can decide: the long study.

All 60,000 Fashion-MNIST training images, >= 20 epochs, several seeds;
arms MAE, M-MAE (lambda 0.01 and 0.00125, mu 1), a random-init encoder and
a supervised ViT of the same architecture and budget; every evaluation
epoch's checkpoint through weighted kNN (float64), a linear probe and
low-shot probes (10 and 100 labels per class) on the CLS token and on CLS +
mean patch token. Runs live in ``<out-dir>/<arm>/seed<k>/``; rerunning the
same command after a kill continues where it stopped.

Examples::

    python tools/benchmarks/run_study.py --out-dir /work/study --jobs 2
    python tools/benchmarks/run_study.py --out-dir /work/study --status
    python tools/benchmarks/run_study.py --out-dir /work/study --report-only
    python tools/benchmarks/run_study.py --quick --out-dir /tmp/study

On a fresh machine, take the study up from its record in the repository
(finished evaluations and the newest checkpoint of each unfinished run),
and save the record again before the machine goes::

    python tools/benchmarks/run_study.py --out-dir /work/study --jobs 2 \
        --restore docs/study
    python tools/benchmarks/run_study.py --out-dir /work/study \
        --save-state docs/study/state
"""
import argparse
import os
import os.path as osp
import sys

# This checkout's package, whatever else is installed: a study started from
# a clone keeps running the code it started with.
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from mmae_plugin.evidence.driver import (recompute_statistics, run_study,
                                         status_text)
from mmae_plugin.evidence.handover import restore_record, save_state
from mmae_plugin.evidence.study import (freeze_study, full_study,
                                        load_study, quick_study)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be >= 1, got {value}')
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', required=True,
                        help='where the runs live (outside the repository '
                        'for the real study)')
    parser.add_argument('--seeds', type=int, nargs='+',
                        help='seeds, run seed-major (default 0 1 2 3 4; '
                        '--quick: 0 1)')
    parser.add_argument('--epochs', type=positive, default=20,
                        help='training epochs of every trained arm')
    parser.add_argument('--eval-epochs', type=positive, nargs='+',
                        help='epochs evaluated (must end at --epochs; '
                        'default 5 10 15 20 up to --epochs, and --epochs)')
    parser.add_argument('--jobs', type=positive, default=1,
                        help='runs in parallel (each gets cores/jobs '
                        'threads)')
    parser.add_argument('--quick', action='store_true',
                        help='about a minute: 512 images, 2 epochs, small '
                        'evaluation sets')
    parser.add_argument('--report-only', action='store_true',
                        help='only rebuild the report from finished '
                        'evaluations')
    parser.add_argument('--status', action='store_true',
                        help='print which runs, epochs and evaluations are '
                        'done, and exit')
    parser.add_argument('--restats', action='store_true',
                        help='recompute the representation statistics of '
                        'every finished evaluation from its saved test '
                        'features with the current definitions, then '
                        'report')
    parser.add_argument('--restore', metavar='RECORD_DIR',
                        help='first restore a study record (its runs.json '
                        'and state/, e.g. docs/study) into --out-dir, '
                        'keeping what is there')
    parser.add_argument('--save-state', metavar='STATE_DIR',
                        help='keep in STATE_DIR exactly the newest '
                        'checkpoint of every unfinished run, and exit')
    parser.add_argument('--report', help='markdown report path (default '
                        '<out-dir>/report/study.md)')
    args = parser.parse_args(argv)
    args.out_dir = osp.abspath(args.out_dir)
    return args


def reproducing_arguments(argv):
    """The arguments that (re)compute the study: without the ones that only
    report, show or move it."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ('--report-only', '--status', '--restats'):
            continue
        elif arg == '--restore':
            skip = True
        elif not arg.startswith('--restore='):
            kept.append(arg)
    return kept


def study_of(args):
    if args.quick:
        return quick_study(args.seeds or (0, 1))
    try:
        return full_study(args.seeds or (0, 1, 2, 3, 4), args.epochs,
                          args.eval_epochs)
    except ValueError as error:
        raise SystemExit(f'run_study.py: error: {error}')


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.status:
            print(status_text(args.out_dir))
            return
        if args.save_state:
            saved = save_state(args.out_dir, load_study(args.out_dir),
                               args.save_state)
            print(f'[study] {args.save_state} holds {len(saved)} unfinished '
                  f'runs: {", ".join(saved) or "none"}')
            return
        if args.restore:
            os.makedirs(args.out_dir, exist_ok=True)
            print('[study] ' + restore_record(
                args.out_dir, freeze_study(args.out_dir, study_of(args)),
                args.restore), flush=True)
        failed = []
        if args.restats:
            print(f'[study] statistics recomputed for '
                  f'{recompute_statistics(args.out_dir)} evaluations')
            args.report_only = True
        study = study_of(args)
        if not args.report_only:
            failed = run_study(args.out_dir, study, args.jobs)
            if failed:
                print('[study] failed runs: ' + '; '.join(failed),
                      flush=True)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f'run_study.py: error: {error}')
    from mmae_plugin.evidence.report import write_study_report
    command = 'python tools/benchmarks/run_study.py ' + ' '.join(
        reproducing_arguments(sys.argv[1:] if argv is None else argv))
    report = write_study_report(args.out_dir, args.report, command.strip())
    print(f'[study] report written to {report}')
    if failed:
        raise SystemExit(1)


if __name__ == '__main__':
    main()
