"""tools/quickstart.sh checks its variables before it sets up or runs anything.

Every refused value exits 2 with a message naming the variable, the value
and the allowed range, and without touching the environment or the work
dir; ``DRY_RUN=1`` shows what accepted values become on the command lines.
"""
import os
import signal
import subprocess

import pytest


def quickstart(repo_root, work_dir, **env):
    """Run the quick start with ``env`` over a clean copy of the
    environment."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PRETRAIN_EPOCHS', 'PRETRAIN_IMAGES', 'EVAL_IMAGES',
                     'SEED', 'EVAL_AMP', 'CONFIG', 'EVAL_CONFIG', 'DRY_RUN')
    }
    # Its own process group, so that a check letting a value through (the
    # run then starts training) leaves no training process behind.
    proc = subprocess.Popen(['bash', 'tools/quickstart.sh',
                             str(work_dir)],
                            cwd=repo_root,
                            env=dict(base, **env),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                       stderr)


@pytest.mark.parametrize('name,value,allowed', [
    ('PRETRAIN_EPOCHS', '1', 'an integer >= 2'),
    ('PRETRAIN_EPOCHS', '0', 'an integer >= 2'),
    ('PRETRAIN_EPOCHS', 'four', 'an integer >= 2'),
    ('PRETRAIN_EPOCHS', '2.5', 'an integer >= 2'),
    ('PRETRAIN_IMAGES', '255', 'an integer from 256 to 60000'),
    ('PRETRAIN_IMAGES', '60001', 'an integer from 256 to 60000'),
    ('EVAL_IMAGES', '19', 'an integer from 20 to 60000'),
    ('EVAL_IMAGES', ' 100', 'an integer from 20 to 60000'),
    ('TEST_IMAGES', '0', 'an integer from 1 to 10000'),
    ('TEST_IMAGES', '10001', 'an integer from 1 to 10000'),
    ('SEED', '-1', 'an integer from 0 to 4294967295'),
    ('SEED', '4294967296', 'an integer from 0 to 4294967295'),
    ('SEED', '1e3', 'an integer from 0 to 4294967295'),
    ('EVAL_AMP', 'yes', 'EVAL_AMP must be 1'),
    ('CONFIG', 'configs/fashion_mnist/no_such.py', 'must be a config file'),
    ('EVAL_CONFIG', 'README.md', 'must be a config file'),
])
def test_refused_value_names_variable_and_range_before_anything_runs(
        repo_root, tmp_path, name, value, allowed):
    work_dir = tmp_path / 'work'
    # DRY_RUN=1 so that a check that let a value through prints the commands
    # instead of running a full quick start; the checks come first either
    # way (the next test runs without it).
    proc = quickstart(repo_root, work_dir, DRY_RUN='1', **{name: value})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    expected = f"[quickstart] error: {name}='{value}' is not allowed"
    assert expected in proc.stderr
    assert allowed in proc.stderr
    # Refused up front: nothing printed or planned, no work dir.
    assert proc.stdout == ''
    assert not work_dir.exists()


def test_issue_case_pretrain_epochs_1_fails_before_setup(repo_root, tmp_path):
    proc = quickstart(repo_root, tmp_path / 'work', PRETRAIN_EPOCHS='1')
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "PRETRAIN_EPOCHS='1' is not allowed" in proc.stderr
    assert '[setup]' not in proc.stdout + proc.stderr
    assert not (tmp_path / 'work').exists()


def test_accepted_boundaries_reach_the_command_lines(repo_root, tmp_path):
    proc = quickstart(
        repo_root,
        tmp_path,
        DRY_RUN='1',
        PRETRAIN_EPOCHS='02',
        PRETRAIN_IMAGES='256',
        EVAL_IMAGES='20',
        SEED='4294967295',
        EVAL_AMP='0')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    train = next(line for line in lines if 'tools/train.py' in line)
    # Leading zeros dropped (bash would read 08 as octal); the scheduler's
    # cosine phase ends with the last epoch.
    for option in ('train_cfg.max_epochs=2 ', 'param_scheduler.1.T_max=1 ',
                   'param_scheduler.1.end=2 ',
                   'train_dataloader.dataset.indices=256 ',
                   'randomness.seed=4294967295 '):
        assert option in train + ' ', (option, train)
    evaluate = next(line for line in lines if 'evaluate_frozen.py' in line)
    assert f'{tmp_path}/mmae_fmnist/epoch_2.pth' in evaluate
    assert 'model.prototype.dataset.indices=20' in evaluate
    assert '--amp' not in evaluate
    # A dry run runs nothing.
    assert not (tmp_path / 'mmae_fmnist').exists()
    assert '[setup]' not in proc.stdout


def test_default_values_are_accepted(repo_root, tmp_path):
    proc = quickstart(repo_root, tmp_path, DRY_RUN='1')
    assert proc.returncode == 0, proc.stderr
    assert 'train_cfg.max_epochs=4' in proc.stdout
    assert '--amp' in proc.stdout
