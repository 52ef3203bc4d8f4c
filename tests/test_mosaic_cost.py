"""The mosaic study's cost is read from what its runs wrote: mmengine's
logs (one per training process) and the comparison's history.jsonl."""
import json
import time

from studies import mosaic_cost

T0 = 1_800_000_000.0  # a whole second, so log stamps lose nothing


def stamp(t):
    return time.strftime('%Y/%m/%d %H:%M:%S', time.localtime(t))


def write_log(run_dir, start, seconds):
    """An mmengine log of a process that started at ``start`` and logged
    its last line ``seconds`` later (plus a line without a timestamp)."""
    name = time.strftime('%Y%m%d_%H%M%S', time.localtime(start))
    folder = run_dir / name
    folder.mkdir(parents=True)
    (folder / f'{name}.log').write_text(
        f'{stamp(start)} - mmengine - INFO - \n-----\n'
        f'{stamp(start + seconds / 2)} - mmengine - INFO - Epoch(train)\n'
        f'{stamp(start + seconds)} - mmengine - INFO - Saving checkpoint\n')


def write_history(run_dir, *events):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / 'history.jsonl', 'w') as f:
        for event, t in events:
            f.write(json.dumps(dict(time=t, event=event)) + '\n')


def test_a_resumed_run_sums_its_processes_and_evaluates_after_them(tmp_path):
    run = tmp_path / 'runs' / 'mae' / 'seed0'
    write_log(run, T0, 600)  # killed after 10 minutes of training
    write_log(run, T0 + 3600, 1200)  # resumed an hour later, 20 minutes
    write_history(run, ('start', T0), ('start', T0 + 3600),
                  ('evaluated', T0 + 3600 + 1200 + 900))
    assert mosaic_cost.run_cost(str(run)) == dict(
        train_s=1800.0, eval_s=900.0, processes=2)


def test_an_evaluation_only_process_is_timed_from_its_start(tmp_path):
    run = tmp_path / 'runs' / 'random_init' / 'seed0'  # trains nothing
    write_history(run, ('start', T0), ('start', T0 + 5000),
                  ('evaluated', T0 + 5000 + 700))
    assert mosaic_cost.run_cost(str(run)) == dict(
        train_s=0.0, eval_s=700.0, processes=2)


def test_unfinished_runs_are_left_out_and_recorded_costs_are_kept(tmp_path):
    out = tmp_path / 'out'
    write_log(out / 'runs' / 'mae' / 'seed0', T0, 60)
    write_history(out / 'runs' / 'mae' / 'seed0', ('start', T0),
                  ('evaluated', T0 + 90))
    write_history(out / 'runs' / 'mae' / 'seed1', ('start', T0))
    recorded = tmp_path / 'cost.json'
    restored = dict(train_s=5.0, eval_s=6.0, processes=1)
    recorded.write_text(json.dumps(dict(simclr=dict(seed0=restored))))
    mosaic_cost.export_cost(str(out), str(recorded))
    costs = json.loads(recorded.read_text())
    assert costs == dict(
        mae=dict(seed0=dict(train_s=60.0, eval_s=30.0, processes=1)),
        simclr=dict(seed0=restored))
    lines = mosaic_cost.cost_markdown(costs, dict(mae='MAE'))
    assert '| MAE | 1 | 1 | 0 |' in lines
    assert any('0.0 job-hours for 2 runs' in line for line in lines)
