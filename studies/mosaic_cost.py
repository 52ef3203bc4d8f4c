"""What the mosaic study cost, measured from the files its runs wrote.

A run's training time is the span of each mmengine log it wrote (one log
per training process, so a resumed run sums its processes); its evaluation
time runs from the end of its training (or from the start of the process
that only evaluated) to the ``evaluated`` event of the comparison's
``history.jsonl``. Time lost in a process killed before it logged or
evaluated is not counted: nothing records when it ended.
"""
import glob
import json
import os.path as osp
import re
import time
from typing import Dict, List, Optional

#: mmengine's log line prefix: local time to the second.
_LOG_STAMP = re.compile(r'^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) - ')
#: mmengine names each process's log folder by its local start time.
_LOG_FOLDER = re.compile(r'^\d{8}_\d{6}$')


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


def run_cost(run_dir: str) -> Optional[Dict[str, float]]:
    """Training and evaluation seconds of one finished run.

    Args:
        run_dir: ``<out>/runs/<arm>/seed<k>``.

    Returns:
        ``train_s``, ``eval_s`` and ``processes`` (how many times the run
        was started), or None when the run has not been evaluated.
    """
    with open(osp.join(run_dir, 'history.jsonl')) as f:
        events = [json.loads(line) for line in f if line.strip()]
    evaluated = [e['time'] for e in events if e['event'] == 'evaluated']
    starts = [e['time'] for e in events if e['event'] == 'start']
    if not evaluated or not starts:
        return None
    spans = []
    for folder in sorted(glob.glob(osp.join(run_dir, '*'))):
        name = osp.basename(folder)
        log = osp.join(folder, name + '.log')
        if _LOG_FOLDER.match(name) and osp.isfile(log):
            span = log_span(log)
            if span is not None:
                spans.append(span)
    evaluation_from = max([starts[-1]] + [last for _, last in spans])
    return dict(
        train_s=sum(last - first for first, last in spans),
        eval_s=evaluated[-1] - evaluation_from,
        processes=len(starts))


def study_cost(out_dir: str) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Every finished run's cost under a comparison's output folder.

    Args:
        out_dir: The comparison's ``--out-dir`` (``work_dirs/mosaic``).

    Returns:
        Arm -> ``seed<k>`` -> :func:`run_cost`.
    """
    costs: Dict[str, Dict[str, Dict[str, float]]] = {}
    pattern = osp.join(out_dir, 'runs', '*', 'seed*', 'history.jsonl')
    for history in sorted(glob.glob(pattern)):
        run_dir = osp.dirname(history)
        cost = run_cost(run_dir)
        if cost is not None:
            arm = osp.basename(osp.dirname(run_dir))
            costs.setdefault(arm, {})[osp.basename(run_dir)] = cost
    return costs


def cost_markdown(costs: Dict[str, Dict[str, Dict[str, float]]],
                  labels: Dict[str, str]) -> List[str]:
    """The page's cost section: minutes per arm and the total in job-hours.

    Args:
        costs: :func:`study_cost`'s result.
        labels: Arm -> the name the page gives it.

    Returns:
        Markdown lines.
    """
    lines = [
        '| arm | runs | training (min per run) | evaluation (min per run) |',
        '|---|---|---|---|'
    ]
    total = 0.0
    for arm, runs in costs.items():
        train = [run['train_s'] / 60 for run in runs.values()]
        evaluation = [run['eval_s'] / 60 for run in runs.values()]
        total += sum(train) + sum(evaluation)
        lines.append(f'| {labels.get(arm, arm)} | {len(runs)} | '
                     f'{_range(train)} | {_range(evaluation)} |')
    runs = sum(len(by_seed) for by_seed in costs.values())
    lines += [
        '', f'In all {total / 60:.1f} job-hours for {runs} runs (one job '
        'requests one core). Minutes are wall time of a niced job that '
        'shared 2 cores with the other job and, at times, with the test '
        'suite; time lost in processes killed at the end of a session is '
        'not counted.'
    ]
    return lines


def _range(minutes: List[float]) -> str:
    low, high = min(minutes), max(minutes)
    return f'{low:.0f}' if round(low) == round(high) else \
        f'{low:.0f}-{high:.0f}'


def export_cost(out_dir: str, path: str) -> None:
    """Write :func:`study_cost` of ``out_dir`` to ``path``, keeping the
    recorded cost of runs whose folders this machine does not have (runs
    restored from the committed records, not trained here)."""
    costs: Dict[str, Dict[str, Dict[str, float]]] = {}
    if osp.isfile(path):
        with open(path) as f:
            costs = json.load(f)
    for arm, runs in study_cost(out_dir).items():
        costs.setdefault(arm, {}).update(runs)
    with open(path, 'w') as f:
        json.dump(costs, f, indent=1, sort_keys=True)
        f.write('\n')
