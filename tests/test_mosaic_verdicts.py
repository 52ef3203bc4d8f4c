"""The mosaic study's verdicts follow the criteria of docs/mosaic.md, on
synthetic records whose answer is known (every branch of both claims)."""
import pathlib
import shutil
import subprocess
import sys

import pytest

from studies import mosaic_verdicts as mv

SEEDS = (0, 1, 2)
JITTER = (0.0, 0.3, -0.2)  # per-seed spread, so every interval has ends


def record(arm, seed, **metrics):
    """An evaluation record; each arm and metric gets its own per-seed
    jitter, so every paired difference has a spread."""
    fields = {
        f'cls/{key}':
        value + JITTER[seed] * 0.1 * ((len(arm) + len(key)) % 4 + 1)
        for key, value in metrics.items()
    }
    return dict(
        arm=arm, seed=seed, epoch=0 if arm == 'random_init' else 10, **fields)


def records_of(arms):
    """Every arm's record per seed; a tuple value gives each seed its
    own."""
    return [
        record(
            arm, seed, **{
                k: v[seed] if isinstance(v, tuple) else v
                for k, v in metrics.items()
            }) for arm, metrics in arms.items() for seed in SEEDS
    ]


def values_of(arms):
    return mv.final_values(dict(runs=records_of(arms)))


def pca_curve(top, start=32, rise=10.0):
    """MAE's top-k probe: flat up to k=start, then rising by ``rise``."""
    curve = {f'pca{k}_cell_linear_top1': top - rise for k in (2, 4, 8, 16, 32)}
    curve.update(
        pca64_cell_linear_top1=top - rise / 2, pca128_cell_linear_top1=top)
    return curve


def tcr_arms(
        gain=(3.0, 3.2, 2.9),
        gain_high=(3.5, 3.6, 3.4),
        umae=1.0,
        whitened=70.0,
        rise=10.0,
        rank_gain=15.0):
    mae = dict(cell_linear_top1=70.0, **{'repr/erank_cov': 20.0})
    mae.update(pca_curve(whitened, rise=rise))

    def shifted(delta):
        return {
            'cell_linear_top1':
            tuple(70.0 + d
                  for d in delta) if isinstance(delta, tuple) else 70.0 +
            delta,
            'repr/erank_cov':
            20.0 + rank_gain
        }

    return {
        'mae': mae,
        'umae': shifted(umae),
        'mmae_lam0.01': shifted(gain),
        'mmae_lam0.05': shifted(gain_high),
    }


def test_a_large_gain_beyond_the_whitened_mae_is_support():
    verdict = mv.tcr_verdict(values_of(tcr_arms()))
    assert verdict.outcome == 'support', verdict
    assert verdict.findings['k* (first probed k >= MAE erank)'] == '32'


def test_a_gain_that_whitening_gives_too_is_a_reparametrisation():
    verdict = mv.tcr_verdict(values_of(tcr_arms(whitened=75.0)))
    assert verdict.outcome == 'support, as a reparametrisation'


def test_no_gain_at_either_lambda_with_the_mechanism_is_refutation():
    arms = tcr_arms(gain=(0.1, -0.2, 0.3), gain_high=(-1.0, -1.5, -0.8))
    assert mv.tcr_verdict(values_of(arms)).outcome == 'refutation'


def test_a_gain_below_u_mae_s_is_not_support():
    verdict = mv.tcr_verdict(values_of(tcr_arms(umae=4.0)))
    assert verdict.outcome == 'undecided'
    assert 'neither' in verdict.reason


def test_a_flat_top_k_curve_is_not_informative():
    verdict = mv.tcr_verdict(values_of(tcr_arms(rise=0.0)))
    assert verdict.outcome == 'undecided'
    assert verdict.reason.startswith('not informative')


def test_no_rank_gain_is_not_informative():
    arms = tcr_arms(
        rank_gain=0.0, gain=(0.1, -0.2, 0.3), gain_high=(0.0, 0.1, -0.1))
    assert mv.tcr_verdict(values_of(arms)).reason.startswith('not informative')


def local_global_arms(mae_local=60.0,
                      simclr_local=35.0,
                      mae_global=80.0,
                      simclr_global=78.0,
                      supervised_local=90.0):

    def arm(local, global_):
        return dict(cell_linear_top1=local, presence_balanced_top1=global_)

    return {
        'random_init': arm(25.0, 70.0),
        'supervised': arm(supervised_local, 95.0),
        'mae': arm(mae_local, mae_global),
        'simclr': arm(simclr_local, simclr_global),
    }


def test_mae_ahead_locally_more_than_globally_is_support():
    verdict = mv.local_global_verdict(values_of(local_global_arms()))
    assert verdict.outcome == 'support', verdict


def test_simclr_ahead_locally_is_refutation():
    arms = local_global_arms(mae_local=40.0, simclr_local=55.0)
    assert mv.local_global_verdict(values_of(arms)).outcome == 'refutation'


def test_a_lead_as_large_globally_is_refutation():
    # MAE ahead by 0.385 of the range locally, by 0.64 globally.
    arms = local_global_arms(mae_global=92.0, simclr_global=76.0)
    assert mv.local_global_verdict(values_of(arms)).outcome == 'refutation'


def test_an_undefined_normalisation_is_undecided():
    arms = local_global_arms(supervised_local=25.5)
    verdict = mv.local_global_verdict(values_of(arms))
    assert verdict.outcome == 'undecided' and 'undefined' in verdict.reason


@pytest.mark.parametrize('erank,expected', [(20.0, 32), (3.0, 4), (200, None)])
def test_k_star_is_the_first_probed_k_at_or_above_mae_s_rank(erank, expected):
    values = values_of({'mae': {'repr/erank_cov': erank}})
    assert mv.rank_threshold(values, 'cls') == expected


def test_the_page_keeps_its_criteria_and_rewrites_only_the_results(tmp_path):
    from studies import mosaic_report
    arms = tcr_arms()
    for arm, metrics in local_global_arms().items():
        arms.setdefault(arm, {}).update(metrics)
    arms['mae'].update(cell_linear_top1=70.0)  # as tcr_arms has it
    runs = records_of(arms)
    spec = dict(arms=[dict(name=arm, label=arm.upper()) for arm in arms])
    page = tmp_path / 'mosaic.md'
    criteria = '# Mosaics\n\n## Criteria (fixed before the runs)\n\ntext\n'
    page.write_text(criteria)
    for _ in range(2):  # rewriting replaces, never duplicates
        mosaic_report.write_page(str(page), dict(comparison=spec, runs=runs))
    text = page.read_text()
    assert text.startswith(criteria)
    assert text.count(mosaic_report.MARKER) == 1
    assert text.count('## Results') == 1
    assert '**Seed 001 (TCR helps where many directions are needed): ' \
        'support.**' in text
    assert '| MMAE_LAM0.01 | 3 |' in text


def test_shipped_page_is_rebuilt_from_its_runs_json_and_cost(
        repo_root, tmp_path):
    """docs/mosaic.md's results are the report of docs/mosaic/runs.json and
    cost.json: rebuilt from them, the page is the same byte for byte."""
    docs = pathlib.Path(repo_root) / 'docs'
    page = tmp_path / 'mosaic.md'
    shutil.copy(docs / 'mosaic.md', page)
    proc = subprocess.run([
        sys.executable, 'tools/analysis/mosaic_report.py', '--runs',
        'docs/mosaic/runs.json', '--cost', 'docs/mosaic/cost.json', '--page',
        str(page)
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert page.read_text() == (docs / 'mosaic.md').read_text()
