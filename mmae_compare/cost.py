"""What a comparison's runs cost, read from what they wrote down.

Each start of a job appends to the run's ``history.jsonl`` (see
:func:`.jobs.run`): ``start``, then per evaluation epoch ``trained`` and
``evaluated``, each with its time and the CPU seconds of the job's rank-0
process so far. Training is the time from a start (or the previous
evaluation) to ``trained``; evaluation from ``trained`` to ``evaluated``.
Histories written before ``trained`` existed (the mosaic study's) carry no
CPU time; for them training is the span of each mmengine log the run
wrote (one per training process) and evaluation runs from the end of
training, or from the start of a process that only evaluated, to
``evaluated``. Time lost in a process killed before its next event is not
counted: nothing records when it ended.
"""
import glob
import json
import os.path as osp
import re
import time
from typing import Dict, List, Optional

from . import spec as layout

#: Arm -> ``seed<k>`` -> :func:`run_cost`.
Costs = Dict[str, Dict[str, Dict[str, float]]]
#: mmengine's log line prefix: local time to the second.
_LOG_STAMP = re.compile(r'^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) - ')
#: mmengine names each process's log folder by its local start time.
_LOG_FOLDER = re.compile(r'^\d{8}_\d{6}$')


def run_cost(run_dir: str) -> Optional[Dict[str, float]]:
    """Training and evaluation time of one evaluated run.

    Args:
        run_dir: ``<out>/runs/<arm>/seed<k>``.

    Returns:
        ``train_s``, ``eval_s`` (wall seconds), ``processes`` (how many
        times the run was started) and, where the history records it,
        ``train_cpu_s`` and ``eval_cpu_s``; None when nothing was
        evaluated yet.
    """
    with open(osp.join(run_dir, 'history.jsonl')) as f:
        events = [json.loads(line) for line in f if line.strip()]
    if not any(e['event'] == 'evaluated' for e in events):
        return None
    if any(e['event'] == 'trained' for e in events):
        cost = _cost_from_events(events)
    else:
        cost = _cost_from_logs(run_dir, events)
    return {key: round(value, 1) for key, value in cost.items()}


def _cost_from_events(events: List[dict]) -> Dict[str, float]:
    cost = dict(train_s=0.0, eval_s=0.0, train_cpu_s=0.0, eval_cpu_s=0.0)
    previous = None
    for event in events:
        kind = {'trained': 'train', 'evaluated': 'eval'}.get(event['event'])
        if kind and previous is not None:
            cost[f'{kind}_s'] += event['time'] - previous['time']
            cost[f'{kind}_cpu_s'] += event['cpu_s'] - previous['cpu_s']
        previous = event
    return dict(cost, processes=_starts(events))


def _cost_from_logs(run_dir: str, events: List[dict]) -> Dict[str, float]:
    spans = []
    for folder in sorted(glob.glob(osp.join(run_dir, '*'))):
        name = osp.basename(folder)
        log = osp.join(folder, name + '.log')
        if _LOG_FOLDER.match(name) and osp.isfile(log):
            span = log_span(log)
            if span is not None:
                spans.append(span)
    last_start = [e['time'] for e in events if e['event'] == 'start'][-1]
    evaluated = [e['time'] for e in events if e['event'] == 'evaluated'][-1]
    evaluation_from = max([last_start] + [last for _, last in spans])
    return dict(
        train_s=sum(last - first for first, last in spans),
        eval_s=evaluated - evaluation_from,
        processes=_starts(events))


def _starts(events: List[dict]) -> int:
    return sum(e['event'] == 'start' for e in events)


def log_span(path: str) -> Optional[tuple]:
    """(first, last) timestamp of an mmengine log, in seconds since the epoch.

    Args:
        path: The ``<timestamp>.log`` file.

    Returns:
        The pair, or None when no line carries a timestamp.
    """
    stamps = []
    with open(path, errors='replace') as f:
        for line in f:
            found = _LOG_STAMP.match(line)
            if found:
                stamps.append(
                    time.mktime(
                        time.strptime(found.group(1), '%Y/%m/%d %H:%M:%S')))
    return (stamps[0], stamps[-1]) if stamps else None


def comparison_cost(out_dir: str) -> Costs:
    """Every evaluated run's cost under a comparison's output folder, for
    the arms and seeds its recorded comparison names.

    Args:
        out_dir: The comparison's ``--out-dir``.

    Returns:
        Arm -> ``seed<k>`` -> :func:`run_cost`.
    """
    costs: Costs = {}
    for arm, seed in layout.load(out_dir).runs():
        directory = layout.run_dir(out_dir, arm, seed)
        if osp.isfile(osp.join(directory, 'history.jsonl')):
            cost = run_cost(directory)
            if cost is not None:
                costs.setdefault(arm, {})[f'seed{seed}'] = cost
    return costs


def export_cost(out_dir: str, path: str) -> None:
    """Write :func:`comparison_cost` of ``out_dir`` to ``path``, keeping the
    recorded cost of runs whose folders this machine does not have (runs
    restored from the committed records, not trained here).

    Args:
        out_dir: The comparison's ``--out-dir``.
        path: The JSON file (read first if it exists).
    """
    costs: Costs = {}
    if osp.isfile(path):
        with open(path) as f:
            costs = json.load(f)
    for arm, runs in comparison_cost(out_dir).items():
        costs.setdefault(arm, {}).update(runs)
    with open(path, 'w') as f:
        json.dump(costs, f, indent=1, sort_keys=True)
        f.write('\n')


def cost_markdown(costs: Costs, labels: Dict[str, str]) -> List[str]:
    """A cost table: minutes per run of each arm, and the total.

    Args:
        costs: :func:`comparison_cost`'s result, in the table's arm order.
        labels: Arm -> the name the table gives it.

    Returns:
        Markdown lines.
    """
    lines = [
        '| arm | runs | training (min per run) | evaluation (min per run) |',
        '|---|---|---|---|'
    ]
    total_s = 0.0
    for arm, runs in costs.items():
        train = [run['train_s'] / 60 for run in runs.values()]
        evaluation = [run['eval_s'] / 60 for run in runs.values()]
        total_s += sum(run['train_s'] + run['eval_s'] for run in runs.values())
        lines.append(f'| {labels.get(arm, arm)} | {len(runs)} | '
                     f'{_range(train)} | {_range(evaluation)} |')
    runs = sum(len(by_seed) for by_seed in costs.values())
    lines += [
        '', f'In all {total_s / 3600:.1f} job-hours of wall time for '
        f'{runs} runs.'
    ]
    cpu = [
        run['train_cpu_s'] + run['eval_cpu_s'] for by_seed in costs.values()
        for run in by_seed.values() if 'train_cpu_s' in run
    ]
    if cpu:
        lines[-1] += (f' CPU time (rank 0) of the {len(cpu)} runs that '
                      f'recorded it: {sum(cpu) / 3600:.1f} core-hours.')
    return lines


def _range(minutes: List[float]) -> str:
    low, high = min(minutes), max(minutes)
    return f'{low:.0f}' if round(low) == round(high) else \
        f'{low:.0f}-{high:.0f}'
