"""tools/analysis/plot_matrix_info.py and tools/theory/run_imbalance.py.

The matrix-information logs are written by mmengine's own LocalVisBackend,
in the layout a runner leaves (``<work_dir>/<timestamp>/vis_data/
scalars.json``), with the scalar names MatrixInfoHook logs for MAE / U-MAE /
M-MAE. The plot's reference lines are checked against MatrixInfoHook's own
TCR on collapsed and flat-spectrum batches.
"""
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.visualization import LocalVisBackend

SCRIPT = osp.join(
    osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', 'analysis',
    'plot_matrix_info.py')
ONE_BRANCH_KEYS = ('entropy_cov', 'erank_cov', 'rankme_raw',
                   'tcr_reference_mu1')


def write_run(work_dir, scalars_per_step):
    backend = LocalVisBackend(
        save_dir=str(work_dir / '20260101_000000' / 'vis_data'))
    for step, scalars in enumerate(scalars_per_step, start=1):
        backend.add_scalars(scalars, step=step)
    return work_dir


def plot(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)],
                          capture_output=True,
                          text=True,
                          timeout=120)


def test_one_branch_run_draws_its_four_quantities(tmp_path):
    run = write_run(
        tmp_path / 'mmae',
        [{f'minfo/{key}': 1.0 + 0.1 * step
          for key in ONE_BRANCH_KEYS} | {
              'loss': 1.0
          } for step in range(5)])
    out = tmp_path / 'figures'
    result = plot(run, '--out-dir', out, '--labels', 'M-MAE')
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ('matrix_info', *(f'minfo_{key}' for key in ONE_BRANCH_KEYS)):
        for ext in ('png', 'pdf'):
            assert (out / f'{name}.{ext}').stat().st_size > 1000
    assert not list(out.glob('figure*'))


def test_nothing_to_draw_exits_non_zero_with_a_message(tmp_path):
    run = write_run(tmp_path / 'mmae', [{'minfo/erank_cov': 3.0}])
    out = tmp_path / 'figures'
    result = plot(run, '--keys', 'mutual_info_cov', 'matrix_js_cov',
                  '--out-dir', out)
    assert result.returncode == 1
    assert ("nothing to draw: no run logged ['mutual_info_cov', "
            "'matrix_js_cov']; the runs logged ['erank_cov']") \
        in result.stderr
    assert not out.exists()
    assert 'Traceback' not in result.stderr


def load_plot_module():
    sys.path.insert(0, osp.dirname(SCRIPT))
    try:
        import plot_matrix_info
    finally:
        sys.path.pop(0)
    return plot_matrix_info


@pytest.mark.parametrize('batch,dim,mu', [(64, 16, 1.0), (8, 32, 3.0),
                                          (16, 16, 1.0)])
def test_tcr_reference_lines_bound_the_hooks_tcr(batch, dim, mu):
    """The floor is a collapsed batch's TCR, the ceiling a flat spectrum's,
    and a random batch lies between, as the hook computes TCR."""
    import torch

    from mmae_plugin.engine.hooks.matrix_info_hook import coding_rate
    lines = load_plot_module().reference_lines(dim, batch, mu)
    (floor, floor_label, _), (ceiling, _, _) = lines['tcr']
    mu_text = '' if mu == 1 else f'{mu:g}'
    assert floor_label.startswith(f'collapse floor: log(1 + {mu_text}B/d) = ')
    generator = torch.Generator().manual_seed(0)
    direction = torch.randn(1, dim, generator=generator, dtype=torch.float64)
    collapsed = direction.repeat(batch, 1) * torch.rand(
        batch, 1, generator=generator, dtype=torch.float64).add(0.5)
    assert coding_rate(collapsed, 'reference', mu).item() == pytest.approx(
        floor, rel=1e-12)
    rank = min(batch, dim)
    # B rows spread evenly over r orthonormal directions: flat spectrum.
    basis = torch.linalg.qr(
        torch.randn(dim, dim, generator=generator,
                    dtype=torch.float64))[0][:rank]
    flat = basis.repeat(batch // rank, 1)
    assert coding_rate(flat, 'reference', mu).item() == pytest.approx(
        ceiling, rel=1e-12)
    for seed in range(5):
        z = torch.randn(
            batch,
            dim,
            dtype=torch.float64,
            generator=torch.Generator().manual_seed(seed))
        assert floor < coding_rate(z, 'reference', mu).item() < ceiling
    for key in ('erank', 'rankme'):
        assert [value for value, _, _ in lines[key]] == [1.0, float(rank)]


def test_reference_lines_without_sizes_keep_only_the_size_free_bounds():
    lines = load_plot_module().reference_lines(None, 64)
    assert lines == {
        'erank': [(1.0, 'collapse: 1', ':')],
        'rankme': [(1.0, 'collapse: 1', ':')]
    }


def test_single_logged_point_is_marked_and_reference_lines_drawn(
        tmp_path, monkeypatch):
    """A run with one logged point shows it; the bounds are on the axes."""
    module = load_plot_module()
    run = write_run(tmp_path / 'mmae',
                    [{f'minfo/{key}': 2.0
                      for key in ONE_BRANCH_KEYS}])
    drawn = {}
    original = module.draw

    def recording_draw(ax, runs, key, smooth, references=None):
        original(ax, runs, key, smooth, references)
        drawn[key] = ax

    monkeypatch.setattr(module, 'draw', recording_draw)
    monkeypatch.setattr(sys, 'argv', [
        'plot_matrix_info.py',
        str(run), '--out-dir',
        str(tmp_path / 'out'), '--feature-dim', '128', '--batch-size', '256'
    ])
    module.main()
    import math
    tcr_lines = drawn['tcr_reference_mu1'].get_lines()
    curve = tcr_lines[0]
    assert list(curve.get_xdata()) == [1] and curve.get_marker() == 'o'
    levels = sorted(line.get_ydata()[0] for line in tcr_lines[1:])
    assert levels == pytest.approx(
        [math.log(1 + 256 / 128), 128 * math.log(1 + 256 / 128**2)])
    erank_levels = sorted(line.get_ydata()[0]
                          for line in drawn['erank_cov'].get_lines()[1:])
    assert erank_levels == [1.0, 128.0]
    # Every rank axis names its kernel.
    assert 'correlation kernel, centred' in drawn['erank_cov'].get_ylabel()
    assert 'raw features' in drawn['rankme_raw'].get_ylabel()
    legend = [
        text.get_text()
        for text in drawn['tcr_reference_mu1'].get_legend().get_texts()
    ]
    assert legend[1] == 'collapse floor: log(1 + B/d) = 1.099'


def test_tcr_lines_use_the_mu_the_key_names_and_old_keys_still_draw():
    module = load_plot_module()
    ranks = module.reference_lines(32, 8)
    lines = module.lines_for_key('tcr_reference_mu3', ranks, 32, 8)
    assert lines == module.reference_lines(32, 8, 3.0)['tcr']
    assert module.lines_for_key('tcr_paper_mu3', ranks, 32, 8) == []
    assert module.lines_for_key('tcr_reference_centered_mu1', ranks, 32,
                                8) == []
    assert 'Gram of unit rows, uncentred' in module.axis_label('erank_gram')
    assert 'order 2' in module.axis_label('entropy_cov_alpha2')
    assert module.axis_label('erank') == 'Effective rank'  # an older log
    assert sorted(['tcr_reference_mu1', 'erank_gram', 'mutual_info_cov'],
                  key=module.draw_order) == [
                      'mutual_info_cov', 'erank_gram', 'tcr_reference_mu1'
                  ]


def test_bad_sizes_are_refused_naming_the_option(tmp_path):
    run = write_run(tmp_path / 'mmae', [{'minfo/tcr_reference_mu1': 1.0}])
    result = plot(run, '--feature-dim', '0', '--out-dir', tmp_path / 'out')
    assert result.returncode == 2
    assert "argument --feature-dim: '0' is not allowed: expected an integer" \
        in result.stderr


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
IMBALANCE = osp.join(
    osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', 'theory',
    'run_imbalance.py')


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
        sys.executable, IMBALANCE, '--out-dir',
        str(out), '--seeds', '0', '--exponents', '0.5', '--num-patches', '16',
        '--steps', '4', '--eval-interval', '2', '--batch-size', '4',
        '--feature-dim', '4'
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
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
         ('cl_local_rises', 'CL, local areas:')),
            start=1):
        expected = 'rises' if claim[key] else 'does not rise'
        assert lines[head +
                     offset].split() == [*label.split(), *expected.split()]
    for name in ('attention_curves', 'phase_diagram'):
        assert (out / f'{name}.png').stat().st_size > 1000
