"""The comparison tool (tools/compare.py, mmae_compare).

Library tests (intervals against closed forms, low-shot subsets, the spec,
the schedule, the report's tables), the shipped study pages rebuilt from
their runs.json, and a quick 2-arm x 2-seed grid run with submitit's local
executor and on a real single-node Slurm cluster (dev/slurm/), one job
requeued mid-training: every number and the report must be equal.
"""
import json
import math
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from mmae_compare.intervals import (NO_INTERVAL, mean_std, paired_interval,
                                    t_interval)
# Imported at collection, before any test opens a log file: importing
# submitit runs logging.config.dictConfig, which closes every open handler,
# the FileHandler of the MMLogger a later test's init_weights writes to.
from mmae_compare.jobs import pending_epochs
from mmae_compare.spec import Arm, Comparison, Protocol, parse_arm
from mmae_plugin.evaluation.lowshot import lowshot_indices

SCRIPT = 'tools/compare.py'


# ----------------------------------------------------------------------------
# Paired t-intervals against float64 closed forms
# ----------------------------------------------------------------------------
def closed_form_t975(dof: int) -> float:
    """Student-t 0.975 quantile in closed form (1 and 2 degrees of freedom):
    tan(pi (p - 1/2)) and (2p - 1) / sqrt(2 p (1 - p))."""
    p = 0.975
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    assert dof == 2
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


@pytest.mark.parametrize('values', [[0.3, -0.1], [1.25, -0.5, 0.75]])
def test_t_interval_equals_float64_closed_form(values):
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean)**2 for v in values) / (n - 1))
    half = closed_form_t975(n - 1) * sd / math.sqrt(n)
    got = t_interval(values)
    assert got.n == n
    assert got.mean == pytest.approx(mean, rel=1e-14, abs=1e-15)
    assert got.low == pytest.approx(mean - half, rel=1e-12)
    assert got.high == pytest.approx(mean + half, rel=1e-12)


def test_paired_interval_pairs_by_common_seed():
    ours = {0: 84.0, 1: 85.0, 2: 86.5, 7: 99.0}
    base = {0: 83.0, 1: 85.5, 2: 85.0, 3: 10.0}
    assert paired_interval(ours, base) == t_interval([1.0, -0.5, 1.5])
    assert paired_interval({0: 1.0}, {1: 2.0}) is None


def test_one_seed_says_no_interval_never_a_zero_width_one():
    got = paired_interval({0: 84.5}, {0: 84.0})
    assert got.n == 1 and got.low is None and got.high is None
    assert NO_INTERVAL in got.text() and '[' not in got.text()
    assert got.verdict() == 'n/a'


@pytest.mark.parametrize(
    'ours, base',
    [
        ({
            0: 80.1,
            1: 81.1
        }, {
            0: 80.3,
            1: 81.3
        }),  # -0.2 twice, up to rounding
        ({
            0: 70.0,
            1: 75.0,
            2: 71.0
        }, {
            0: 70.0,
            1: 75.0,
            2: 71.0
        }),
    ])
def test_equal_differences_have_no_interval_and_no_verdict(ours, base):
    """n >= 2 equal differences have no spread: no zero-width interval, no
    'lower' or 'higher'."""
    from mmae_compare.intervals import NO_SPREAD
    got = paired_interval(ours, base)
    assert got.n == len(ours) and got.low is None and got.high is None
    assert got.verdict() == 'n/a'
    assert got.text() == (f'{got.mean:+.2f} (n={got.n}, {NO_SPREAD})')
    assert '[' not in got.text()
    # A spread just above rounding is an interval again.
    spread = {**ours, 0: ours[0] + 1e-6}
    assert paired_interval(spread, base).has_interval


def test_interval_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match='values must be a non-empty'):
        t_interval([])
    with pytest.raises(ValueError, match='values must be finite'):
        t_interval([1.0, float('nan')])
    with pytest.raises(ValueError, match='level must be in'):
        t_interval([1.0, 2.0], level=1.5)
    assert math.isnan(mean_std([3.0])[1])


# ----------------------------------------------------------------------------
# Low-shot subsets and poolings
# ----------------------------------------------------------------------------
def test_lowshot_subsets_are_fixed_per_seed_and_balanced():
    labels = np.random.RandomState(123).randint(0, 10, size=5000)
    first = lowshot_indices(labels, 10, seed=3)
    assert np.array_equal(first, lowshot_indices(labels.tolist(), 10, 3))
    assert not np.array_equal(first, lowshot_indices(labels, 10, seed=4))
    assert np.bincount(labels[first], minlength=10).tolist() == [10] * 10
    with pytest.raises(ValueError, match='shots=3 but class 0 has only 2'):
        lowshot_indices(np.array([0, 0, 1, 1, 1]), 3, 0)


def test_every_pooling_from_cls_mean_features():
    import torch

    from mmae_compare.protocol import split_poolings
    from mmae_plugin.models.necks import pool_tokens
    tokens = torch.randn(5, 50, 8, generator=torch.Generator().manual_seed(0))
    split = split_poolings(
        pool_tokens(tokens, 'cls+mean'), 'cls+mean',
        ('cls', 'mean', 'cls+mean'))
    for pooling, features in split.items():
        assert torch.equal(features, pool_tokens(tokens, pooling)), pooling
    with pytest.raises(ValueError, match="pools 'cls'; it cannot give"):
        split_poolings(torch.zeros(3, 8), 'cls', ('cls', 'mean'))


# ----------------------------------------------------------------------------
# The spec
# ----------------------------------------------------------------------------
def small_spec(**changes) -> Comparison:
    arms = (parse_arm('mae=configs/fashion_mnist/mae_fmnist.py'),
            parse_arm(
                'mmae=configs/fashion_mnist/mmae_fmnist.py '
                'model.regularizer.loss_weight=0.01 '
                'model.regularizer.mu=(1,2)', 'M-MAE'), Arm('init', 'random'))
    fields = dict(
        arms=arms,
        reference='mae',
        seeds=(0, 1),
        epochs=4,
        eval_epochs=(2, 4),
        protocol=Protocol('configs/fashion_mnist/knn_fmnist_clsmean.py'))
    fields.update(changes)
    return Comparison(**fields)


def test_spec_round_trips_through_json_and_refuses_inconsistencies():
    spec = small_spec()
    assert spec.arm('mmae').options == (('model.regularizer.loss_weight',
                                         0.01), ('model.regularizer.mu',
                                                 [1, 2]))
    assert spec.arm('mmae').label == 'M-MAE' and spec.arm('mae').label == \
        'mae'
    assert Comparison.from_dict(json.loads(json.dumps(spec.as_dict()))) == \
        spec
    assert spec.arm_eval_epochs(spec.arm('init')) == (0, )
    assert spec.runs()[:3] == [('mae', 0), ('mmae', 0), ('init', 0)]
    for changes, message in (({
            'reference': 'byol'
    }, "reference 'byol' is not an arm"), ({
            'eval_epochs': (2, 3)
    }, 'must be increasing, >= 1 and end at'), ({
            'seeds': (1, 1)
    }, 'seeds must be distinct'), ({
            'protocol': Protocol(None)
    }, 'evaluates nothing'), ({
            'protocol': Protocol('x.py', poolings=('gem', ))
    }, 'poolings must be')):
        with pytest.raises(ValueError, match=re.escape(message)):
            small_spec(**changes)
    with pytest.raises(ValueError, match='plain directory name'):
        Arm('a/b', 'x.py')
    with pytest.raises(ValueError, match='is not KEY=VALUE'):
        parse_arm('a=x.py model')


def test_a_recorded_comparison_refuses_another_in_its_folder(
        tmp_path, repo_root):
    from mmae_compare.spec import freeze, frozen_config_path, load
    os.chdir(repo_root)
    spec = small_spec()
    assert freeze(str(tmp_path), spec) == spec
    assert load(str(tmp_path)) == spec
    for name in ('mae', 'mmae', 'eval'):
        assert osp.isfile(frozen_config_path(str(tmp_path), name))
    assert not osp.exists(frozen_config_path(str(tmp_path), 'init'))
    with pytest.raises(ValueError, match='holds a different comparison'):
        freeze(str(tmp_path), small_spec(seeds=(0, 1, 2)))


def test_restore_takes_up_finished_results_and_refuses_another(
        tmp_path, repo_root):
    """A runs.json carried to a fresh folder: its records and curves go
    into the run folders, finished runs are skipped, the rest is pending,
    and values logged afterwards override restored curve points."""
    from mmae_compare import records
    from mmae_compare.spec import freeze
    os.chdir(repo_root)
    spec = small_spec()
    rows = [{
        'arm': 'mae',
        'seed': 0,
        'epoch': e,
        'cls/linear_top1': 80.0 + e
    } for e in (2, 4)] + [{
        'arm': 'mmae',
        'seed': 1,
        'epoch': 2,
        'cls/linear_top1': 70.0
    }]
    curves = [{
        'arm': 'mae',
        'seed': 0,
        'curves': {
            'minfo_heldout/mutual_info_cov': [[0, 1.0], [4, 2.0]]
        }
    }]
    source = tmp_path / 'runs.json'
    source.write_text(
        json.dumps({
            'format': records.FORMAT,
            'comparison': spec.as_dict(),
            'runs': rows,
            'curves': curves
        }))
    out = str(tmp_path / 'fresh')
    freeze(out, spec)
    assert records.restore_runs(out, str(source)) == (3, 1)
    assert records.restore_runs(out, str(source)) == (0, 0)  # idempotent
    assert pending_epochs(out, spec, 'mae', 0) == []
    assert pending_epochs(out, spec, 'mmae', 1) == [4]
    assert records.read_runs(out)[1] == rows
    assert records.read_curves(out) == {
        ('mae', 0): {
            'minfo_heldout/mutual_info_cov': {
                0: 1.0,
                4: 2.0
            }
        }
    }
    from mmengine.visualization import LocalVisBackend
    LocalVisBackend(
        save_dir=osp.join(out, 'runs', 'mae', 'seed0', 't',
                          'vis_data')).add_scalars(
                              {
                                  'minfo_heldout/mutual_info_cov': 3.0,
                                  'epoch': 4
                              },
                              step=8)
    assert records.read_curves(out)[('mae',
                                     0)]['minfo_heldout/mutual_info_cov'] == {
                                         0: 1.0,
                                         4: 3.0
                                     }
    other = tmp_path / 'other.json'
    other.write_text(
        json.dumps({
            'format': records.FORMAT,
            'runs': rows,
            'comparison': small_spec(seeds=(0, 1, 2)).as_dict()
        }))
    with pytest.raises(ValueError, match='records another comparison'):
        records.restore_runs(out, str(other))


def test_schedule_is_stretched_to_the_comparison_epochs():
    from mmae_compare.training import fit_schedule
    schedule = [
        dict(type='LinearLR', by_epoch=True, begin=0, end=1),
        dict(
            type='CosineAnnealingLR',
            T_max=4,
            by_epoch=True,
            begin=1,
            end=5,
            eta_min=0.0)
    ]
    fitted = fit_schedule(schedule, 5, 20)
    assert fitted[0] == schedule[0]
    assert fitted[1] == dict(schedule[1], T_max=19, end=20)
    assert schedule[1]['end'] == 5  # the input is not changed
    # One epoch: the warm-up alone (the cosine would begin after the end).
    assert fit_schedule(schedule, 5, 1) == [schedule[0]]
    assert fit_schedule([dict(type='LinearLR', begin=0, end=3)], 5, 2) == \
        [dict(type='LinearLR', begin=0, end=2)]


# ----------------------------------------------------------------------------
# The report's tables
# ----------------------------------------------------------------------------
def test_summary_calls_a_difference_only_when_its_interval_excludes_zero():
    from mmae_compare.report import results_table, summary_lines
    spec = small_spec(seeds=(0, 1, 2, 3, 4))
    wobble = (0.3, -0.3, 0.2, -0.2, 0.0)
    rows = []
    for seed in spec.seeds:
        for arm, shift in (('mae', 0.0), ('mmae', -2.0 + wobble[seed] / 3)):
            rows.append({
                'arm': arm,
                'seed': seed,
                'epoch': 4,
                'cls/linear_top1': 80.0 + seed + shift
            })
    rows.append({
        'arm': 'init',
        'seed': 0,
        'epoch': 0,
        'cls/linear_top1': 70.0
    })
    lines = summary_lines(rows, spec, 4)
    diff = paired_interval(
        {r['seed']: r['cls/linear_top1']
         for r in rows if r['arm'] == 'mmae'},
        {r['seed']: r['cls/linear_top1']
         for r in rows if r['arm'] == 'mae'})
    assert diff.high < 0
    assert lines[0] == ('* **M-MAE, cls**: linear probe top-1 '
                        f'{diff.text()}: lower than mae.')
    assert lines[1] == ('* **init, cls**: linear probe top-1 -10.00 (n=1, '
                        'no interval).')
    assert lines[-1].startswith('* 2 comparisons with mae')
    table = results_table(rows, spec, 4, ['cls/linear_top1'])
    assert table[0] == ('| arm | linear probe top-1 (%) | n | Δ vs mae '
                        '[95 % CI] |')
    assert table[3].startswith('| M-MAE | 80.') and \
        table[3].endswith(f' | 5 | {diff.text()} |')
    assert table[2] == '| mae | 82.00 ± 1.58 | 5 | – |'


def test_summary_does_not_call_equal_differences_lower():
    from mmae_compare.report import summary_lines
    spec = small_spec(seeds=(0, 1))
    rows = [{
        'arm': arm,
        'seed': seed,
        'epoch': 4,
        'cls/linear_top1': 80.1 + seed - (0.2 if arm == 'mmae' else 0)
    } for seed in spec.seeds for arm in ('mae', 'mmae')]
    (line, ) = [
        line for line in summary_lines(rows, spec, 4) if 'M-MAE' in line
    ]
    assert line == ('* **M-MAE, cls**: linear probe top-1 -0.20 (n=2, all '
                    'equal, no spread: no interval).')


def test_option_sweeps_group_arms_differing_in_one_number():
    from mmae_compare.report import option_sweeps
    arms = [parse_arm('mae=m.py')] + [
        parse_arm(f'm{lam}=x.py a.lam={lam} a.mu=1') for lam in (1, 2, 3)
    ] + [parse_arm(f'u{mu}=x.py a.lam=1 a.mu={mu}') for mu in (2, 3)]
    spec = small_spec(arms=tuple(arms))
    sweeps = option_sweeps(spec)
    assert [[a.name for a in g]
            for g in sweeps['a.lam']] == [['m1', 'm2', 'm3']]
    assert [[a.name for a in g]
            for g in sweeps['a.mu']] == [['m1', 'u2', 'u3']]


# ----------------------------------------------------------------------------
# The shipped pages, rebuilt from their runs.json
# ----------------------------------------------------------------------------
@pytest.mark.parametrize('page', ['study', 'results', 'siamese'])
def test_shipped_page_is_rebuilt_from_its_runs_json(repo_root, tmp_path, page):
    """docs/<page>.md is the report of docs/<page>/runs.json: rebuilt from
    a copy of that file alone, every line after the one naming the command
    and date is the same."""
    docs = osp.join(repo_root, 'docs')
    shipped = open(osp.join(docs, f'{page}.md')).read().splitlines()
    command = re.search(r'Generated by `python tools/compare.py (.*?)` on',
                        shipped[2]).group(1)
    args = [a.strip("'") for a in re.findall(r"'[^']*'|\S+", command)]
    (tmp_path / page).mkdir()
    shutil.copy(osp.join(docs, page, 'runs.json'), tmp_path / page)
    for name in ('notes.md', ):
        if osp.isfile(osp.join(docs, page, name)):
            shutil.copy(osp.join(docs, page, name), tmp_path / page)
    args = [
        str(tmp_path / a[5:]) if a.startswith('docs/') else a for a in args
    ]
    proc = subprocess.run([sys.executable, SCRIPT, *args],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = (tmp_path / f'{page}.md').read_text().splitlines()
    assert len(rebuilt) == len(shipped) and rebuilt[3:] == shipped[3:]
    assert rebuilt[0] == shipped[0]


@pytest.mark.parametrize('page', ['study', 'results', 'siamese'])
def test_documented_run_command_gives_the_recorded_comparison(repo_root, page):
    """The command in docs/<page>/notes.md asks for exactly the comparison
    its runs.json records (arms, options, labels, seeds, protocol)."""
    import shlex
    sys.path.insert(0, osp.join(repo_root, 'tools'))
    try:
        import compare
    finally:
        sys.path.pop(0)
    notes = open(osp.join(repo_root, 'docs', page, 'notes.md')).read()
    command = re.search(r'```\n(python tools/compare.py run .*?)\n```', notes,
                        re.S).group(1).replace('\\\n', ' ')
    asked = compare.spec_of(compare.parse_args(shlex.split(command)[2:]))
    with open(osp.join(repo_root, 'docs', page, 'runs.json')) as f:
        recorded = Comparison.from_dict(json.load(f)['comparison'])
    assert asked == recorded


# ----------------------------------------------------------------------------
# Settings refused before any job
# ----------------------------------------------------------------------------
@pytest.mark.parametrize('options, message', [
    ([
        '--eval-config', 'configs/fashion_mnist/knn_fmnist_clsmean.py',
        '--bank-images', '100', '--shots', '2', '100'
    ], '--shots 2 100: class 8 has only 4 rows in the kNN bank (the first 100 '
     'training images, --bank-images), so at most 4 labels per class'),
    ([
        '--eval-config', 'configs/fashion_mnist/knn_fmnist.py',
        '--bank-images', '100', '--shots', '2'
    ], '--poolings cls cls+mean: the evaluation config '
     "configs/fashion_mnist/knn_fmnist.py pools 'cls'"),
])
def test_a_setting_the_evaluation_refuses_is_refused_before_any_job(
        repo_root, tmp_path, options, message):
    """What would fail every job after its training fails at once, and
    nothing is recorded or submitted."""
    out_dir = tmp_path / 'cmp'
    proc = subprocess.run([
        sys.executable, SCRIPT, 'run', '--out-dir',
        str(out_dir), '--arm', 'mae=configs/fashion_mnist/mae_fmnist.py',
        '--arm', 'init=random', '--reference', 'init', '--seeds', '0',
        '--epochs', '1', *options
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.startswith('compare.py: error: ' + message), \
        proc.stderr
    assert proc.stdout == '' and not out_dir.exists()


# ----------------------------------------------------------------------------
# A quick grid, local and on a real Slurm cluster
# ----------------------------------------------------------------------------
#: 2 arms x 2 seeds, 6 iterations per epoch, evaluated at the last epoch.
QUICK_GRID = [
    '--arm', 'mae=configs/fashion_mnist/mae_fmnist.py', '--arm',
    'mmae=configs/fashion_mnist/mmae_fmnist.py '
    'model.regularizer.loss_weight=0.01', '--reference', 'mae', '--seeds', '0',
    '1', '--epochs', '3', '--images', '1536', '--eval-config',
    'configs/fashion_mnist/knn_fmnist_clsmean.py', '--bank-images', '300',
    '--test-images', '200', '--shots', '2', '--cfg-options',
    'train_dataloader.num_workers=0',
    'train_dataloader.persistent_workers=False',
    'default_hooks.logger.interval=1', '--cpus-per-task', '1'
]
#: In the first of the Slurm node's two waves of jobs, so that its restart
#: overlaps the second wave.
REQUEUED = ('mmae', 0)

#: Set to 1 to run the real-Slurm tests (.ci/run does): they install Slurm
#: with apt-get when it is missing and start its daemons, which a test run
#: must not do unasked.
SLURM_VARIABLE = 'MMAE_TEST_SLURM'


def slurm_unavailable_reason():
    if os.environ.get(SLURM_VARIABLE) != '1':
        return (f'starts a local Slurm cluster (dev/slurm/start_cluster.sh: '
                f'apt-get install, /etc/slurm, daemons); set '
                f'{SLURM_VARIABLE}=1 to run it')
    if os.geteuid() != 0:
        return 'needs root to start munged, slurmctld and slurmd'
    if not shutil.which('slurmctld') and not shutil.which('apt-get'):
        return 'Slurm is not installed and apt-get is unavailable'
    return None


def compare(repo_root, *args, timeout=1800):
    proc = subprocess.run([sys.executable, SCRIPT, *args],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def run_dir(out_dir, arm, seed):
    return out_dir / 'runs' / arm / f'seed{seed}'


def requeue_mid_training(out_dir, log_path, timeout=1200):
    """Once the watched job has saved epoch 1 (of 3), requeue it with
    scontrol: its processes are killed 2 s later (KillWait), long before
    the 12 iterations of epochs 2 and 3 end."""
    directory = run_dir(out_dir, *REQUEUED)
    deadline = time.time() + timeout
    job = None
    while job is None or not (directory / 'epoch_1.pth').exists():
        assert time.time() < deadline, 'the job never saved epoch 1'
        found = re.search(
            rf'{REQUEUED[0]} seed {REQUEUED[1]}: submitted as '
            r'job (\d+)', log_path.read_text())
        job = found and found.group(1)
        time.sleep(0.2)
    subprocess.run(['scontrol', 'requeue', job], check=True)
    return job


@pytest.fixture(scope='module')
def slurm_cluster(repo_root):
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    was_up = subprocess.run(['sinfo'], capture_output=True).returncode == 0 \
        if shutil.which('sinfo') else False
    proc = subprocess.run(['bash', 'dev/slurm/start_cluster.sh'],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=900)
    if proc.returncode != 0 and 'apt' in proc.stderr + proc.stdout:
        pytest.skip(f'could not install Slurm: {proc.stderr[-500:]}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield
    if not was_up:
        subprocess.run(['bash', 'dev/slurm/stop_cluster.sh'],
                       cwd=repo_root,
                       capture_output=True,
                       timeout=120)


def start_grid(repo_root, out_dir, *options):
    """The quick grid in ``out_dir``, running; its output goes to
    ``<out_dir>.log`` beside it.

    Returns:
        ``(process, log path)``.
    """
    log_path = out_dir.parent / f'{out_dir.name}.log'
    command = [
        sys.executable, SCRIPT, 'run', '--out-dir',
        str(out_dir), *QUICK_GRID, *options
    ]
    with open(log_path, 'w') as log:
        process = subprocess.Popen(
            command, cwd=repo_root, stdout=log, stderr=subprocess.STDOUT)
    return process, log_path


@pytest.fixture(scope='module')
def local_and_slurm(repo_root, tmp_path_factory, slurm_cluster):
    """The quick grid on Slurm and, at the same time, on the local executor
    (their waits for the scheduler overlap the other's training)."""
    local = tmp_path_factory.mktemp('local')
    slurm = tmp_path_factory.mktemp('slurm')
    grids = []
    try:
        grids.append(
            start_grid(repo_root, slurm, '--cluster', 'slurm', '--partition',
                       'debug', '--time-min', '30'))
        grids.append(start_grid(repo_root, local, '--parallel', '2'))
        job = requeue_mid_training(slurm, grids[0][1])
        for process, log_path in grids:
            assert process.wait(timeout=1800) == 0, \
                log_path.read_text()[-3000:]
    finally:
        for process, _ in grids:
            if process.poll() is None:
                process.kill()
    return local, slurm, job


def numbers(out_dir):
    """runs.json's records without timings, and its spec."""
    data = json.loads((out_dir / 'runs.json').read_text())
    rows = [{k: v
             for k, v in row.items() if not k.startswith('time/')}
            for row in data['runs']]
    return data['comparison'], rows


def test_slurm_grid_equals_the_local_grid_number_for_number(local_and_slurm):
    local, slurm, _ = local_and_slurm
    local_spec, local_rows = numbers(local)
    slurm_spec, slurm_rows = numbers(slurm)
    assert local_spec == slurm_spec
    assert len(local_rows) == 4
    assert local_rows == slurm_rows  # exact floats, every metric
    for row in local_rows:
        assert 0 <= row['cls+mean/linear_top1'] <= 100
        assert row['epoch'] == 3 and row['test_images'] == 200
    pages = [(d / 'report.md').read_text().splitlines()
             for d in (local, slurm)]
    # Line 3 names the command (its --out-dir and --cluster).
    assert pages[0][3:] == pages[1][3:] and pages[0][0] == pages[1][0]
    assert '| mmae | ' in '\n'.join(pages[0]) and '(n=2)' in pages[0][14]
    for figure in ('paired_differences', 'accuracy_vs_rank'):
        assert (local / 'figures' / f'{figure}.png').read_bytes() == \
            (slurm / 'figures' / f'{figure}.png').read_bytes()


def test_every_run_records_its_training_and_evaluation_time(local_and_slurm):
    from mmae_compare.cost import comparison_cost
    local, slurm, _ = local_and_slurm
    for out_dir in (local, slurm):
        costs = comparison_cost(str(out_dir))
        runs = [run for by_seed in costs.values() for run in by_seed.values()]
        assert len(runs) == len(list(out_dir.glob('runs/*/seed*'))) > 0
        for run in runs:
            assert run['train_cpu_s'] > 0 and run['eval_cpu_s'] > 0, run
            assert run['train_s'] > 0 and run['eval_s'] > 0, run
    arm, seed = REQUEUED
    assert costs[arm][f'seed{seed}']['processes'] == 2


def test_the_requeued_job_resumed_instead_of_restarting(local_and_slurm):
    _, slurm, job = local_and_slurm
    directory = run_dir(slurm, *REQUEUED)
    starts = [
        json.loads(line)
        for line in (directory / 'history.jsonl').read_text().splitlines()
        if '"start"' in line
    ]
    assert [s['job'] for s in starts] == [job, job]
    assert [s['restarts'] for s in starts] == [0, 1]
    assert starts[0]['trained_epoch'] is None
    # Requeued mid-training: resumed from a checkpoint before the last epoch.
    assert starts[1]['trained_epoch'] in (1, 2), starts
    logs = '\n'.join(p.read_text() for p in directory.glob('*/*.log'))
    resumed = starts[1]['trained_epoch']
    # The plugin's runner (the config's runner_type) chose it from the
    # run record.
    assert f'Auto-resuming from {directory / f"epoch_{resumed}.pth"}' \
        in logs, logs[-2000:]
    # Every epoch before the resume point was trained exactly once.
    for epoch in range(1, resumed + 1):
        assert logs.count(f'Epoch(train) [{epoch}][6/6]') == 1, epoch


def test_pruned_checkpoints_are_marked_in_the_run_record(local_and_slurm):
    """The comparison keeps the evaluated epochs and the newest: the
    others leave through the run record (a ``removed`` line before the file
    goes), as the checkpoint hook's own retention does."""
    from mmae_plugin.checkpoint.run_record import read_record, record_path
    local, _, _ = local_and_slurm
    for arm, seed in (('mae', 0), ('mmae', 1)):
        directory = str(run_dir(local, arm, seed))
        assert [e.epoch for e in read_record(directory).checkpoints()] == [3]
        with open(record_path(directory)) as f:
            events = [json.loads(line) for line in f]
        removed = [
            osp.basename(e['path']) for e in events if e['event'] == 'removed'
        ]
        assert removed == ['epoch_1.pth', 'epoch_2.pth'], events
        assert sorted(
            p.name for p in run_dir(local, arm, seed).glob('epoch_*.pth')) == [
                'epoch_3.pth'
            ]


def test_a_failed_job_is_named_with_its_error_and_the_rest_reported(
        repo_root, tmp_path):
    proc = subprocess.run([
        sys.executable, SCRIPT, 'run', '--out-dir',
        str(tmp_path), '--arm', 'broken=configs/fashion_mnist/mae_fmnist.py '
        'model.type=NoSuchAlgorithm', '--arm', 'init=random', '--reference',
        'init', '--seeds', '0', '--epochs', '1', '--eval-config',
        'configs/fashion_mnist/knn_fmnist_clsmean.py', '--bank-images', '100',
        '--test-images', '100', '--shots', '2'
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = proc.stdout.split('[compare] failed:')[1]
    assert 'broken seed 0 (job ' in failed and 'NoSuchAlgorithm' in failed
    assert 'KeyError' in failed and '_log.err' in failed
    report = (tmp_path / 'report.md').read_text()
    assert ('**Not finished**: 1 of 2 evaluations. Missing: broken seed 0 '
            '(0 of 1 evaluations).') in report
    assert '| init | ' in report
    # submitit's files lie in jobs/, named by job id: no literal %j folder.
    assert not [p for p in (tmp_path / 'jobs').iterdir() if '%' in p.name
                ], sorted((tmp_path / 'jobs').iterdir())
    # No upstream warning (mmcv-lite's, setuptools' pkg_resources) in the
    # tool's own output: tools/train.py does not print them either.
    assert 'Warning' not in proc.stdout + proc.stderr, proc.stderr[-3000:]
