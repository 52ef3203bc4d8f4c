"""Which checkpoint a run continues from, and what it must not save over.

:func:`choose_resume_checkpoint`: auto-resume continues from the newest
entry of the current run in the run record (:mod:`.run_record`) whose file
still has its recorded size and SHA-256, or, for a folder without a record,
from the checkpoint whose own ``meta`` says it is the newest (migration).
:func:`in_the_way` names checkpoint files another run wrote that a launch
would save over; the launch then stops (:class:`CheckpointsInTheWay`).
Rules: docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own.
"""
import os
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .integrity import CorruptCheckpointError, checkpoint_problem
from .loading import read_meta
from .run_record import Entry, RunRecord, read_record, record_path

#: Checkpoint names mmengine's ``CheckpointHook`` writes, with their step:
#: ``epoch_N.pth``, ``iter_N.pth`` and ``best_<metric>_<epoch|iter>_N.pth``.
_SAVED_NAME = re.compile(r'^(?:best_.+_)?(epoch|iter)_(\d+)\.pth$')


class CheckpointsInTheWay(RuntimeError):
    """A launch would save over checkpoint files its run did not write."""


@dataclass
class ResumeChoice:
    """What auto-resume continues from, and what it passed over.

    Args:
        path: The checkpoint to resume; None when the run has none yet.
        skipped: ``(entry, why)`` of each newer checkpoint passed over,
            newest first.
        lost: ``(iterations, epochs)`` between the newest checkpoint passed
            over and the one chosen, counting only entries whose position
            is possible for the run (see :func:`choose_resume_checkpoint`).
        notes: Further sentences for the log (damaged record lines, a
            migration).
        entry: The record's entry of ``path`` (None for a migration).
        meta_position: ``(epoch, iter)`` a migrated checkpoint's meta
            records.
    """
    path: Optional[str]
    skipped: List[Tuple[Entry, str]] = field(default_factory=list)
    lost: Tuple[int, int] = (0, 0)
    notes: List[str] = field(default_factory=list)
    entry: Optional[Entry] = None
    meta_position: Tuple[int, int] = (0, 0)

    def position(self) -> Tuple[int, int]:
        """``(epoch, iter)`` the run continues from (0, 0 afresh)."""
        if self.entry is not None:
            return self.entry.epoch, self.entry.iter
        return self.meta_position

    def fallback_message(self) -> str:
        """One log line saying what was skipped and what it costs."""
        passed = '; '.join(f'{e.location}: {why}' for e, why in self.skipped)
        iters, epochs = self.lost
        return (f'auto-resume passed over {passed}. Resuming from '
                f'{self.path}: {iters} iteration{"" if iters == 1 else "s"}'
                f' ({epochs} epoch{"" if epochs == 1 else "s"}) of training '
                'will be redone.')


def choose_resume_checkpoint(
        work_dir: str,
        limits: Optional[Tuple[int, int]] = None) -> ResumeChoice:
    """Choose the checkpoint auto-resume continues from (see the module).

    Args:
        work_dir: The run's checkpoint folder (where the record is).
        limits: ``(max_iters, max_epochs)`` of the run: an entry passed
            over whose recorded position is beyond them (a forged line)
            counts nothing in the "redone" figure.

    Returns:
        The newest intact recorded checkpoint of the current run, with
        what was passed over; ``path`` None when the run has none yet.

    Raises:
        CorruptCheckpointError: The run recorded checkpoints, but none is
            intact any more.
        CheckpointsInTheWay: The run would save over files another run
            wrote.
    """
    record = read_record(work_dir)
    notes = [record.damage_note()] if record.damage_note() else []
    if not record.entries and not record.damaged and not record.unreadable:
        choice = _migration_choice(work_dir, notes, record.run_id)
        refuse_in_the_way(work_dir, record, record.run_id, choice.position(),
                          'auto-resume', limits)
        return choice
    skipped = []
    for entry in record.checkpoints():
        problem = entry.problem()
        if problem is None:
            choice = ResumeChoice(entry.location, skipped,
                                  _redone(entry, skipped, limits), notes,
                                  entry)
            refuse_in_the_way(work_dir, record, record.run_id,
                              choice.position(), 'auto-resume', limits)
            return choice
        skipped.append((entry, problem))
    files = _checkpoint_files(work_dir)
    if not files:
        # Damage costs entries, not runs: with no checkpoint to lose, the
        # run starts afresh (the damaged lines stay skipped).
        if record.unreadable or record.damaged or skipped:
            gone = '; '.join(f'{e.location}: {why}' for e, why in skipped)
            notes.append('No intact entry of this run is recorded and no '
                         'checkpoint file is in the folder: starting '
                         f'afresh.{" Passed over: " + gone if gone else ""}')
        return ResumeChoice(None, notes=notes)
    reasons = '; '.join(f'{e.location}: {why}' for e, why in skipped)
    in_folder = ', '.join(files) or 'none'
    raise CorruptCheckpointError(
        'cannot resume automatically: no intact checkpoint recorded in '
        f'{record_path(work_dir)} is left ({reasons or "none readable"}). '
        f'{" ".join(notes)} Checkpoint files in the folder, which no intact '
        f'entry of this run names: {in_folder}. Continue from one with '
        '--resume PATH (resume_other_run = True if another run wrote it), '
        'or train into a new work folder; a fresh start here could save '
        'over them.'.replace('  ', ' '))


def _migration_choice(work_dir: str, notes: List[str],
                      run_id: Optional[str]) -> ResumeChoice:
    # run_id: the run of a record with a start line but no saved one (a
    # launch killed before its first saved line was written): its own
    # checkpoint files are candidates too.
    found, skipped = [], []
    for path in _checkpoint_files(work_dir):
        problem = checkpoint_problem(path)
        meta = None
        if problem is None:
            meta, problem = read_meta(path)
        if problem is None and 'run_id' in meta and \
                (run_id is None or meta['run_id'] != run_id):
            problem = ('its meta names run '
                       f'{meta["run_id"]}, which this '
                       'work folder has no record of (copied in from '
                       'another run?)')
        if problem is None:
            found.append((meta['iter'], meta['epoch'], path))
        else:
            skipped.append((path, problem))
    if not found:
        return ResumeChoice(None, notes=notes)
    found.sort(reverse=True)
    iters, epoch, path = found[0]
    notes.append(
        f'{record_path(work_dir)} records no checkpoint: those in '
        f'{work_dir} were written by mmengine\'s CheckpointHook, an earlier '
        'version of the plugin, or by this run before its record line was '
        f'written. Migrating: resuming {path}, the newest of {len(found)} '
        'checkpoint(s) by the iteration its own meta records '
        f'({iters}); {len(skipped)} other .pth file(s) are not resumable '
        'checkpoints of this folder. The record continues with the next '
        'save.')
    return ResumeChoice(path, notes=notes, meta_position=(epoch, iters))


def _checkpoint_files(work_dir: str) -> List[str]:
    try:
        names = sorted(os.listdir(work_dir))
    except OSError:
        return []
    return [
        osp.join(work_dir, name) for name in names
        if name.endswith('.pth') and not name.startswith('.')
    ]


def _redone(chosen: Entry, skipped: List[Tuple[Entry, str]],
            limits: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """Iterations and epochs the skipped entries had trained beyond
    ``chosen``, from entries whose recorded position is possible: not
    before ``chosen``, and within ``limits``."""
    max_iters, max_epochs = limits or (float('inf'), float('inf'))
    possible = [
        e for e, _ in skipped if chosen.iter <= e.iter <= max_iters
        and chosen.epoch <= e.epoch <= max_epochs
    ]
    return (max((e.iter - chosen.iter for e in possible), default=0),
            max((e.epoch - chosen.epoch for e in possible), default=0))


def in_the_way(
        folder: str,
        record: RunRecord,
        run_id: Optional[str],
        position: Tuple[int, int],
        limits: Optional[Tuple[int, int]] = None) -> List[Tuple[str, str]]:
    """Checkpoint files a run continuing at ``position`` could save over
    although it did not write them.

    Args:
        folder: The checkpoint folder.
        record: Its record.
        run_id: The continuing run (None: a new run).
        position: ``(epoch, iter)`` it continues from.
        limits: ``(max_iters, max_epochs)``: the run saves nothing beyond.

    Returns:
        ``(path, why)`` of each, by name.
    """
    epoch, iteration = position
    max_iters, max_epochs = limits or (float('inf'), float('inf'))
    found = []
    for path in _checkpoint_files(folder):
        name = osp.basename(path)
        match = _SAVED_NAME.match(name)
        if match is None:
            continue  # a name the checkpoint hook never writes
        step, by_epoch = int(match.group(2)), match.group(1) == 'epoch'
        if not (epoch if by_epoch else iteration) < step <= \
                (max_epochs if by_epoch else max_iters):
            continue  # before the run's position or past its end
        owner = record.written.get(name)
        if owner is None:  # its line may be damaged: ask the file itself
            owner = _meta_run_id(path)
            why = ('it is not in the run record' if owner is None else
                   f'it is not in the run record and its meta names run '
                   f'{owner}')
        else:
            why = f'the run record says run {owner} wrote it'
        if run_id is None or owner != run_id:
            found.append((path, why))
    return found


def _meta_run_id(path: str) -> Optional[str]:
    meta, _ = read_meta(path)
    run_id = (meta or {}).get('run_id')
    return run_id if isinstance(run_id, str) and run_id else None


def refuse_in_the_way(folder: str,
                      record: RunRecord,
                      run_id: Optional[str],
                      position: Tuple[int, int],
                      launch: str,
                      limits: Optional[Tuple[int, int]] = None) -> None:
    """Raise :class:`CheckpointsInTheWay` when :func:`in_the_way` finds any.

    Args:
        folder: The checkpoint folder.
        record: Its record.
        run_id: The continuing run (None: a new run).
        position: ``(epoch, iter)`` it continues from.
        launch: What continues (``'auto-resume'``, ``'a new run'``), for the
            message.
        limits: ``(max_iters, max_epochs)`` of the run.

    Raises:
        CheckpointsInTheWay: Naming each file and why, and how to continue.
    """
    found = in_the_way(folder, record, run_id, position, limits)
    if not found:
        return
    named = '; '.join(f'{path} ({why})' for path, why in found)
    epoch, iteration = position
    where = f'from epoch {epoch} (iteration {iteration})' if iteration \
        else 'from the start'
    raise CheckpointsInTheWay(
        f'{launch} would train {where} in {folder} and save over checkpoint '
        f'files this run did not write: {named}. Nothing was trained or '
        'written. To continue from one of them, pass --resume PATH (add '
        '--cfg-options resume_other_run=True for another run\'s); to start '
        'a new run, use a new work folder (or move those files out).')
