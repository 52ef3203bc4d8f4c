"""Retiring recorded checkpoints: the one place a checkpoint is deleted.

The checkpoint hook's ``max_keep_ckpts`` and the comparison tool's pruning
both retire through :func:`retire`. Each entry is marked ``removed`` in the
run record before its file goes, and a file goes only when it is still the
one the run wrote (:meth:`~.run_record.Entry.removal_problem`): a file
replaced since, or turned into a symbolic link, is left where it is and
named, and the record stops counting it as the run's.
"""
from typing import Iterable, List

from .integrity import remove_sidecars
from .publish import remove_path
from .run_record import Entry, append_event

#: ``removal_problem`` of a file that is already gone.
MISSING = 'missing'


def retire(entries: Iterable[Entry]) -> List[str]:
    """Mark recorded checkpoints removed, then delete those still the run's.

    Call it on the main process only, after the checkpoint that replaces
    them is in place.

    Args:
        entries: Entries of one record (their ``work_dir`` is its folder).

    Returns:
        One sentence per file left in place, for the run's log.
    """
    left = []
    for entry in entries:
        problem = entry.removal_problem()
        event = dict(event='removed', path=entry.path)
        if problem is not None:
            event['left'] = problem
        append_event(entry.work_dir, event)
        if problem is None:
            remove_sidecars(entry.location)
            remove_path(entry.location)
        elif problem != MISSING:
            left.append(
                f'retention left {entry.location} in place: {problem}. '
                'It is no longer counted as a checkpoint of this run; '
                'delete it yourself if it is not needed.')
    return left
