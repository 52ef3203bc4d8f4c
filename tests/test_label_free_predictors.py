"""studies.predictors and its command line
tools/analysis/label_free_predictors.py: rank correlations between
label-free statistics and accuracy, with a bootstrap over seeds."""
import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from studies import predictors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'tools', 'analysis', 'label_free_predictors.py')
STUDY = os.path.join(REPO, 'docs', 'study', 'runs.json')
SIAMESE_RUNS = os.path.join(REPO, 'docs', 'siamese', 'runs.json')


# --------------------------------------------------------------------------
# independent float64 references
# --------------------------------------------------------------------------
def average_ranks(values):
    """1-based ranks, ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman_reference(x, y):
    rx, ry = np.array(average_ranks(x)), np.array(average_ranks(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(rx @ ry / math.sqrt((rx @ rx) * (ry @ ry)))


def kendall_b_reference(x, y):
    concordant = discordant = ties_x = ties_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx == dy:
            concordant += 1
        else:
            discordant += 1
    return (concordant - discordant) / math.sqrt(
        (concordant + discordant + ties_x) *
        (concordant + discordant + ties_y))


@pytest.mark.parametrize('seed', range(4))
def test_rank_correlations_match_float64_references(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=9).astype(float)  # ties on purpose
    y = x + rng.integers(-3, 4, size=9)
    assert predictors.rank_correlation(x, y, 'spearman') == pytest.approx(
        spearman_reference(list(x), list(y)), abs=1e-12)
    assert predictors.rank_correlation(x, y, 'kendall') == pytest.approx(
        kendall_b_reference(list(x), list(y)), abs=1e-12)


def test_undefined_correlations_are_nan():
    assert math.isnan(
        predictors.rank_correlation([1, 1, 1], [1, 2, 3], 'spearman'))
    assert math.isnan(predictors.rank_correlation([1], [2], 'kendall'))
    with pytest.raises(ValueError, match='method'):
        predictors.rank_correlation([1, 2], [1, 2], 'pearson')


def test_bootstrap_equals_the_plain_percentile_bootstrap():
    """Computing each distinct resample once changes nothing."""
    effect = {0: 0.3, 1: -1.0, 2: 2.0, 3: 0.1, 4: 5.0}

    def estimate(draw):  # order-free, NaN when every draw is seed 1
        return math.nan if set(draw) == {1} else float(
            np.median([effect[s] for s in draw]))

    low, high, undefined = predictors.bootstrap(
        list(effect), estimate, 3000, np.random.default_rng(7))
    draws = np.random.default_rng(7).choice(
        np.array(list(effect)), size=(3000, 5))
    plain = np.array([estimate(list(d)) for d in draws])
    defined = plain[~np.isnan(plain)]
    assert (low, high) == tuple(np.percentile(defined, [2.5, 97.5]))
    assert undefined == int(np.isnan(plain).sum())


# --------------------------------------------------------------------------
# the three settings on records with a known answer
# --------------------------------------------------------------------------
def synthetic_rows():
    """Arms whose statistic ranks them like the accuracy, while within each
    arm the statistic falls as the accuracy rises over epochs."""
    rows = []
    levels = {'mae': 1.0, 'mmae_lam0.001_mu1': 2.0, 'mmae_lam0.01_mu1': 3.0}
    for seed in range(4):
        noise = 0.01 * seed
        rows.append({
            'arm': 'random_init',
            'seed': seed,
            'epoch': 0,
            'cls/linear_top1': 10.0 + noise,
            'cls/repr/erank_cov': 1.0 + noise
        })
        for arm, level in levels.items():
            for epoch in (5, 10, 20):
                rows.append({
                    'arm':
                    arm,
                    'seed':
                    seed,
                    'epoch':
                    epoch,
                    'cls/linear_top1':
                    50 + 10 * level + epoch + noise,
                    'cls/repr/erank_cov':
                    10 * level - epoch / 10 + noise
                })
    return rows


def test_settings_give_the_known_correlations():
    results = predictors.correlations(
        synthetic_rows(), statistics=['erank_cov'], epoch=20, resamples=500)
    by = {(r.setting, r.method): r
          for r in results if r.statistic == 'erank_cov'}
    settings = list(dict.fromkeys(r.setting for r in results))
    assert settings == [
        '(a) 4 arms at epoch 20', '(a) 3 trained arms at epoch 20',
        '(b) mae, epochs 5,10,20', '(b) mmae_lam0.001_mu1, epochs 5,10,20',
        '(b) mmae_lam0.01_mu1, epochs 5,10,20',
        '(c) lambda 0, 0.001, 0.01 at epoch 20, arm means',
        '(c) lambda 0, 0.001, 0.01 at epoch 20, every run'
    ]
    for method in predictors.METHODS:
        across = by[('(a) 4 arms at epoch 20', method)]
        assert (across.estimate, across.low, across.high) == (1.0, 1.0, 1.0)
        assert across.points == 4 and across.seeds == 4
        within = by[('(b) mae, epochs 5,10,20', method)]
        assert (within.estimate, within.low, within.high) == (-1.0, -1.0, -1.0)
        assert by[('(c) lambda 0, 0.001, 0.01 at epoch 20, every run',
                   method)].estimate == pytest.approx(1.0)


def test_epoch_control_correlates_the_epoch_number_in_setting_b():
    """Accuracy that peaks mid-training: the epoch number's correlation
    is that of (5, 10, 20) with the accuracies, computed independently."""
    rows = []
    accuracies = {5: 70.0, 10: 80.0, 20: 75.0}
    for seed in range(3):
        for epoch, accuracy in accuracies.items():
            rows.append({
                'arm': 'mae',
                'seed': seed,
                'epoch': epoch,
                'cls/linear_top1': accuracy + seed,
                'cls/repr/erank_cov': float(epoch)
            })
    results = predictors.correlations(
        rows, statistics=['erank_cov'], resamples=100)
    by = {(r.statistic, r.method): r.estimate for r in results}
    epochs, accs = list(accuracies), list(accuracies.values())
    control = predictors.EPOCH_CONTROL
    assert by[(control,
               'spearman')] == pytest.approx(spearman_reference(epochs, accs))
    assert by[(control,
               'kendall')] == pytest.approx(kendall_b_reference(epochs, accs))
    # erank_cov equals the epoch here, so it predicts exactly as well.
    assert by[('erank_cov', 'spearman')] == by[(control, 'spearman')]
    assert {r.setting
            for r in results
            if r.statistic == control} == {'(b) mae, epochs 5,10,20'}


def test_lambda_arms_are_found_by_name():
    assert predictors.lambda_arms(synthetic_rows(), 'mae') == {
        'mae': 0.0,
        'mmae_lam0.001_mu1': 0.001,
        'mmae_lam0.01_mu1': 0.01
    }


SIAMESE = ('simclr', 'byol', 'barlowtwins', 'spectral')


def siamese_rows():
    """Siamese arms and a random-init control, ``mean`` pooling, no lambda
    arms and no ``mae`` reference: the statistic ranks the trained arms
    like the accuracy, and rises with it over epochs."""
    rows = []
    for seed in range(3):
        noise = 0.01 * seed
        rows.append({
            'arm': 'random',
            'seed': seed,
            'epoch': 0,
            'mean/linear_top1': 10.0 + noise,
            'mean/repr/erank_cov': 1.0 + noise
        })
        for level, arm in enumerate(SIAMESE, 1):
            for epoch in (10, 20, 30):
                rows.append({
                    'arm': arm,
                    'seed': seed,
                    'epoch': epoch,
                    'mean/linear_top1': 40 + 5 * level + epoch + noise,
                    'mean/repr/erank_cov': 10 * level + epoch + noise
                })
    return rows


def test_a_comparison_without_lambda_arms_has_no_setting_c():
    rows = siamese_rows()
    assert predictors.fixed_epoch(rows, None, 'mae') == 30
    results = predictors.correlations(
        rows, pooling='mean', statistics=['erank_cov'], resamples=200)
    settings = list(dict.fromkeys(r.setting for r in results))
    assert settings == [
        '(a) 5 arms at epoch 30', '(a) 4 trained arms at epoch 30'
    ] + [f'(b) {arm}, epochs 10,20,30' for arm in SIAMESE]
    assert all(r.estimate == pytest.approx(1.0) for r in results)
    controls = [r for r in results if r.statistic == predictors.EPOCH_CONTROL]
    assert [r.setting for r in controls] == [
        f'(b) {arm}, epochs 10,20,30' for arm in SIAMESE for _ in 'ab'
    ]
    notes = predictors.inapplicable(rows, 30, 'mae')
    assert len(notes) == 1 and notes[0].startswith(
        '(c) across lambda: not applicable')


def test_command_line_reports_setting_c_as_not_applicable(tmp_path):
    path = tmp_path / 'runs.json'
    path.write_text(json.dumps({'format': 1, 'runs': siamese_rows()}))
    result = subprocess.run([
        sys.executable, SCRIPT,
        str(path), '--pooling', 'mean', '--statistics', 'erank_cov',
        '--resamples', '50'
    ],
                            capture_output=True,
                            text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '| (b) spectral, epochs 10,20,30 | 3 | erank_cov | +1.00' in \
        result.stdout
    assert '| (c)' not in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith(
        '(c) across lambda: not applicable')


# --------------------------------------------------------------------------
# reading records and the command line
# --------------------------------------------------------------------------
def test_records_are_read_from_a_file_a_folder_or_a_list(tmp_path):
    from_file = predictors.load_rows(STUDY)
    from_folder = predictors.load_rows(os.path.dirname(STUDY))
    assert len(from_file) == 85 and from_file == from_folder
    listed = tmp_path / 'list.json'
    listed.write_text(json.dumps(from_file))
    assert predictors.load_rows(str(listed)) == from_file
    wrong = tmp_path / 'wrong.json'
    wrong.write_text(json.dumps({'format': 99, 'runs': []}))
    with pytest.raises(ValueError, match='format 99'):
        predictors.load_rows(str(wrong))
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps([{'arm': 'mae'}]))
    with pytest.raises(ValueError, match='arm, seed and epoch'):
        predictors.load_rows(str(bad))


def test_command_line_on_the_study_gives_the_documented_estimates(tmp_path):
    out = tmp_path / 'numbers.json'
    result = subprocess.run([
        sys.executable, SCRIPT, STUDY, '--resamples', '200', '--json',
        str(out)
    ],
                            capture_output=True,
                            text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '| (a) 4 trained arms at epoch 20 | 4 | erank_cov | -1.00' in \
        result.stdout
    numbers = {(r['setting'], r['statistic'], r['method']): r
               for r in json.loads(out.read_text())}
    # docs/label_free_predictors.md quotes these point estimates.
    LAMBDAS_AT_20 = '(c) lambda 0, 0.00125, 0.01 at epoch 20, every run'
    expected = {
        ('(a) 5 arms at epoch 20', 'erank_cov', 'spearman'): 0.0,
        ('(a) 4 trained arms at epoch 20', 'rankme_raw', 'spearman'): -1.0,
        ('(b) supervised, epochs 5,10,15,20', 'erank_cov', 'kendall'): 1.0,
        ('(b) mae, epochs 5,10,15,20', 'erank_cov', 'spearman'): 0.92,
        ('(b) mae, epochs 5,10,15,20', predictors.EPOCH_CONTROL, 'spearman'):
        0.92,
        (LAMBDAS_AT_20, 'erank_cov', 'spearman'): -0.34,
    }
    for key, value in expected.items():
        assert numbers[key]['estimate'] == pytest.approx(value, abs=0.005), \
            key


def test_siamese_estimates_are_the_documented_ones():
    """docs/label_free_predictors.md quotes these from the Siamese
    campaign's runs.json."""
    rows = predictors.load_rows(SIAMESE_RUNS)
    results = predictors.correlations(
        rows, pooling='mean', reference='simclr', resamples=200)
    got = {(r.setting, r.statistic, r.method): r.estimate for r in results}
    BARLOW_EPOCHS = '(b) barlowtwins, epochs 1,2,5,10,20,30'
    expected = {
        ('(a) 4 trained arms at epoch 30', 'rankme_raw', 'spearman'): 0.80,
        ('(a) 4 trained arms at epoch 30', 'erank_gram', 'spearman'): 0.40,
        ('(b) byol, epochs 1,2,5,10,20,30', 'erank_cov', 'spearman'): -0.84,
        ('(b) barlowtwins, epochs 1,2,5,10,20,30', 'rankme_raw', 'spearman'):
        -0.20,
        (BARLOW_EPOCHS, predictors.EPOCH_CONTROL, 'spearman'): 0.94,
    }
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=0.005), key


def test_command_line_error_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, SCRIPT,
         str(tmp_path / 'missing.json')],
        capture_output=True,
        text=True,
        timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().startswith('label_free_predictors.py: '
                                            'error:')
