"""Per-epoch curves of what hooks logged while a run trained.

A comparison's evaluations measure checkpoints; the hooks measure the run
as it trains (``MatrixInfoHook`` logs ``minfo/<quantity>`` every few
iterations and, with ``heldout=``, ``minfo_heldout/<quantity>`` once per
epoch and before training). mmengine's ``LocalVisBackend`` writes every
logged scalar to ``<work dir>/<timestamp>/vis_data/scalars.json``, one
folder per segment or resume. This module reads those files into one
curve per quantity: the mean of its values logged during each epoch
(``epoch`` 0 is the value before training), so ``runs.json`` can carry
them and figures of training dynamics can be drawn without the run
folders.
"""
import glob
import json
import os.path as osp
from typing import Dict, Iterable, Tuple

#: A run's curves: quantity -> {epoch: value}.
Curves = Dict[str, Dict[int, float]]
#: A restored run's curves, in the run folder.
CURVES_FILE = 'curves.json'


def is_hook_quantity(key: str) -> bool:
    """Whether a logged scalar is a hook's named quantity.

    Hooks log under a ``<prefix>/<name>`` key (``minfo/mutual_info_cov``);
    the loop's own scalars (``loss``, ``lr``, ``time``, ``epoch``, ...)
    have no slash.
    """
    return '/' in key


def scalar_files(run_dir: str) -> Iterable[str]:
    """The run's ``scalars.json`` files, oldest segment first (mmengine
    names each segment's folder by its start time, ``%Y%m%d_%H%M%S``)."""
    return sorted(
        glob.glob(osp.join(run_dir, '*', 'vis_data', 'scalars.json')))


def read_epoch_curves(run_dir: str) -> Curves:
    """Every hook quantity a run logged, averaged per epoch.

    A value logged twice at the same step (an epoch re-run after a kill
    mid-epoch, or a held-out measurement repeated on resume) counts once,
    from the newest segment: the plugin's runs are deterministic, so the
    re-run logs what the first one did.

    Args:
        run_dir: A run's work dir.

    Returns:
        Quantity -> {epoch: mean of its values logged in that epoch}.
    """
    values: Dict[Tuple[str, int, int], float] = {}
    for path in scalar_files(run_dir):
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                if 'epoch' not in record:
                    continue
                where = (int(record['epoch']), int(record.get('step', -1)))
                for key, value in record.items():
                    if is_hook_quantity(key):
                        values[(key, *where)] = float(value)
    sums: Dict[str, Dict[int, list]] = {}
    for (key, epoch, _), value in values.items():
        sums.setdefault(key, {}).setdefault(epoch, []).append(value)
    curves = restored_curves(run_dir)
    for key, by in sums.items():
        curves.setdefault(key, {}).update(
            {epoch: sum(v) / len(v)
             for epoch, v in by.items()})
    return {
        key: dict(sorted(by.items()))
        for key, by in sorted(curves.items())
    }


def restored_curves(run_dir: str) -> Curves:
    """The curves a restore left in the run folder (empty if none)."""
    path = osp.join(run_dir, CURVES_FILE)
    if not osp.isfile(path):
        return {}
    with open(path) as f:
        return curves_from_json(json.load(f))


def curves_to_json(curves: Curves) -> Dict[str, list]:
    """``{quantity: [[epoch, value], ...]}`` (JSON keys are strings)."""
    return {
        key: [[epoch, value] for epoch, value in by.items()]
        for key, by in curves.items()
    }


def curves_from_json(data: Dict[str, list]) -> Curves:
    """Inverse of :func:`curves_to_json`."""
    return {
        key: {int(epoch): float(value)
              for epoch, value in pairs}
        for key, pairs in data.items()
    }
