"""dev/gpu_check.sh --dry-run: every stage of the prepared GPU check, for
real, on the CPU (ViT-tiny at 32 x 32, a few synthetic images), and the
results it leaves in $OUT as the device tool would bring them back."""
import glob
import json
import os
import os.path as osp
import re
import statistics
import subprocess
from typing import List, Tuple

import pytest

STAGES = [
    'environment', 'install', 'images', 'cuda_tests', 'dist_train', 'bench_gpu'
]
OUT_FILES = {
    'gpu_check.json', 'gpu_check.md', 'bench_gpu.json', 'dist_train.json',
    'install.log', 'cuda_tests.log', 'bench_gpu.log', 'dist_train.log'
}
#: Seconds of one `run` call (dev/gpu_check.sh's head: 15 min of device
#: time less the start, transfers and a rerun; at most 600 s a command).
DEVICE_BUDGET_S = 560
REPORT_RESERVE_S = 15


def stage_limits(repo_root: str) -> List[Tuple[str, int]]:
    """``run_stage NAME SECONDS`` of the script, in order."""
    text = open(osp.join(repo_root, 'dev', 'gpu_check.sh')).read()
    return [(name, int(limit)) for name, limit in re.findall(
        r'^run_stage (\w+) (\d+)$', text, flags=re.M)]


def cuda_marked_tests(repo_root: str) -> int:
    """Test functions in tests/test_cuda.py (each has >= 1 case)."""
    source = open(osp.join(repo_root, 'tests', 'test_cuda.py')).read()
    return source.count('\ndef test_')


@pytest.fixture(scope='module')
def dry_run(repo_root, tmp_path_factory, cpu_dist_env_factory):
    """One dry run of the whole script; its return code, stdout and $OUT."""
    out = tmp_path_factory.mktemp('gpu_check_out')
    env = cpu_dist_env_factory(OUT=str(out))
    env.pop('GPU_CHECK_DRY_RUN', None)
    proc = subprocess.run(['bash', 'dev/gpu_check.sh', '--dry-run'],
                          cwd=repo_root,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=1800)
    return proc, str(out)


def test_dry_run_passes_every_stage(dry_run, repo_root):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.load(open(osp.join(out, 'gpu_check.json')))
    assert report['mode'] == 'dry-run (CPU)' and report['passed'] is True
    assert [s['name'] for s in report['stages']] == STAGES
    wheels = glob.glob(osp.join(repo_root, '.whl', '*.whl'))
    for stage in report['stages']:
        expected = 'passed'
        if stage['name'] == 'install' and not wheels:
            expected = 'skipped'  # a checkout without dev/gpu_wheels.sh's
        assert stage['status'] == expected, stage
        assert 0 < stage['seconds'] <= stage['timeout_s']
    assert report['total_s'] < report['budget_s']


def test_dry_run_leaves_what_the_device_tool_brings_back(dry_run):
    """At most 8 plain files, each <= 16 MiB, named in letters, digits,
    '.', '_' and '-'."""
    _, out = dry_run
    names = set(os.listdir(out))
    assert names == OUT_FILES
    for name in names:
        assert re.fullmatch(r'[A-Za-z0-9._-]+', name)
        assert osp.isfile(osp.join(out, name))
        assert osp.getsize(osp.join(out, name)) <= 16 * 2**20


def test_dry_run_collects_the_cuda_tests_and_skips_them(dry_run, repo_root):
    _, out = dry_run
    tests = json.load(open(osp.join(out, 'gpu_check.json')))['cuda_tests']
    # Every parametrisation of tests/test_cuda.py was collected (none
    # silently missing) and, without a GPU, skipped.
    assert tests['failed'] == [] and tests['passed'] == 0
    assert tests['skipped'] == tests['total'] >= cuda_marked_tests(repo_root)
    log = open(osp.join(out, 'cuda_tests.log')).read()
    assert 'torch sees no CUDA device' in log


def test_dry_run_benchmark_figures(dry_run):
    _, out = dry_run
    bench = json.load(open(osp.join(out, 'bench_gpu.json')))
    assert bench['failed_cases'] == [] and 'partial' not in bench
    block = bench['amp']['float32']
    cases = block['cases']
    assert set(cases) == {'MAE', 'M-MAE'}
    for case in cases.values():
        assert case['world_size'] == 1 and case['optim_wrapper'] == \
            'OptimWrapper'
        assert case['param_groups'] == 2  # merged decay / no-decay groups
        # FlopCounterMode against the closed form from the model's shapes.
        assert 0.9 < case['flops']['counted_over_analytic'] < 1.1
        assert case['flops']['vit_b_recipe'] is False
        assert case['loader_fed']['steps'] == 1
        assert case['loader_fed']['images_per_s'] > 0
        # 3 alternating rounds of --iters 1 step each.
        assert [r['round'] for r in case['rounds']] == [0, 1, 2]
        assert all(r['steps'] == 1 for r in case['rounds'])
    mmae = cases['M-MAE']
    # Global batch 4 x 2 = 8 rows: 2 real, 6 standing in for other ranks.
    assert (mmae['regularised_rows'], mmae['stand_in_rows']) == (8, 6)
    assert mmae['regulariser']['skip_code'] == 0
    assert 'regulariser' not in cases['MAE']
    assert block['mmae_over_mae_step_ratio'] > 0
    assert block['regulariser_ms'] > 0 and 'goals' not in block
    assert len(block['step_ratio_per_round']) == block['rounds'] == 3
    low, high = block['step_ratio_interval_95']
    assert low <= statistics.fmean(block['step_ratio_per_round']) <= high
    # The regulariser alone at the gathered size (8 rows x ViT-tiny's 192).
    assert block['regulariser_gathered_shape'] == [8, 192]
    assert mmae['regulariser_gathered']['gather'] == 'local'
    assert block['regulariser_gathered_ms'] > 0
    # The folder the images stage wrote: 8 images, one PNG.
    assert bench['image_folder']['root'].endswith('images')
    assert bench['dataloader_alone']['pipeline'][0] == 'LoadImageBytes'
    report = json.load(open(osp.join(out, 'gpu_check.json')))
    assert report['bench_gpu']['float32']['regulariser_rows'] == 8


def test_dry_run_resumes_the_distributed_training(dry_run):
    """Run 1 trains epoch 1 (iterations 1-4), run 2 resumes at iteration 4
    and trains 5-8, with finite losses and the regulariser applied."""
    _, out = dry_run
    dist = json.load(open(osp.join(out, 'gpu_check.json')))['dist_train']
    assert dist['passed'] and dist['problems'] == []
    assert dist['returncodes'] == [0, 0]
    assert dist['iterations_per_epoch'] == 4
    first, second = dist['runs']
    assert first['iterations'] == [1, 2, 3, 4]
    assert second['iterations'] == [5, 6, 7, 8]
    assert any('resumed epoch: 1, iter: 4' in line
               for line in second['resumed'])
    assert {'epoch_1.pth', 'epoch_2.pth'} <= set(dist['checkpoints'])
    # dev/gpu_check_hooks.py ran inside the recipe (no CUDA: nothing counted)
    assert dist['device_waits']['counted'] is False
    assert dist['device_waits']['steps'] == 0


def test_dry_run_markdown_summary(dry_run):
    _, out = dry_run
    text = open(osp.join(out, 'gpu_check.md')).read()
    assert text.startswith('# GPU check (dry-run (CPU))')
    assert 'All stages passed' in text
    for stage in STAGES:
        assert re.search(rf'\| {stage} \| (passed|skipped) \|', text), stage
    assert 'CUDA tests: 0 passed, 0 failed' in text
    assert '| float32 | M-MAE |' in text
    assert '## dist_train.sh (1 process, resumed)' in text


def test_stage_order_and_limits_fit_the_device_budget(repo_root):
    """dist_train before the benchmark; the limits sum to the budget."""
    limits = stage_limits(repo_root)
    assert [name for name, _ in limits] == STAGES
    assert dict(limits)['environment'] == 60
    text = open(osp.join(repo_root, 'dev', 'gpu_check.sh')).read()
    assert f'DEVICE_BUDGET={DEVICE_BUDGET_S}' in text
    assert f'REPORT_RESERVE={REPORT_RESERVE_S}' in text
    assert sum(limit for _, limit in limits) + REPORT_RESERVE_S == \
        DEVICE_BUDGET_S
    # One `run` command is at most 600 s; a stage overrunning its limit is
    # killed 10 s later (timeout -k 10).
    assert DEVICE_BUDGET_S + 10 < 600


def test_cuda_tests_have_a_per_test_timeout(repo_root):
    text = open(osp.join(repo_root, 'dev', 'gpu_check.sh')).read()
    assert 'limits=(--timeout "$GC_TEST_TIMEOUT" -o timeout_method=thread)' \
        in text
    assert 'GC_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT_S:-45}"' in text


def test_dry_run_checks_distutils_first_and_keeps_the_environment(dry_run):
    """The environment stage's output is in gpu_check.json (no file of its
    own), its first line the distutils check."""
    _, out = dry_run
    report = json.load(open(osp.join(out, 'gpu_check.json')))
    assert report['environment'][0] == 'distutils.errors: importable'
    assert report['distutils_importable'] is True
    assert any(line.startswith('torch ') for line in report['environment'])
    dist = json.load(open(osp.join(out, 'dist_train.json')))
    assert [len(run['losses']) for run in dist['runs']] == [4, 4]


def test_unknown_argument_is_refused(repo_root):
    proc = subprocess.run(['bash', 'dev/gpu_check.sh', '--fast'],
                          cwd=repo_root,
                          capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert "usage: bash dev/gpu_check.sh [--dry-run] (got '--fast')" in \
        proc.stderr
