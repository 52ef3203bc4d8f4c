"""Moving a study to a fresh machine: its record, and how to take it up.

A study outlives the machine it started on when everything it has done is
in its *record*, a directory (the repository's ``docs/study/``):

* ``runs.json``: every finished evaluation (the report writes it);
* ``state/<arm>/seed<k>/epoch_<e>.pth``: the newest checkpoint of every run
  that is started but not finished, with its checksum sidecar
  (:func:`save_state`).

:func:`restore_record` puts both into an empty (or partly filled) out dir:
the evaluations become ``eval/epoch<e>.json`` again, so the driver never
redoes them, and each saved checkpoint becomes its run's
``last_checkpoint``, so training resumes where the old machine stopped
(mmengine's resume loads the optimizer, scheduler and loop state; the
plugin's ``ReseedHook`` derives every random draw from seed, epoch and
iteration, so the resumed run trains what one uninterrupted run trains).
Nothing already in the out dir is overwritten.
"""
import os
import os.path as osp
import shutil
from typing import List, Optional

from mmae_plugin.checkpoint.integrity import sidecar_path

from .driver import is_finished, run_status
from .study import (Study, arm_by_name, arm_eval_epochs, checkpoint_epochs,
                    checkpoint_path, eval_path, last_checkpoint_epoch,
                    read_json, run_dir, write_json_atomic)

STATE_DIR = 'state'
RUNS_FILE = 'runs.json'


def check_row(study: Study, row: dict, source: str) -> None:
    """Refuse a recorded evaluation that is not one of ``study``'s."""
    arm, seed, epoch = row.get('arm'), row.get('seed'), row.get('epoch')
    if arm not in study.arms or seed not in study.seeds:
        raise ValueError(f'{source}: evaluation of arm {arm!r} seed {seed!r} '
                         f'is not in the study (arms {list(study.arms)}, '
                         f'seeds {list(study.seeds)})')
    wanted = arm_eval_epochs(study, arm_by_name(arm))
    if epoch not in wanted:
        raise ValueError(f'{source}: {arm} seed {seed} evaluated at epoch '
                         f'{epoch!r}, the study evaluates it at {wanted}')


def restore_evaluations(out_dir: str, study: Study, runs_json: str) -> int:
    """Write each evaluation of ``runs_json`` that ``out_dir`` lacks.

    Returns:
        The number of evaluations written.
    """
    rows = read_json(runs_json)
    for row in rows:
        check_row(study, row, runs_json)
    written = 0
    for row in rows:
        path = eval_path(out_dir, row['arm'], row['seed'], row['epoch'])
        if not osp.isfile(path):
            write_json_atomic(path, row)
            written += 1
    return written


def saved_epoch(state_dir: str, arm: str, seed: int) -> Optional[int]:
    """Epoch of the one checkpoint ``state_dir`` holds for a run, if any."""
    epochs = checkpoint_epochs(run_dir(state_dir, arm, seed))
    if len(epochs) > 1:
        raise ValueError(f'{run_dir(state_dir, arm, seed)} holds the '
                         f'checkpoints of epochs {epochs}; a saved state is '
                         'one checkpoint per run')
    return epochs[0] if epochs else None


def copy_checkpoint(source: str, target: str) -> None:
    """Copy a checkpoint and its checksum sidecar (atomically each)."""
    os.makedirs(osp.dirname(target), exist_ok=True)
    pairs = [(source, target)]
    if osp.isfile(sidecar_path(source)):
        pairs.append((sidecar_path(source), sidecar_path(target)))
    for src, dst in pairs:
        shutil.copyfile(src, dst + '.tmp')
        os.replace(dst + '.tmp', dst)


def restore_state(out_dir: str, study: Study, state_dir: str) -> List[str]:
    """Make each saved checkpoint its run's ``last_checkpoint``, unless the
    run in ``out_dir`` is already as far.

    Returns:
        ``'<arm> seed <k> epoch <e>'`` of each run restored.
    """
    restored = []
    for arm in study.arms:
        for seed in study.seeds:
            epoch = saved_epoch(state_dir, arm, seed)
            if epoch is None:
                continue
            source = checkpoint_path(state_dir, arm, seed, epoch)
            directory = run_dir(out_dir, arm, seed)
            if (last_checkpoint_epoch(directory) or 0) >= epoch:
                continue
            target = checkpoint_path(out_dir, arm, seed, epoch)
            copy_checkpoint(source, target)
            # mmengine's pointer: the path of the checkpoint to resume.
            with open(osp.join(directory, 'last_checkpoint'), 'w') as f:
                f.write(target)
            restored.append(f'{arm} seed {seed} epoch {epoch}')
    return restored


def restore_record(out_dir: str, study: Study, record_dir: str) -> str:
    """:func:`restore_evaluations` and :func:`restore_state` of a record.

    Returns:
        One line saying what was restored.
    """
    runs_json = osp.join(record_dir, RUNS_FILE)
    if not osp.isfile(runs_json):
        raise FileNotFoundError(f'--restore {record_dir}: no {RUNS_FILE} '
                                'there')
    evaluations = restore_evaluations(out_dir, study, runs_json)
    runs = restore_state(out_dir, study, osp.join(record_dir, STATE_DIR))
    return (f'restored {evaluations} evaluations from {runs_json} and '
            f'{len(runs)} unfinished runs ({", ".join(runs) or "none"})')


def save_state(out_dir: str, study: Study, state_dir: str) -> List[str]:
    """Keep in ``state_dir`` exactly the newest checkpoint of every started,
    unfinished run of ``out_dir`` (finished runs need none: their
    evaluations are in ``runs.json``).

    Returns:
        ``'<arm> seed <k> epoch <e>'`` of each run saved.
    """
    saved = []
    for arm in study.arms:
        for seed in study.seeds:
            epoch = save_run_state(out_dir, study, state_dir, arm, seed)
            if epoch:
                saved.append(f'{arm} seed {seed} epoch {epoch}')
    return saved


def save_run_state(out_dir: str, study: Study, state_dir: str, arm: str,
                   seed: int, attempts: int = 3) -> int:
    """:func:`save_state` of one run.

    A run that is training meanwhile may prune the checkpoint being copied
    (it keeps only the newest); the copy then starts over from the newer one.

    Returns:
        The epoch saved, 0 if none (not started, or finished).
    """
    for attempt in range(attempts):
        epoch = last_checkpoint_epoch(run_dir(out_dir, arm, seed))
        finished = is_finished(run_status(out_dir, study, arm, seed))
        keep = '' if finished or not epoch else \
            checkpoint_path(state_dir, arm, seed, epoch)
        old_epoch = saved_epoch(state_dir, arm, seed)
        old = '' if old_epoch is None else \
            checkpoint_path(state_dir, arm, seed, old_epoch)
        try:
            if keep and old != keep:
                copy_checkpoint(checkpoint_path(out_dir, arm, seed, epoch),
                                keep)
        except FileNotFoundError:
            remove_checkpoint(keep, state_dir)  # half a copy is no state
            if attempt + 1 == attempts:
                raise
            continue
        if old and old != keep:
            remove_checkpoint(old, state_dir)
        return epoch if keep else 0
    return 0


def remove_checkpoint(path: str, root: str) -> None:
    """Delete a saved checkpoint, its sidecar and the folders below ``root``
    it leaves empty."""
    for file in (path, sidecar_path(path)):
        if osp.isfile(file):
            os.remove(file)
    root = osp.abspath(root)
    folder = osp.dirname(osp.abspath(path))
    while folder.startswith(root + os.sep) and not os.listdir(folder):
        os.rmdir(folder)
        folder = osp.dirname(folder)
