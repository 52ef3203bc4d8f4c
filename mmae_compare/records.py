"""Finished results: ``runs.json``, the report's only input.

``<out-dir>/runs.json`` holds the recorded comparison and every finished
evaluation record (``<arm>``, ``<seed>``, ``<epoch>``, the metrics,
``time/*`` timings and the checkpoint path relative to the out dir) and,
under ``curves``, each trained run's per-epoch hook quantities (see
:mod:`.curves`), so a comparison can be re-reported, or moved, without its
checkpoints and logs. It is
rebuilt from the run folders whenever they are there; a folder holding
only ``runs.json`` is reported from it.
"""
import os.path as osp
from typing import Dict, List, Tuple

from . import spec as layout
from .curves import (CURVES_FILE, Curves, curves_from_json, curves_to_json,
                     read_epoch_curves)
from .spec import Comparison

RUNS_FILE = 'runs.json'
#: Version of the runs.json layout.
FORMAT = 1


def gather_records(out_dir: str, spec: Comparison) -> List[dict]:
    """Every finished evaluation in the run folders, in spec order."""
    rows = []
    order = [a.name for a in spec.arms]
    runs = sorted(spec.runs(), key=lambda run: (order.index(run[0]), run[1]))
    for arm, seed in runs:
        for epoch in spec.arm_eval_epochs(spec.arm(arm)):
            path = layout.eval_path(out_dir, arm, seed, epoch)
            if osp.isfile(path):
                rows.append(layout.read_json(path))
    return rows


def gather_curves(out_dir: str, spec: Comparison) -> List[dict]:
    """``{arm, seed, curves}`` of every trained run that logged any."""
    found = []
    for arm, seed in spec.runs():
        curves = read_epoch_curves(layout.run_dir(out_dir, arm, seed))
        if curves:
            found.append({
                'arm': arm,
                'seed': seed,
                'curves': curves_to_json(curves)
            })
    return found


def write_runs(out_dir: str) -> str:
    """Rebuild ``runs.json`` from the run folders.

    Returns:
        Its path.
    """
    spec = layout.load(out_dir)
    path = osp.join(out_dir, RUNS_FILE)
    layout.write_json_atomic(
        path, {
            'format': FORMAT,
            'comparison': spec.as_dict(),
            'runs': gather_records(out_dir, spec),
            'curves': gather_curves(out_dir, spec)
        })
    return path


def read_runs(out_dir: str) -> Tuple[Comparison, List[dict]]:
    """The comparison and its records: from the run folders when the
    comparison was run here (``runs.json`` is rebuilt), else from
    ``runs.json``."""
    if osp.isfile(osp.join(out_dir, layout.SPEC_FILE)):
        write_runs(out_dir)
    path = osp.join(out_dir, RUNS_FILE)
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} does not exist: nothing to report '
                                f'in --out-dir {out_dir}')
    data = checked_runs(layout.read_json(path), path)
    return Comparison.from_dict(data['comparison']), data['runs']


def checked_runs(data: dict, path: str) -> dict:
    """The content of a ``runs.json``, if it has this version's layout.

    Args:
        data: The file's JSON object.
        path: Its path, for the error message.

    Returns:
        ``data``.

    Raises:
        ValueError: If ``data`` is of another ``format``.
    """
    if data.get('format') != FORMAT:
        raise ValueError(f'{path}: runs.json format {data.get("format")!r}, '
                         f'this version reads format {FORMAT}')
    return data


def read_curves(out_dir: str) -> Dict[Tuple[str, int], Curves]:
    """The per-epoch hook quantities of every run, ``(arm, seed) ->
    curves``, from the run folders or ``runs.json`` as :func:`read_runs`
    (empty for a ``runs.json`` written before curves were recorded)."""
    read_runs(out_dir)
    data = layout.read_json(osp.join(out_dir, RUNS_FILE))
    return {(item['arm'], item['seed']): curves_from_json(item['curves'])
            for item in data.get('curves', [])}


def restore_runs(out_dir: str, source: str) -> Tuple[int, int]:
    """Take up a comparison's finished results from a ``runs.json``.

    On a machine where the run folders are gone (or another cluster), the
    records and curves of ``source`` are written into the run folders of
    ``out_dir`` where missing, so ``run`` skips every finished evaluation
    and reports them; unfinished runs train again (from their start: the
    checkpoints did not travel). ``out_dir`` must already hold the same
    comparison (``run`` records it first).

    Args:
        out_dir: The comparison folder.
        source: A ``runs.json`` of the same comparison.

    Returns:
        How many evaluation records and run curves were written.

    Raises:
        ValueError: If ``source`` records another comparison.
    """
    spec = layout.load(out_dir)
    data = checked_runs(layout.read_json(source), source)
    if Comparison.from_dict(data['comparison']) != spec:
        raise ValueError(f'{source} records another comparison than '
                         f'{out_dir} (arms, seeds, epochs or protocol '
                         'differ): nothing restored')
    records = curves = 0
    for row in data['runs']:
        path = layout.eval_path(out_dir, row['arm'], row['seed'], row['epoch'])
        if not osp.isfile(path):
            layout.write_json_atomic(path, row)
            records += 1
    for item in data.get('curves', []):
        path = osp.join(
            layout.run_dir(out_dir, item['arm'], item['seed']), CURVES_FILE)
        if not osp.isfile(path):
            layout.write_json_atomic(path, item['curves'])
            curves += 1
    return records, curves


def progress(spec: Comparison, rows: List[dict]) -> Dict[str, object]:
    """How much of the comparison the records cover.

    Returns:
        ``done`` and ``wanted`` evaluation counts and ``missing``: one
        ``'<arm label> seed <k> (<d> of <w> evaluations)'`` per unfinished
        run.
    """
    have = {(r['arm'], r['seed'], r['epoch']) for r in rows}
    missing, done, wanted = [], 0, 0
    for arm_name, seed in spec.runs():
        arm = spec.arm(arm_name)
        epochs = spec.arm_eval_epochs(arm)
        count = sum((arm_name, seed, e) in have for e in epochs)
        done, wanted = done + count, wanted + len(epochs)
        if count < len(epochs):
            missing.append(f'{arm.label} seed {seed} ({count} of '
                           f'{len(epochs)} evaluations)')
    return {'done': done, 'wanted': wanted, 'missing': missing}


def status_text(out_dir: str) -> str:
    """Which runs and evaluations are done, one line per run."""
    spec = layout.load(out_dir)
    rows = gather_records(out_dir, spec)
    lines = [f'{"arm":<24} {"seed":>4}  {"trained":>9}  evaluations done']
    for arm_name, seed in spec.runs():
        arm = spec.arm(arm_name)
        epochs = spec.arm_eval_epochs(arm)
        trained = layout.last_checkpoint_epoch(
            layout.run_dir(out_dir, arm_name, seed)) if arm.trains else None
        done = [
            r['epoch'] for r in rows
            if r['arm'] == arm_name and r['seed'] == seed
        ]
        lines.append(
            f'{arm_name:<24} {seed:>4}  '
            f'{"-" if trained is None else f"{trained}/{spec.epochs}":>9}  '
            f'{",".join(map(str, done)) or "-"} (of '
            f'{",".join(map(str, epochs))})')
    state = progress(spec, rows)
    lines.append(f'{state["done"]} of {state["wanted"]} evaluations done')
    return '\n'.join(lines)
