"""The evidence sweep end to end at its --quick budget (real runs)."""
import json
import os
import subprocess
import sys

import pytest
import yaml

#: The end-to-end quick sweep runs a dozen child processes with the real Runner
#: (several minutes on 2 cores): opt in with ``MMAE_TEST_LONG=1`` so the
#: default suite stays within its budget; the other tests here always run.
needs_evidence_opt_in = pytest.mark.skipif(
    os.environ.get('MMAE_TEST_LONG', '0') != '1',
    reason='end-to-end quick sweep: run with MMAE_TEST_LONG=1 '
    '(about 5 min on 2 cores)')

SCRIPT = 'tools/benchmarks/run_evidence.py'


def sweep(repo_root, out_dir, *extra):
    proc = subprocess.run(
        [sys.executable, SCRIPT, '--quick', '--out-dir', str(out_dir),
         '--report', str(out_dir / 'report' / 'results.md'), *extra],
        cwd=repo_root, capture_output=True, text=True,
        timeout=3600)  # generous: the machine may be shared
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope='module')
def quick_sweep(repo_root, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp('evidence')
    return out_dir, sweep(repo_root, out_dir)


@needs_evidence_opt_in
def test_quick_sweep_writes_report_plots_and_rows(quick_sweep):
    out_dir, stdout = quick_sweep
    assert '0 of 4 runs already done' in stdout
    with open(out_dir / 'report' / 'results' / 'runs.json') as f:
        rows = json.load(f)
    assert sorted((r['cell'], r['seed']) for r in rows) == [
        ('mae', 0), ('mae', 1), ('mmae_lam0.01_mu1', 0),
        ('mmae_lam0.01_mu1', 1)]
    for row in rows:
        assert 0 <= row['knn/top1'] <= 100 and 0 <= row['linear/top1'] <= 100
        assert 1 <= row['repr/erank_gram'] <= 128
        # Relative to the out dir, and pointing at the run's checkpoint.
        assert not os.path.isabs(row['checkpoint'])
        assert (out_dir / row['checkpoint']).is_file()
    report = (out_dir / 'report' / 'results.md').read_text()
    assert '| M-MAE λ=0.01 μ=1 | 2 |' in report
    assert 'Summary in plain words' in report
    assert "The paper's numbers" in report
    # Two seeds: every paired difference has an interval and says its n.
    assert '(n=2)' in report and '[' in report
    for plot in ('accuracy_vs_lambda', 'accuracy_vs_mu', 'accuracy_vs_erank'):
        assert (out_dir / 'report' / 'results' / f'{plot}.png').stat().st_size
    # The full probe config ran on the seed-0 encoders of MAE and M-MAE.
    assert report.count('not run') == 0


@needs_evidence_opt_in
def test_quick_sweep_skips_finished_runs_and_reevaluates_lost_results(
        repo_root, quick_sweep):
    out_dir, _ = quick_sweep
    lost = out_dir / 'mae' / 'seed1' / 'results.json'
    before = json.loads(lost.read_text())
    lost.unlink()
    stdout = sweep(repo_root, out_dir, '--no-probe-check')
    assert '3 of 4 runs already done' in stdout
    after = json.loads(lost.read_text())
    # The checkpoint was kept: only the evaluation ran, with the same result.
    assert after['pretrain_s'] < 5
    assert after['knn/top1'] == before['knn/top1']
    assert after['linear/top1'] == pytest.approx(before['linear/top1'])


@needs_evidence_opt_in
def test_quick_export_writes_zoo_checkpoints_and_metafile(repo_root,
                                                          quick_sweep):
    out_dir, _ = quick_sweep
    zoo = out_dir / 'zoo'
    sweep(repo_root, out_dir, '--export-zoo', '--zoo-dir', str(zoo),
          '--zoo-metafile', str(zoo / 'metafile.yml'))
    models = yaml.safe_load((zoo / 'metafile.yml').read_text())['Models']
    names = {m['Name'] for m in models}
    assert {'mae_vit-tiny-p4_fmnist', 'mmae_vit-tiny-p4_fmnist_knn',
            'mmae_vit-tiny-p4_fmnist_linear'} <= names
    for model in models:
        assert model['Weights'].startswith('mmae-zoo://fmnist/')
        assert os.path.isfile(zoo / model['Weights'].split('/')[-1])


@needs_evidence_opt_in
def test_default_report_goes_under_out_dir_not_docs(repo_root, quick_sweep):
    out_dir, _ = quick_sweep
    docs = os.path.join(repo_root, 'docs')
    before = {name: os.stat(os.path.join(docs, name)).st_mtime_ns
              for name in os.listdir(docs)}
    proc = subprocess.run(
        [sys.executable, SCRIPT, '--quick', '--out-dir', str(out_dir),
         '--report-only'], cwd=repo_root, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out_dir / 'report' / 'results.md').is_file()
    assert (out_dir / 'report' / 'results' / 'runs.json').is_file()
    after = {name: os.stat(os.path.join(docs, name)).st_mtime_ns
             for name in os.listdir(docs)}
    assert after == before


@needs_evidence_opt_in
def test_report_evidence_cli_rebuilds_the_same_report(repo_root, quick_sweep):
    out_dir, _ = quick_sweep
    report = out_dir / 'cli' / 'results.md'
    proc = subprocess.run(
        [sys.executable, 'tools/benchmarks/report_evidence.py', '--quick',
         '--out-dir', str(out_dir), '--report', str(report)],
        cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '| M-MAE λ=0.01 μ=1 | 2 |' in report.read_text()


def test_tools_scripts_are_thin_and_do_not_import_each_other(repo_root):
    scripts = ('run_evidence', 'report_evidence', 'quickstart_seeds',
               'run_study')
    for name in scripts:
        with open(os.path.join(repo_root, 'tools', 'benchmarks',
                               f'{name}.py')) as f:
            text = f.read()
        for other in scripts:
            assert f'import {other}' not in text
            assert f'from {other} ' not in text
        assert 'mmae_plugin.evidence' in text


def test_shipped_results_page_is_rebuilt_from_its_runs_json(repo_root,
                                                           tmp_path):
    """docs/results.md says ``--report-only`` rebuilds it from
    ``results/runs.json``: with the sweep's out dir gone (it is not kept),
    the rebuild from a copy of that file gives the same page."""
    import shutil
    docs = os.path.join(repo_root, 'docs')
    (tmp_path / 'results').mkdir()
    shutil.copy(os.path.join(docs, 'results', 'runs.json'),
                tmp_path / 'results' / 'runs.json')
    proc = subprocess.run(
        [sys.executable, SCRIPT, '--report-only', '--out-dir',
         str(tmp_path / 'gone'), '--report', str(tmp_path / 'results.md')],
        cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(docs, 'results.md')) as f:
        shipped = f.read().splitlines()
    rebuilt = (tmp_path / 'results.md').read_text().splitlines()
    # Line 3 names the command and the date; every table and number after it
    # must be the same.
    assert len(rebuilt) == len(shipped) and rebuilt[3:] == shipped[3:]
    assert 'not run' not in '\n'.join(rebuilt)


def test_rows_of_older_sweeps_are_read_in_the_current_vocabulary():
    from mmae_plugin.evidence.sweep_report import LEGACY_KEYS, upgrade_rows
    old = {'cell': 'mae', 'seed': 0, 'repr/erank': 1.01, 'repr/rankme': 1.8,
           'repr/entropy': 0.01, 'repr/tcr': 4.4, 'knn/top1': 70.0,
           'checkpoint': '/somewhere/evidence/mae/seed0/epoch_3.pth'}
    (row, ) = upgrade_rows([old], '/somewhere/evidence')
    assert row == {'cell': 'mae', 'seed': 0, 'repr/erank_gram': 1.01,
                   'repr/rankme_raw': 1.8, 'repr/entropy_gram': 0.01,
                   'repr/tcr_reference_mu1': 4.4, 'knn/top1': 70.0,
                   'checkpoint': 'mae/seed0/epoch_3.pth'}
    # Every new name is a key the statistics compute today.
    import torch
    from mmae_plugin.evaluation.statistics import representation_statistics
    keys = representation_statistics(torch.randn(16, 4, dtype=torch.float64))
    assert {new.split('/', 1)[1] for new in LEGACY_KEYS.values()} <= set(keys)
