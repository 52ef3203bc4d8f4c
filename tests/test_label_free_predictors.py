"""tools/analysis/label_free_predictors.py: rank correlations between
label-free statistics and accuracy, with a bootstrap over seeds."""
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'tools', 'analysis', 'label_free_predictors.py')
STUDY = os.path.join(REPO, 'docs', 'study', 'runs.json')


def load_tool():
    spec = importlib.util.spec_from_file_location('label_free_predictors',
                                                  SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()


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
        (concordant + discordant + ties_x) * (concordant + discordant +
                                              ties_y))


@pytest.mark.parametrize('seed', range(4))
def test_rank_correlations_match_float64_references(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=9).astype(float)  # ties on purpose
    y = x + rng.integers(-3, 4, size=9)
    assert tool.rank_correlation(x, y, 'spearman') == pytest.approx(
        spearman_reference(list(x), list(y)), abs=1e-12)
    assert tool.rank_correlation(x, y, 'kendall') == pytest.approx(
        kendall_b_reference(list(x), list(y)), abs=1e-12)


def test_undefined_correlations_are_nan():
    assert math.isnan(tool.rank_correlation([1, 1, 1], [1, 2, 3],
                                            'spearman'))
    assert math.isnan(tool.rank_correlation([1], [2], 'kendall'))
    with pytest.raises(ValueError, match='method'):
        tool.rank_correlation([1, 2], [1, 2], 'pearson')


def test_bootstrap_equals_the_plain_percentile_bootstrap():
    """Computing each distinct resample once changes nothing."""
    effect = {0: 0.3, 1: -1.0, 2: 2.0, 3: 0.1, 4: 5.0}

    def estimate(draw):  # order-free, NaN when every draw is seed 1
        return math.nan if set(draw) == {1} else float(np.median(
            [effect[s] for s in draw]))

    low, high, undefined = tool.bootstrap(list(effect), estimate, 3000,
                                          np.random.default_rng(7))
    draws = np.random.default_rng(7).choice(np.array(list(effect)),
                                            size=(3000, 5))
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
        rows.append({'arm': 'random_init', 'seed': seed, 'epoch': 0,
                     'cls/linear_top1': 10.0 + noise,
                     'cls/repr/erank_cov': 1.0 + noise})
        for arm, level in levels.items():
            for epoch in (5, 10, 20):
                rows.append({
                    'arm': arm, 'seed': seed, 'epoch': epoch,
                    'cls/linear_top1': 50 + 10 * level + epoch + noise,
                    'cls/repr/erank_cov': 10 * level - epoch / 10 + noise})
    return rows


def test_settings_give_the_known_correlations():
    results = tool.correlations(synthetic_rows(), statistics=['erank_cov'],
                                epoch=20, resamples=500)
    by = {(r.setting, r.method): r for r in results}
    settings = list(dict.fromkeys(r.setting for r in results))
    assert settings == [
        '(a) 4 arms at epoch 20', '(a) 3 trained arms at epoch 20',
        '(b) mae, epochs 5,10,20', '(b) mmae_lam0.001_mu1, epochs 5,10,20',
        '(b) mmae_lam0.01_mu1, epochs 5,10,20',
        '(c) lambda 0, 0.001, 0.01 at epoch 20, arm means',
        '(c) lambda 0, 0.001, 0.01 at epoch 20, every run']
    for method in tool.METHODS:
        across = by[('(a) 4 arms at epoch 20', method)]
        assert (across.estimate, across.low, across.high) == (1.0, 1.0, 1.0)
        assert across.points == 4 and across.seeds == 4
        within = by[('(b) mae, epochs 5,10,20', method)]
        assert (within.estimate, within.low, within.high) == (-1.0, -1.0,
                                                              -1.0)
        assert by[('(c) lambda 0, 0.001, 0.01 at epoch 20, every run',
                   method)].estimate == pytest.approx(1.0)


def test_lambda_arms_are_found_by_name():
    assert tool.lambda_arms(synthetic_rows(), 'mae') == {
        'mae': 0.0, 'mmae_lam0.001_mu1': 0.001, 'mmae_lam0.01_mu1': 0.01}


# --------------------------------------------------------------------------
# reading records and the command line
# --------------------------------------------------------------------------
def test_records_are_read_from_a_file_a_folder_or_a_list(tmp_path):
    from_file = tool.load_rows(STUDY)
    from_folder = tool.load_rows(os.path.dirname(STUDY))
    assert len(from_file) == 85 and from_file == from_folder
    listed = tmp_path / 'list.json'
    listed.write_text(json.dumps(from_file))
    assert tool.load_rows(str(listed)) == from_file
    wrong = tmp_path / 'wrong.json'
    wrong.write_text(json.dumps({'format': 99, 'runs': []}))
    with pytest.raises(ValueError, match='format 99'):
        tool.load_rows(str(wrong))
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps([{'arm': 'mae'}]))
    with pytest.raises(ValueError, match='arm, seed and epoch'):
        tool.load_rows(str(bad))


def test_command_line_on_the_study_gives_the_documented_estimates(
        tmp_path):
    out = tmp_path / 'numbers.json'
    result = subprocess.run(
        [sys.executable, SCRIPT, STUDY, '--resamples', '200', '--json',
         str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '| (a) 4 trained arms at epoch 20 | 4 | erank_cov | -1.00' in \
        result.stdout
    numbers = {(r['setting'], r['statistic'], r['method']): r
               for r in json.loads(out.read_text())}
    # docs/label_free_predictors.md quotes these point estimates.
    expected = {
        ('(a) 5 arms at epoch 20', 'erank_cov', 'spearman'): 0.0,
        ('(a) 4 trained arms at epoch 20', 'rankme_raw', 'spearman'): -1.0,
        ('(b) supervised, epochs 5,10,15,20', 'erank_cov', 'kendall'): 1.0,
        ('(b) mae, epochs 5,10,15,20', 'erank_cov', 'spearman'): 0.92,
        ('(c) lambda 0, 0.00125, 0.01 at epoch 20, every run', 'erank_cov',
         'spearman'): -0.34,
    }
    for key, value in expected.items():
        assert numbers[key]['estimate'] == pytest.approx(value, abs=0.005), \
            key


def test_command_line_error_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT,
                             str(tmp_path / 'missing.json')],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().startswith('label_free_predictors.py: '
                                            'error:')
