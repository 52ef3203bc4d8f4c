"""Compare training configs over seeds: each arm against a reference arm.

Every arm (a config with its options) is trained under every seed for the
same epochs; the checkpoints of the evaluation epochs go through the
plugin's frozen evaluation (kNN, linear and low-shot probes on the chosen
poolings) and/or ``tools/test.py`` configs; the report pairs each arm with
the reference by seed (95 % Student-t intervals, the n of every cell).
One submitit job per (arm, seed), local processes or Slurm jobs; rerunning
the same command, or a requeued job, continues where it stopped.
Everything is written under --out-dir (``runs.json`` holds the results;
``report`` re-reports from it alone).

Examples::

    python tools/compare.py run --out-dir work_dirs/cmp \\
        --arm mae=configs/fashion_mnist/mae_fmnist.py \\
        --arm 'mmae=configs/fashion_mnist/mmae_fmnist.py \\
               model.regularizer.loss_weight=0.01' \\
        --reference mae --seeds 0 1 2 --epochs 3 \\
        --eval-config configs/fashion_mnist/knn_fmnist_clsmean.py
    python tools/compare.py run ... --cluster slurm --partition gpu \\
        --gpus 1 --cpus-per-task 8 --time-min 240
    python tools/compare.py status --out-dir work_dirs/cmp
    python tools/compare.py report --out-dir work_dirs/cmp
"""
import argparse
import os.path as osp
import shlex
import sys
from typing import List, Optional, Sequence

from mmae_compare import records
from mmae_compare import spec as layout
from mmae_compare.spec import Comparison, Protocol, parse_arm, parse_options


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be >= 1, got {value}')
    return value


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """What is compared: arms, seeds, budget, protocol."""
    group = parser.add_argument_group('comparison')
    group.add_argument(
        '--arm',
        action='append',
        required=True,
        metavar="'NAME=CONFIG [KEY=VALUE ...]'",
        help='one arm: a training config (a path, or one '
        'shipped in mmae_plugin/.mim/) and its --cfg-options; '
        'CONFIG "random" is the evaluation encoder untrained '
        '(repeat for every arm)')
    group.add_argument(
        '--label',
        action='append',
        default=[],
        metavar='NAME=TEXT',
        help="an arm's name in the report")
    group.add_argument(
        '--reference',
        required=True,
        help='the arm every other is paired with')
    group.add_argument('--seeds', type=int, nargs='+', required=True)
    group.add_argument(
        '--epochs',
        type=positive,
        required=True,
        help='training epochs of every trained arm')
    group.add_argument(
        '--eval-epochs',
        type=positive,
        nargs='+',
        help='epochs evaluated (ending at --epochs; default '
        'only --epochs)')
    group.add_argument(
        '--images', type=positive, help='train on the first N training images')
    group.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='options of every trained arm (before its own)')
    group = parser.add_argument_group('evaluation protocol')
    group.add_argument(
        '--eval-config',
        help='KNNClassifier config of the frozen evaluation '
        '(a cls+mean one gives every pooling)')
    group.add_argument(
        '--poolings',
        nargs='+',
        default=['cls', 'cls+mean'],
        choices=layout.POOLINGS)
    group.add_argument(
        '--shots',
        type=positive,
        nargs='*',
        default=[10, 100],
        help='labels per class of the low-shot probes')
    group.add_argument(
        '--bank-images',
        type=positive,
        help='first N training images for kNN and probes')
    group.add_argument(
        '--test-images', type=positive, help='first M test images classified')
    group.add_argument(
        '--evaluation',
        choices=layout.EVALUATIONS,
        default='frozen',
        help='frozen: kNN, linear and low-shot probes of one label per '
        'image; mosaic: per-cell, principal-subspace and presence probes '
        'of FashionMNISTMosaic features (docs/mosaic.md)')
    group.add_argument(
        '--weight-decay',
        type=float,
        default=1e-4,
        help='L2 coefficient of the linear probes')
    group.add_argument(
        '--test-config',
        action='append',
        default=[],
        metavar='NAME=CONFIG',
        help='also run tools/test.py CONFIG on each '
        'checkpoint; its metrics are NAME/<metric>')


def add_execution_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group('execution (submitit)')
    group.add_argument(
        '--cluster', choices=('local', 'slurm'), default='local')
    group.add_argument('--partition', help='Slurm partition')
    group.add_argument(
        '--gpus',
        type=int,
        default=0,
        help='GPUs per job (one task each; more than one '
        'runs MMEngine with --launcher slurm)')
    group.add_argument(
        '--cpus-per-task',
        type=positive,
        default=1,
        help='CPU cores (and torch threads) per task')
    group.add_argument(
        '--time-min',
        type=positive,
        default=24 * 60,
        help='time limit per job; a job reaching it is '
        'requeued and continues')
    group.add_argument(
        '--parallel',
        type=positive,
        default=1,
        help='local executor: jobs at once')
    group.add_argument(
        '--no-wait',
        action='store_true',
        help='submit and exit (report later)')
    group.add_argument(
        '--restore',
        metavar='RUNS_JSON',
        help="take up this comparison's finished results "
        'from a runs.json (another machine, lost run '
        'folders); unfinished runs train again')


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        '--report', help='markdown path (default '
        '<out-dir>/report.md)')
    parser.add_argument('--title', help='the page title')
    parser.add_argument('--notes', help='markdown file appended to the page')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('Examples::')[1])
    commands = parser.add_subparsers(dest='command', required=True)
    run = commands.add_parser(
        'run', help='run (or continue) a comparison, '
        'then report')
    for command in (run,
                    commands.add_parser(
                        'report', help='report from runs.json'),
                    commands.add_parser(
                        'status', help='which runs and evaluations are done')):
        command.add_argument('--out-dir', required=True)
    add_spec_arguments(run)
    add_execution_arguments(run)
    add_report_arguments(run)
    add_report_arguments(commands.choices['report'])
    return parser.parse_args(argv)


def pairs(items: List[str], what: str) -> List[tuple]:
    parsed = [item.partition('=')[::2] for item in items]
    for item, (key, value) in zip(items, parsed):
        if not key or not value:
            raise ValueError(f'{what} must be NAME=VALUE, got {item!r}')
    return parsed


def spec_of(args: argparse.Namespace) -> Comparison:
    labels = dict(pairs(args.label, '--label'))
    arms = [parse_arm(text) for text in args.arm]
    unknown = set(labels) - {arm.name for arm in arms}
    if unknown:
        raise ValueError(f'--label for unknown arms: {sorted(unknown)}')
    arms = [
        parse_arm(text, labels.get(arm.name, ''))
        for text, arm in zip(args.arm, arms)
    ]
    protocol = Protocol(args.eval_config, tuple(args.poolings),
                        tuple(args.shots), args.bank_images, args.test_images,
                        args.weight_decay,
                        tuple(pairs(args.test_config,
                                    '--test-config')), args.evaluation)
    return Comparison(
        tuple(arms), args.reference, tuple(args.seeds), args.epochs,
        tuple(args.eval_epochs or [args.epochs]), protocol, args.images,
        parse_options(args.cfg_options))


def run(args: argparse.Namespace, command: str) -> int:
    from mmae_compare import jobs
    from mmae_compare.protocol import check_evaluation_settings
    asked = spec_of(args)
    # Before anything is recorded or submitted: a setting the evaluation
    # refuses would otherwise fail every job after its training.
    check_evaluation_settings(asked.protocol)
    spec = layout.freeze(args.out_dir, asked)
    if args.restore:
        restored = records.restore_runs(args.out_dir, args.restore)
        print(
            f'[compare] restored {restored[0]} evaluations and the curves '
            f'of {restored[1]} runs from {args.restore}',
            flush=True)
    resources = jobs.Resources(args.cluster, args.cpus_per_task, args.gpus,
                               args.partition, args.time_min, args.parallel)
    todo = jobs.unfinished_runs(args.out_dir, spec)
    print(
        f'[compare] {len(spec.runs()) - len(todo)} of {len(spec.runs())} '
        f'runs finished; submitting {len(todo)} ({args.cluster})',
        flush=True)
    submitted = jobs.submit(args.out_dir, spec, resources, todo)
    if args.no_wait:
        return 0
    failures = jobs.wait(submitted)
    report(args, command)
    if failures:
        print('[compare] failed:\n  ' + '\n  '.join(failures), flush=True)
    return 1 if failures else 0


def report(args: argparse.Namespace, command: str) -> None:
    from mmae_compare.report import write_report
    path = write_report(args.out_dir, args.report, command, args.title,
                        args.notes)
    print(f'[compare] report written to {path}', flush=True)


def reproducing_command(argv: Sequence[str]) -> str:
    """The command line a report names (as given, quoted for a shell)."""
    return 'python tools/compare.py ' + ' '.join(map(shlex.quote, argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.out_dir = osp.abspath(args.out_dir)
    # The two harmless upstream warnings tools/train.py does not print
    # either (mmae_plugin.compat.cli_warnings); the jobs' own output goes to
    # their log files.
    from mmae_plugin.compat.cli_warnings import quiet_known_upstream_warnings
    try:
        with quiet_known_upstream_warnings():
            return command_result(args, argv)
    except (ValueError, FileNotFoundError) as error:
        print(f'compare.py: error: {error}', file=sys.stderr)
        return 2


def command_result(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the asked command; its exit status."""
    if args.command == 'status':
        print(records.status_text(args.out_dir))
        return 0
    if args.command == 'report':
        report(args, reproducing_command(argv))
        return 0
    return run(args, reproducing_command(argv))


if __name__ == '__main__':
    sys.exit(main())
