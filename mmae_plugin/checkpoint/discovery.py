"""Which checkpoint auto-resume continues from.

mmengine 0.10.7 resumes whatever ``last_checkpoint`` names. The plugin's
runners instead choose among the run's *own* checkpoints only, the files
and FSDP folders its checkpoint hook writes (``epoch_<N>.pth``,
``iter_<N>.pth``), never ``best_*`` (no optimizer or scheduler state) or a
foreign ``*.pth`` (a converted backbone), newest by the epoch or iteration
in their name, each verified (:mod:`.integrity`). ``last_checkpoint`` only
says in which folder to look (a hook ``out_dir`` elsewhere). What was
skipped, and how many epochs or iterations that costs, is reported for the
run's logger.
"""
import os
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .bounded_read import UnsafeFileError, read_small_text
from .integrity import CorruptCheckpointError, checkpoint_problem

_OWN_NAME = re.compile(r'^(?P<kind>epoch|iter)_(?P<step>\d+)\.pth$')
#: Longest path ``last_checkpoint`` may hold (Linux ``PATH_MAX``).
LAST_CHECKPOINT_LIMIT = 4096


@dataclass
class OwnCheckpoint:
    """A checkpoint the run's checkpoint hook wrote.

    Args:
        path: File or FSDP folder.
        kind: ``'epoch'`` or ``'iter'``.
        step: The epoch or iteration in its name.
    """
    path: str
    kind: str
    step: int


@dataclass
class ResumeChoice:
    """What auto-resume continues from, and what it passed over.

    Args:
        path: The checkpoint to resume; None when the run has none yet.
        skipped: ``(path, why)`` of each newer or named checkpoint passed
            over, newest first.
        lost: Epochs or iterations between the newest checkpoint seen and
            the one chosen (0 when nothing was skipped).
        kind: ``'epoch'`` or ``'iter'`` (the unit of ``lost``).
    """
    path: Optional[str]
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    lost: int = 0
    kind: str = 'epoch'

    def fallback_message(self) -> str:
        """One log line saying what was skipped and what it costs."""
        passed = '; '.join(f'{path}: {why}' for path, why in self.skipped)
        unit = 'epoch' if self.kind == 'epoch' else 'iteration'
        return (f'auto-resume passed over {passed}. Resuming from '
                f'{self.path}: {self.lost} {unit}'
                f'{"" if self.lost == 1 else "s"} of training will be '
                'redone.')


def parse_own_name(path: str) -> Optional[Tuple[str, int]]:
    """``(kind, step)`` if ``path`` is named as the hook names checkpoints."""
    match = _OWN_NAME.match(osp.basename(osp.normpath(path)))
    return (match['kind'], int(match['step'])) if match else None


def own_checkpoints(folder: str) -> List[OwnCheckpoint]:
    """The run's own checkpoints in ``folder``, newest first.

    Args:
        folder: A work or checkpoint folder.

    Returns:
        ``epoch_<N>.pth`` / ``iter_<N>.pth`` files and folders, by step
        descending (epochs before iterations at equal step).
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        parsed = parse_own_name(name)
        if parsed is not None:
            found.append(OwnCheckpoint(osp.join(folder, name), *parsed))
    return sorted(found, key=lambda c: (-c.step, c.kind != 'epoch', c.path))


def read_last_checkpoint(work_dir: str) -> Optional[str]:
    """What ``<work_dir>/last_checkpoint`` names, read safely.

    Args:
        work_dir: The run's work folder.

    Returns:
        The stripped text, or None when the file does not exist.

    Raises:
        UnsafeFileError: It is a FIFO, device, folder or too large.
    """
    try:
        return read_small_text(osp.join(work_dir, 'last_checkpoint'),
                               'last_checkpoint file',
                               LAST_CHECKPOINT_LIMIT).strip()
    except FileNotFoundError:
        return None


def _folders_to_search(work_dir: str, named: Optional[str]) -> List[str]:
    folders = [osp.abspath(work_dir)]
    if named and '://' not in named:
        folder = osp.abspath(osp.dirname(named))
        if folder not in folders:
            folders.insert(0, folder)
    return folders


def choose_resume_checkpoint(work_dir: str) -> ResumeChoice:
    """Choose the checkpoint auto-resume continues from.

    Args:
        work_dir: The run's work folder (where ``last_checkpoint`` is).

    Returns:
        The newest intact own checkpoint with what was passed over;
        ``path`` None when the run has no checkpoint and no
        ``last_checkpoint`` (a fresh start). A remote path named by
        ``last_checkpoint`` is returned as it is.

    Raises:
        CorruptCheckpointError: There are checkpoints or a
            ``last_checkpoint``, but no intact own checkpoint.
    """
    skipped: List[Tuple[str, str]] = []
    last_file = osp.join(work_dir, 'last_checkpoint')
    try:
        named = read_last_checkpoint(work_dir)
    except (UnsafeFileError, IsADirectoryError) as err:
        named, skipped = None, [(last_file, str(err))]
    if named is not None and '://' in named:
        return ResumeChoice(named)
    if named == '':
        skipped.append((last_file, 'it is empty'))
    elif named is not None and parse_own_name(named) is None:
        skipped.append((named, 'it is not one of the run\'s own epoch_<N> / '
                        'iter_<N> checkpoints (best_* and other files hold '
                        'no optimizer or scheduler state to continue)'))
    candidates = [c for folder in _folders_to_search(work_dir, named)
                  for c in own_checkpoints(folder)]
    candidates.sort(key=lambda c: (-c.step, c.kind != 'epoch', c.path))
    for candidate in candidates:
        problem = checkpoint_problem(candidate.path)
        if problem is None:
            newest = candidates[0].step
            return ResumeChoice(candidate.path, skipped,
                                newest - candidate.step, candidate.kind)
        skipped.append((candidate.path, problem))
    if named is None and not skipped:
        return ResumeChoice(None)
    reasons = '; '.join(f'{path}: {why}' for path, why in skipped) or \
        f'no epoch_<N>.pth or iter_<N>.pth in {work_dir}'
    raise CorruptCheckpointError(
        f'cannot resume automatically: no intact checkpoint of this run is '
        f'left ({reasons}). Start afresh with resume=False, or pass '
        '--resume PATH.')


def newest_intact_sentence(path: str) -> str:
    """What to resume from instead of a damaged ``path``.

    Args:
        path: The damaged checkpoint.

    Returns:
        A sentence naming the newest intact own checkpoint beside it.
    """
    folder = osp.dirname(osp.abspath(osp.normpath(path)))
    for candidate in own_checkpoints(folder):
        if osp.abspath(candidate.path) != osp.abspath(osp.normpath(path)) \
                and checkpoint_problem(candidate.path) is None:
            return (f'The newest intact checkpoint in {folder} is '
                    f'{candidate.path} (pass --resume {candidate.path}, or '
                    'resume automatically).')
    return f'No intact checkpoint of this run is left in {folder}.'
