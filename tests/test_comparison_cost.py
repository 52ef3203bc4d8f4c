"""A comparison's cost is read from what its runs wrote: the events of
history.jsonl, or, for histories older than the ``trained`` event,
mmengine's logs (one per training process)."""
import json
import time

from mmae_compare import cost
from mmae_compare.spec import (SPEC_FILE, Arm, Comparison, Protocol, parse_arm,
                               write_json_atomic)

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
    """history.jsonl of (event, time) or (event, time, cpu_s) tuples."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / 'history.jsonl', 'w') as f:
        for event, t, *cpu in events:
            f.write(
                json.dumps(
                    dict(time=t, event=event, cpu_s=cpu[0]
                         ) if cpu else dict(time=t, event=event)) + '\n')


def test_recorded_events_give_wall_and_cpu_time_per_phase(tmp_path):
    run = tmp_path / 'runs' / 'mae' / 'seed0'
    write_log(run, T0, 5)  # the logs are not read when events exist
    write_history(
        run,
        ('start', T0, 3.0),
        ('trained', T0 + 100, 90.0),  # epoch 5: 100 s, 87 CPU s
        ('evaluated', T0 + 130, 110.0),  # 30 s, 20 CPU s
        ('trained', T0 + 200, 170.0),  # epoch 10, then killed
        ('start', T0 + 1000, 4.0),  # requeued: the checkpoint is there
        ('trained', T0 + 1010, 12.0),
        ('evaluated', T0 + 1050, 50.0))
    assert cost.run_cost(str(run)) == dict(
        train_s=100.0 + 70 + 10,
        eval_s=30.0 + 40,
        train_cpu_s=87.0 + 60 + 8,
        eval_cpu_s=20.0 + 38,
        processes=2)


def test_a_resumed_run_sums_its_processes_and_evaluates_after_them(tmp_path):
    run = tmp_path / 'runs' / 'mae' / 'seed0'
    write_log(run, T0, 600)  # killed after 10 minutes of training
    write_log(run, T0 + 3600, 1200)  # resumed an hour later, 20 minutes
    write_history(run, ('start', T0), ('start', T0 + 3600),
                  ('evaluated', T0 + 3600 + 1200 + 900))
    assert cost.run_cost(str(run)) == dict(
        train_s=1800.0, eval_s=900.0, processes=2)


def test_an_evaluation_only_process_is_timed_from_its_start(tmp_path):
    run = tmp_path / 'runs' / 'random_init' / 'seed0'  # trains nothing
    write_history(run, ('start', T0), ('start', T0 + 5000),
                  ('evaluated', T0 + 5000 + 700))
    assert cost.run_cost(str(run)) == dict(
        train_s=0.0, eval_s=700.0, processes=2)


def test_unfinished_runs_are_left_out_and_recorded_costs_are_kept(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    spec = Comparison(
        arms=(parse_arm('mae=configs/fashion_mnist/mae_fmnist.py'),
              Arm('init', 'random')),
        reference='mae',
        seeds=(0, 1),
        epochs=1,
        eval_epochs=(1, ),
        protocol=Protocol('configs/fashion_mnist/knn_fmnist_clsmean.py'))
    write_json_atomic(str(out / SPEC_FILE), spec.as_dict())
    write_log(out / 'runs' / 'mae' / 'seed0', T0, 60)
    write_history(out / 'runs' / 'mae' / 'seed0', ('start', T0),
                  ('evaluated', T0 + 90))
    write_history(out / 'runs' / 'mae' / 'seed1', ('start', T0))
    # A folder the recorded comparison does not name is not one of its runs.
    write_history(out / 'runs' / 'stray' / 'seed0', ('start', T0),
                  ('evaluated', T0 + 5))
    recorded = tmp_path / 'cost.json'
    restored = dict(train_s=5.0, eval_s=6.0, processes=1)
    recorded.write_text(json.dumps(dict(simclr=dict(seed0=restored))))
    cost.export_cost(str(out), str(recorded))
    costs = json.loads(recorded.read_text())
    assert costs == dict(
        mae=dict(seed0=dict(train_s=60.0, eval_s=30.0, processes=1)),
        simclr=dict(seed0=restored))
    lines = cost.cost_markdown(costs, dict(mae='MAE'))
    assert '| MAE | 1 | 1 | 0 |' in lines
    assert lines[-1] == 'In all 0.0 job-hours of wall time for 2 runs.'


def test_the_table_gives_minutes_per_run_and_hours_in_all():
    runs = dict(
        seed0=dict(train_s=3000.0, eval_s=600.0, processes=1),
        seed1=dict(train_s=4200.0, eval_s=1200.0, processes=2))
    timed = dict(
        train_s=1800.0,
        eval_s=0.0,
        train_cpu_s=3240.0,
        eval_cpu_s=360.0,
        processes=1)
    lines = cost.cost_markdown(dict(mae=runs, simclr=dict(seed0=timed)), {})
    assert lines[2] == '| mae | 2 | 50-70 | 10-20 |'
    assert lines[3] == '| simclr | 1 | 30 | 0 |'
    assert lines[-1] == ('In all 3.0 job-hours of wall time for 3 runs. '
                         'CPU time (rank 0) of the 1 runs that recorded it: '
                         '1.0 core-hours.')
