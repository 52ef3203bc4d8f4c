"""The README's main job, tools/quickstart.sh, end to end at a tiny size."""
import json
import os
import subprocess

import pytest


def run(repo_root, args, **env):
    proc = subprocess.run(args, cwd=repo_root, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_quickstart_reports_the_accuracy_of_the_probe_it_saves(
        repo_root, tmp_path):
    """The printed accuracy is that of the saved linear-probe checkpoint, as
    mmpretrain's tools/test.py measures it with linear_fmnist_clsmean.py."""
    proc = run(repo_root, ['bash', 'tools/quickstart.sh', str(tmp_path)],
               PRETRAIN_IMAGES='512', PRETRAIN_EPOCHS='2',
               EVAL_IMAGES='1000', EVAL_AMP='0', SEED='3')
    metrics = json.loads((tmp_path / 'metrics.json').read_text())
    message = (tmp_path / 'accuracy.txt').read_text()
    assert f"{metrics['linear/top1']:.2f} %" in message
    assert message.strip() in proc.stdout
    assert (tmp_path / 'mmae_fmnist' / 'epoch_2.pth').exists()
    dumped = (tmp_path / 'mmae_fmnist' / 'mmae_fmnist.py').read_text()
    assert 'seed=3' in dumped.replace(' ', '')

    out = tmp_path / 'test_metrics.json'
    run(repo_root, [
        '.venv/bin/python', 'tools/test.py',
        'configs/fashion_mnist/linear_fmnist_clsmean.py',
        str(tmp_path / 'linear_probe.pth'), '--work-dir',
        str(tmp_path / 'test'), '--out', str(out), '--out-item', 'metrics'
    ])
    top1 = json.loads(out.read_text())['accuracy/top1']
    # float32 classifier vs the float64 probe: a borderline image may flip.
    assert top1 == pytest.approx(metrics['linear/top1'], abs=0.05)
