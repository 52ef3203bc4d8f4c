"""The study driver: every run, seed-major, resumable after any kill.

The parent process runs what a kill interrupted first, then the
comparison seed-major (every unsupervised arm of seed 0, then seed 1, ...),
the supervised control last (:func:`schedule_order`), ``jobs`` runs at a
time; each step of a run is a child process (fresh mmengine global state,
``threads`` torch threads):

* ``train``: train from the last checkpoint to the next evaluation epoch
  (:func:`~mmae_plugin.evidence.training.train_segment`);
* ``init``: write the random-init control's ``epoch_0.pth``;
* ``eval``: evaluate one kept checkpoint and write ``eval/epoch<e>.json``
  atomically.

A step whose output exists is skipped, so rerunning the same command after a
kill continues where it stopped: finished evaluations are never redone and
training resumes from the newest complete checkpoint.
"""
import argparse
import os
import os.path as osp
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .study import (REPO, Study, arm_by_name, arm_eval_epochs, checkpoint_path,
                    eval_path, freeze_configs, freeze_study,
                    frozen_config_path, last_checkpoint_epoch, load_study,
                    read_json, run_dir, write_json_atomic)

CHILD_MODULE = 'mmae_plugin.evidence.driver'


# ----------------------------------------------------------------------------
# Child steps
# ----------------------------------------------------------------------------
def step_train(out_dir: str, study: Study, arm_name: str, seed: int,
               stop_epoch: int) -> None:
    from .training import train_segment
    arm = arm_by_name(arm_name)
    train_segment(frozen_config_path(out_dir, arm.name), study, arm, seed,
                  run_dir(out_dir, arm.name, seed), stop_epoch)


def step_init(out_dir: str, study: Study, arm_name: str, seed: int) -> None:
    import torch
    from .evaluate import random_init_state
    state = random_init_state(frozen_config_path(out_dir, 'eval'), seed)
    path = checkpoint_path(out_dir, arm_name, seed, 0)
    os.makedirs(osp.dirname(path), exist_ok=True)
    torch.save({'state_dict': state,
                'meta': {'evidence': {'arm': arm_name, 'seed': seed}}},
               path + '.tmp')
    os.replace(path + '.tmp', path)


def step_eval(out_dir: str, study: Study, arm_name: str, seed: int,
              epoch: int) -> None:
    from .evaluate import evaluate_checkpoint
    start = time.time()
    checkpoint = checkpoint_path(out_dir, arm_name, seed, epoch)
    metrics = evaluate_checkpoint(
        frozen_config_path(out_dir, 'eval'), checkpoint, seed, study.shots,
        study.bank_images, study.test_images, study.weight_decay,
        features_out=eval_path(out_dir, arm_name, seed, epoch)[:-5] +
        '_test_features.pt')
    metrics.update(arm=arm_name, seed=seed, epoch=epoch,
                   checkpoint=osp.relpath(checkpoint, out_dir),
                   eval_s=round(time.time() - start, 1))
    write_json_atomic(eval_path(out_dir, arm_name, seed, epoch), metrics)


def child_main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry of a child process: ``python -m mmae_plugin.evidence.driver``."""
    parser = argparse.ArgumentParser()
    parser.add_argument('step', choices=('train', 'init', 'eval'))
    parser.add_argument('out_dir')
    parser.add_argument('arm')
    parser.add_argument('seed', type=int)
    parser.add_argument('epoch', type=int)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    import mmae_plugin.registration  # noqa: F401
    study = load_study(args.out_dir)
    if args.step == 'train':
        step_train(args.out_dir, study, args.arm, args.seed, args.epoch)
    elif args.step == 'init':
        step_init(args.out_dir, study, args.arm, args.seed)
    else:
        step_eval(args.out_dir, study, args.arm, args.seed, args.epoch)


# ----------------------------------------------------------------------------
# The plan of a run and the parent loop
# ----------------------------------------------------------------------------
def pending_steps(out_dir: str, study: Study, arm_name: str,
                  seed: int) -> List[Tuple[str, int]]:
    """The steps a run still needs, in order, from what is on disk.

    Returns:
        ``[(step, epoch), ...]``: for each evaluation epoch without its
        ``eval/epoch<e>.json``, a ``train`` (or ``init``) step to that epoch
        unless its checkpoint exists, then an ``eval`` step.
    """
    arm = arm_by_name(arm_name)
    directory = run_dir(out_dir, arm_name, seed)
    trained = last_checkpoint_epoch(directory) or 0
    steps = []
    for epoch in arm_eval_epochs(study, arm):
        if osp.isfile(eval_path(out_dir, arm_name, seed, epoch)):
            continue
        if not osp.isfile(checkpoint_path(out_dir, arm_name, seed, epoch)):
            if not arm.trains:
                steps.append(('init', epoch))
            elif epoch > trained:
                steps.append(('train', epoch))
                trained = epoch
            else:
                # An evaluation epoch behind the newest checkpoint whose file
                # is gone: it cannot be rebuilt without retraining.
                raise FileNotFoundError(
                    f'{checkpoint_path(out_dir, arm_name, seed, epoch)} is '
                    f'missing but the run is already at epoch {trained}; '
                    'delete the run directory to retrain it')
        steps.append(('eval', epoch))
    return steps


def run_order(study: Study) -> List[Tuple[str, int]]:
    """Seed-major: every arm of the first seed, then the next seed."""
    return [(arm, seed) for seed in study.seeds for arm in study.arms]


def run_started(out_dir: str, study: Study, arm_name: str,
                seed: int) -> bool:
    """Whether a run has anything on disk (a checkpoint or an evaluation)."""
    row = run_status(out_dir, study, arm_name, seed)
    return row['epoch'] is not None or bool(row['evals_done'])


def schedule_order(out_dir: str, study: Study) -> List[Tuple[str, int]]:
    """The order in which the runs are executed.

    Runs already started come first (resuming finishes what a kill
    interrupted before anything new takes disk and cores); then the
    comparison the study is for, seed-major (the controls that cost nothing
    to train and the self-supervised arms, so every finished seed adds one
    pair to the paired intervals); the supervised control, which costs
    about twice an MAE run per epoch, last. The order changes when results
    arrive, never what a run computes.

    Returns:
        ``[(arm, seed), ...]``: every run of :func:`run_order`, reordered.
    """
    order = run_order(study)
    started = [run for run in order if run_started(out_dir, study, *run)]
    rest = [run for run in order if run not in started]
    supervised = [run for run in rest
                  if arm_by_name(run[0]).kind == 'supervised']
    return started + [run for run in rest if run not in supervised] + \
        supervised


def child_command(step: str, out_dir: str, arm: str, seed: int, epoch: int,
                  threads: int) -> List[str]:
    return [sys.executable, '-m', CHILD_MODULE, step, out_dir, arm,
            str(seed), str(epoch), '--threads', str(threads)]


def run_steps(out_dir: str, study: Study, arm: str, seed: int, threads: int,
              log: Callable[[str], None]) -> bool:
    """Run a run's pending steps in child processes; False on a failure."""
    directory = run_dir(out_dir, arm, seed)
    os.makedirs(directory, exist_ok=True)
    for step, epoch in pending_steps(out_dir, study, arm, seed):
        start = time.time()
        with open(osp.join(directory, 'run.log'), 'a') as out:
            proc = subprocess.run(
                child_command(step, out_dir, arm, seed, epoch, threads),
                # From this checkout's root, ``-m`` imports this checkout's
                # package (before any other install of it).
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            log(f'{arm} seed {seed}: {step} to epoch {epoch} failed '
                f'(exit {proc.returncode}); see {directory}/run.log')
            return False
        log(f'{arm} seed {seed}: {step} epoch {epoch} done in '
            f'{time.time() - start:.0f} s')
    return True


def run_study(out_dir: str, study: Study, jobs: int = 1,
              threads: Optional[int] = None) -> List[str]:
    """Run (or continue) every run of the study.

    Args:
        out_dir: Where the runs live (absolute).
        study: The study; must match the one recorded in ``out_dir``.
        jobs: Runs in parallel.
        threads: torch threads per child (default cores / jobs).

    Returns:
        The runs that failed (``'<arm> seed <k>'``), empty if none.
    """
    if jobs < 1:
        raise ValueError(f'jobs must be >= 1, got {jobs}')
    os.makedirs(out_dir, exist_ok=True)
    study = freeze_study(out_dir, study)
    freeze_configs(out_dir, study)
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(f'[study {time.strftime("%H:%M:%S")}] {message}',
                  flush=True)

    order = schedule_order(out_dir, study)
    log(f'{len(order)} runs, {jobs} at a time, {threads} threads each; '
        f'status: {summary_line(out_dir, study)}')
    failed = []

    def one(arm: str, seed: int) -> None:
        if not run_steps(out_dir, study, arm, seed, threads, log):
            failed.append(f'{arm} seed {seed}')

    with ThreadPoolExecutor(jobs) as pool:
        for future in [pool.submit(one, arm, seed) for arm, seed in order]:
            future.result()
    log(f'finished; status: {summary_line(out_dir, study)}')
    return failed


# ----------------------------------------------------------------------------
# Status
# ----------------------------------------------------------------------------
def run_status(out_dir: str, study: Study, arm_name: str,
               seed: int) -> Dict[str, object]:
    """What one run has on disk: newest epoch, evaluations done / wanted."""
    arm = arm_by_name(arm_name)
    directory = run_dir(out_dir, arm_name, seed)
    wanted = arm_eval_epochs(study, arm)
    done = [e for e in wanted
            if osp.isfile(eval_path(out_dir, arm_name, seed, e))]
    trained = last_checkpoint_epoch(directory) if arm.trains else (
        0 if osp.isfile(checkpoint_path(out_dir, arm_name, seed, 0))
        else None)
    return {'arm': arm_name, 'seed': seed, 'epoch': trained,
            'epochs': study.epochs if arm.trains else 0,
            'evals_done': done, 'evals_wanted': list(wanted)}


def run_statuses(out_dir: str, study: Study) -> List[Dict[str, object]]:
    """:func:`run_status` of every run, in :func:`run_order`."""
    return [run_status(out_dir, study, arm, seed)
            for arm, seed in run_order(study)]


def is_finished(row: Dict[str, object]) -> bool:
    return row['evals_done'] == row['evals_wanted']


def summary_line(out_dir: str, study: Study) -> str:
    return progress_text(run_statuses(out_dir, study))


def progress_text(rows: List[Dict[str, object]]) -> str:
    """``'k of n runs finished, m of M evaluations done'`` of
    :func:`run_statuses` rows."""
    finished = sum(map(is_finished, rows))
    evals = sum(len(r['evals_done']) for r in rows)
    wanted = sum(len(r['evals_wanted']) for r in rows)
    return (f'{finished} of {len(rows)} runs finished, {evals} of {wanted} '
            'evaluations done')


def unfinished_text(rows: List[Dict[str, object]]) -> str:
    """The unfinished runs of :func:`run_statuses` rows, one clause each:
    ``'supervised (control) seed 2 (trained to epoch 10 of 20, 2 of 4
    evaluations)'``."""
    clauses = []
    for row in rows:
        if is_finished(row):
            continue
        arm = arm_by_name(row['arm'])
        if row['epoch'] is None:
            trained = 'not started'
        elif arm.trains:
            trained = f'trained to epoch {row["epoch"]} of {row["epochs"]}'
        else:
            trained = 'initialised'
        clauses.append(
            f'{arm.label} seed {row["seed"]} '
            f'({trained}, {len(row["evals_done"])} of '
            f'{len(row["evals_wanted"])} evaluations)')
    return '; '.join(clauses)


def status_text(out_dir: str) -> str:
    """A table of every run: trained epochs and evaluations done."""
    study = load_study(out_dir)
    lines = [f'study in {out_dir}: {study.images} images, {study.epochs} '
             f'epochs, seeds {list(study.seeds)}, evaluations at epochs '
             f'{list(study.eval_epochs)}', '',
             f'{"arm":<22} {"seed":>4}  {"trained":>9}  evaluations done']
    for arm, seed in run_order(study):
        row = run_status(out_dir, study, arm, seed)
        trained = '-' if row['epoch'] is None else \
            f'{row["epoch"]}/{row["epochs"]}'
        done = ','.join(map(str, row['evals_done'])) or '-'
        lines.append(f'{arm:<22} {seed:>4}  {trained:>9}  {done} '
                     f'(of {",".join(map(str, row["evals_wanted"]))})')
    lines += ['', summary_line(out_dir, study)]
    return '\n'.join(lines)


def load_evaluations(out_dir: str, study: Study) -> List[dict]:
    """Every finished evaluation of the study, as rows."""
    rows = []
    for arm, seed in run_order(study):
        for epoch in arm_eval_epochs(study, arm_by_name(arm)):
            path = eval_path(out_dir, arm, seed, epoch)
            if osp.isfile(path):
                rows.append(read_json(path))
    return rows


def recompute_statistics(out_dir: str) -> int:
    """Recompute every evaluation's ``<pooling>/repr/*`` from its saved test
    features with the current :mod:`mmae_plugin.evaluation.statistics`.

    The accuracies are left as they are; the representation statistics
    follow the definitions (and key names) of the code that runs this, so a
    study evaluated across a change of those definitions reads as one.

    Returns:
        The number of evaluations rewritten.
    """
    import torch
    from mmae_plugin.evaluation.statistics import representation_statistics
    from .evaluate import split_poolings
    study = load_study(out_dir)
    count = 0
    for arm, seed in run_order(study):
        for epoch in arm_eval_epochs(study, arm_by_name(arm)):
            path = eval_path(out_dir, arm, seed, epoch)
            features = path[:-5] + '_test_features.pt'
            if not (osp.isfile(path) and osp.isfile(features)):
                continue
            row = {key: value for key, value in read_json(path).items()
                   if '/repr/' not in key}
            saved = torch.load(features, map_location='cpu',
                               weights_only=True)
            for pooling, x in split_poolings(saved['cls+mean']).items():
                row.update({f'{pooling}/repr/{key}': value for key, value in
                            representation_statistics(x.double()).items()})
            write_json_atomic(path, row)
            count += 1
    return count


if __name__ == '__main__':
    child_main()
