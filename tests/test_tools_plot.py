"""tools/analysis/plot_matrix_info.py on one-branch logs and on empty ones.

The logs are written by mmengine's own LocalVisBackend, in the layout a
runner leaves (``<work_dir>/<timestamp>/vis_data/scalars.json``), with the
scalar names MatrixInfoHook logs for MAE / U-MAE / M-MAE.
"""
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.visualization import LocalVisBackend

SCRIPT = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
                  'analysis', 'plot_matrix_info.py')
ONE_BRANCH_KEYS = ('entropy', 'erank', 'rankme', 'tcr')


def write_run(work_dir, scalars_per_step):
    backend = LocalVisBackend(save_dir=str(work_dir / '20260101_000000' /
                                           'vis_data'))
    for step, scalars in enumerate(scalars_per_step, start=1):
        backend.add_scalars(scalars, step=step)
    return work_dir


def plot(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_one_branch_run_draws_its_four_quantities(tmp_path):
    run = write_run(tmp_path / 'mmae', [
        {f'minfo/{key}': 1.0 + 0.1 * step for key in ONE_BRANCH_KEYS} |
        {'loss': 1.0} for step in range(5)])
    out = tmp_path / 'figures'
    result = plot(run, '--out-dir', out, '--labels', 'M-MAE')
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ('matrix_info', *(f'minfo_{key}' for key in ONE_BRANCH_KEYS)):
        for ext in ('png', 'pdf'):
            assert (out / f'{name}.{ext}').stat().st_size > 1000
    assert not list(out.glob('figure*'))


def test_nothing_to_draw_exits_non_zero_with_a_message(tmp_path):
    run = write_run(tmp_path / 'mmae', [{'minfo/erank': 3.0}])
    out = tmp_path / 'figures'
    result = plot(run, '--keys', 'mutual_info', 'matrix_js', '--out-dir', out)
    assert result.returncode == 1
    assert ("nothing to draw: no run logged ['mutual_info', 'matrix_js']; "
            "the runs logged ['erank']") in result.stderr
    assert not out.exists()
    assert 'Traceback' not in result.stderr


def test_run_without_matrix_info_is_refused(tmp_path, monkeypatch):
    bare = write_run(tmp_path / 'mae', [{'loss': 1.0}])
    sys.path.insert(0, osp.dirname(SCRIPT))
    try:
        import plot_matrix_info
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(sys, 'argv', ['plot_matrix_info.py', str(bare)])
    with pytest.raises(SystemExit, match='MatrixInfoHook in custom_hooks'):
        plot_matrix_info.main()


# --------------------------------------------------------------------------
# tools/theory/run_imbalance.py: one seed shows no spread, the claim reads
# --------------------------------------------------------------------------
IMBALANCE = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
                     'theory', 'run_imbalance.py')


def load_imbalance_module():
    sys.path.insert(0, osp.dirname(IMBALANCE))
    try:
        import run_imbalance
    finally:
        sys.path.pop(0)
    return run_imbalance


def test_imbalance_spread_is_population_std_or_none_for_one_seed():
    module = load_imbalance_module()
    two = module.mean_std([1.0, 2.0])
    assert two == dict(mean=1.5, std=0.5, n=2)
    assert module.format_stat(two) == '1.500 +/- 0.500'
    one = module.mean_std([0.25])
    assert one == dict(mean=0.25, std=None, n=1)
    assert module.format_stat(one) == '0.250'


def test_imbalance_one_seed_run_prints_no_fake_spread_and_a_readable_claim(
        tmp_path):
    import json
    out = tmp_path / 'theory'
    proc = subprocess.run([
        sys.executable, IMBALANCE, '--out-dir', str(out), '--seeds', '0',
        '--exponents', '0.5', '--num-patches', '16', '--steps', '4',
        '--eval-interval', '2', '--batch-size', '4', '--feature-dim', '4'
    ], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '+/-' not in proc.stdout and '+-' not in proc.stdout
    assert 'init -> final (one seed)' in proc.stdout
    assert "{'criterion'" not in proc.stdout
    payload = json.loads((out / 'imbalance_results.json').read_text())
    summary = payload['results']['0.5']['summary']
    assert summary['mae']['own_local_final']['std'] is None
    claim = payload['claim_at_chosen_exponent']
    verdict = 'HOLDS' if claim['claim_holds'] else 'DOES NOT HOLD'
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines)
                if line.startswith('claim at kappa=0.5'))
    assert lines[head].endswith(f': {verdict}')
    for offset, (key, label) in enumerate(
            (('mae_global_rises', 'MAE, global area:'),
             ('mae_local_rises', 'MAE, local areas:'),
             ('cl_global_rises', 'CL, global area:'),
             ('cl_local_rises', 'CL, local areas:')), start=1):
        expected = 'rises' if claim[key] else 'does not rise'
        assert lines[head + offset].split() == [*label.split(),
                                                *expected.split()]
    for name in ('attention_curves', 'phase_diagram'):
        assert (out / f'{name}.png').stat().st_size > 1000
