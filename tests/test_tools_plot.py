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
