"""Which checkpoint auto-resume continues from: the run record decides.

Auto-resume continues from the newest entry, by global iteration, of the
current run in the work folder's record
(:mod:`.run_record`) whose file still has its recorded size and SHA-256;
each newer entry passed over is reported with its cost. A file that is not
in the record is never resumed automatically, whatever its name;
``last_checkpoint`` is not read.

Migration: a work folder with checkpoints but no recorded one (written by
mmengine's ``CheckpointHook`` or an earlier version of the plugin) resumes
from the checkpoint whose own ``meta`` (read with ``weights_only``) says it
is the newest; the record starts with the next save.
"""
import os
import os.path as osp
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .integrity import CorruptCheckpointError, checkpoint_problem
from .loading import read_meta
from .run_record import Entry, read_record, record_path


@dataclass
class ResumeChoice:
    """What auto-resume continues from, and what it passed over.

    Args:
        path: The checkpoint to resume; None when the run has none yet.
        skipped: ``(path, why)`` of each newer checkpoint passed over,
            newest first.
        lost: ``(iterations, epochs)`` between the newest checkpoint passed
            over and the one chosen.
        notes: Further sentences for the log (damaged record lines, a
            migration).
        entry: The record's entry of ``path`` (None for a migration).
    """
    path: Optional[str]
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    lost: Tuple[int, int] = (0, 0)
    notes: List[str] = field(default_factory=list)
    entry: Optional[Entry] = None

    def fallback_message(self) -> str:
        """One log line saying what was skipped and what it costs."""
        passed = '; '.join(f'{path}: {why}' for path, why in self.skipped)
        iters, epochs = self.lost
        return (f'auto-resume passed over {passed}. Resuming from '
                f'{self.path}: {iters} iteration{"" if iters == 1 else "s"}'
                f' ({epochs} epoch{"" if epochs == 1 else "s"}) of training '
                'will be redone.')


def choose_resume_checkpoint(work_dir: str) -> ResumeChoice:
    """Choose the checkpoint auto-resume continues from (see the module).

    Args:
        work_dir: The run's work folder (where the record is).

    Returns:
        The newest intact recorded checkpoint of the current run, with
        what was passed over; ``path`` None when the run has none yet.

    Raises:
        CorruptCheckpointError: The run recorded checkpoints, but none is
            intact any more.
    """
    record = read_record(work_dir)
    notes = [record.damage_note()] if record.damage_note() else []
    entries = record.checkpoints()
    if not record.entries and not record.damaged and not record.unreadable:
        return _migration_choice(work_dir, notes)
    skipped = []
    for entry in entries:
        problem = entry.problem()
        if problem is None:
            newest = entries[0]
            return ResumeChoice(
                entry.location, skipped,
                (newest.iter - entry.iter, newest.epoch - entry.epoch), notes,
                entry)
        skipped.append((entry.location, problem))
    files = _checkpoint_files(work_dir)
    if not skipped and not files:
        # Damage costs entries, not runs: with no checkpoint to lose, the
        # run starts afresh (the damaged lines stay skipped).
        if record.unreadable or record.damaged:
            notes.append('No intact entry of this run is recorded and no '
                         'checkpoint file is in the folder: starting '
                         'afresh.')
        return ResumeChoice(None, notes=notes)
    reasons = '; '.join(f'{path}: {why}' for path, why in skipped)
    in_folder = ', '.join(files) or 'none'
    raise CorruptCheckpointError(
        'cannot resume automatically: no intact checkpoint recorded in '
        f'{record_path(work_dir)} is left ({reasons or "none readable"}). '
        f'{" ".join(notes)} Checkpoint files in the folder, which no intact '
        f'entry of this run names: {in_folder}. Continue from one with '
        '--resume PATH (resume_other_run = True if another run wrote it), '
        'or train into a new work folder; a fresh start here could save '
        'over them.'.replace('  ', ' '))


def _migration_choice(work_dir: str, notes: List[str]) -> ResumeChoice:
    found, skipped = [], []
    for path in _checkpoint_files(work_dir):
        problem = checkpoint_problem(path)
        meta = None
        if problem is None:
            meta, problem = read_meta(path)
        if problem is None and 'run_id' in meta:
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
    iters, _, path = found[0]
    notes.append(
        f'{work_dir} has no run record ({record_path(work_dir)}): its '
        'checkpoints were written by mmengine\'s CheckpointHook or an '
        f'earlier version of the plugin. Migrating: resuming {path}, the '
        f'newest of {len(found)} checkpoint(s) by the iteration its own '
        f'meta records ({iters}); {len(skipped)} other .pth file(s) are '
        'not resumable checkpoints. The record starts with the next save.')
    return ResumeChoice(path, notes=notes)


def _checkpoint_files(work_dir: str) -> List[str]:
    try:
        names = sorted(os.listdir(work_dir))
    except OSError:
        return []
    return [
        osp.join(work_dir, name) for name in names
        if name.endswith('.pth') and not name.startswith('.')
    ]


def newest_intact_sentence(path: str) -> str:
    """What to resume from instead of a damaged ``path``.

    Args:
        path: The damaged checkpoint.

    Returns:
        A sentence naming the newest intact recorded checkpoint beside it.
    """
    folder = osp.dirname(osp.abspath(osp.normpath(path)))
    record = read_record(folder)
    for entry in record.checkpoints():
        if osp.realpath(entry.location) != osp.realpath(path) and \
                entry.problem() is None:
            return (f'The newest intact checkpoint recorded in {folder} is '
                    f'{entry.location} (pass --resume {entry.location}, or '
                    'resume automatically).')
    return f'No intact checkpoint of this run is recorded in {folder}.'
