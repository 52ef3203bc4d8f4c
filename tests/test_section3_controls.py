"""The section-3 statements under every reading, and the controls page.

Equivalence ("meet" within a margin) is checked against scipy's one-sided
t-tests (two one-sided tests), the theorem statements and the verdict
matrix on curves whose answer is known by construction, and the controls
page and the report's correlations on the committed Siamese campaign.
"""
import dataclasses
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from mmae_compare.intervals import welch_interval
from mmae_compare.records import read_runs
from mmae_compare.report import correlation_line
from studies import information_flow as flow
from studies import section3_controls as s3

ROLES = {
    'simclr': 'simclr',
    'byol': 'byol',
    'barlowtwins': 'bt',
    'spectral': 'spec'
}
LABELS = {
    'simclr': 'SimCLR',
    'byol': 'BYOL',
    'bt': 'Barlow Twins',
    'spec': 'Spectral'
}
NOISE = np.random.default_rng(1).normal(0, 0.01, (5, 4, 31))


def synthetic(je,
              mi=lambda a, e: 1 + e / 10,
              prefixes=('minfo_heldout', ),
              first_epoch=0):
    """Curves of every role: ``quantity(arm_index, epoch)`` plus noise."""
    curves = {}
    for a, arm in enumerate(ROLES.values()):
        for seed in range(5):
            run = {}
            for prefix in prefixes:
                start = first_epoch if prefix == 'minfo_heldout' else 1
                for name, fn in (('mutual_info', mi), ('joint_entropy', je),
                                 ('matrix_js', lambda a, e: 0.02 + e / 1e3),
                                 ('spectrum_js', lambda a, e: 1e-4),
                                 ('entropy_1', lambda a, e: 3.0)):
                    run[flow.quantity_key(prefix, name)] = {
                        e: fn(a, e) + NOISE[seed, a, e]
                        for e in range(start, 31)
                    }
            curves[(arm, seed)] = run
    return curves


def tost(values, margin):
    """Equivalence by scipy: both one-sided 5 % tests reject."""
    low = stats.ttest_1samp(values, -margin, alternative='greater').pvalue
    high = stats.ttest_1samp(values, margin, alternative='less').pvalue
    return max(low, high) < 0.05


def beyond(values, margin):
    """The 95 % interval wholly outside (-margin, margin), by scipy."""
    return (
        stats.ttest_1samp(values, margin, alternative='greater').pvalue < 0.025
        or
        stats.ttest_1samp(values, -margin, alternative='less').pvalue < 0.025)


def test_equivalence_is_two_one_sided_tests():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        values = list(
            rng.normal(rng.uniform(-0.5, 0.5), rng.uniform(0.01, 0.3), 5))
        iv, verdict = flow.equivalence_verdict(values, 0.2)
        expected = (
            flow.HOLDS if tost(values, 0.2) else
            flow.FAILS if beyond(values, 0.2) else flow.UNDECIDED)
        assert verdict == expected, (values, iv)
        low, high = stats.t.interval(0.90, 4, np.mean(values),
                                     stats.sem(values))
        assert (iv.low, iv.high) == pytest.approx((low, high), rel=1e-12)
        seen.add(verdict)
    assert seen == {flow.HOLDS, flow.FAILS, flow.UNDECIDED}
    assert flow.equivalence_verdict([0.01], 0.2)[1] == flow.UNDECIDED
    assert flow.equivalence_verdict([], 0.2) == (None, flow.UNDECIDED)


def test_the_critical_margin_is_where_equivalence_starts_to_hold():
    """The critical margin is max(|low|, |high|) of scipy's 90 % t
    interval, and equivalence holds exactly for the margins above it."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        values = list(
            rng.normal(
                rng.uniform(-0.5, 0.5), rng.uniform(0.01, 0.3),
                rng.integers(2, 7)))
        low, high = stats.t.interval(0.90,
                                     len(values) - 1, np.mean(values),
                                     stats.sem(values))
        critical = flow.gap_critical(values, math.log(128))
        assert critical.nats == pytest.approx(
            max(abs(low), abs(high)), rel=1e-12)
        assert critical.share == pytest.approx(
            critical.nats / math.log(128), rel=1e-12)
        for margin in (critical.nats * (1 - 1e-9), critical.nats * (1 + 1e-9),
                       rng.uniform(0, 1)):
            holds = flow.equivalence_verdict(values, margin)[1] == flow.HOLDS
            assert holds == (margin > critical.nats) == tost(values, margin)
    assert flow.critical_margin(None) is None
    assert flow.gap_critical([0.1], math.log(128)) is None
    assert flow.gap_critical([0.1, 0.2], None) is None


def test_every_meet_prints_its_critical_margin():
    """SimCLR's joint entropy 0.1 nats above Barlow Twins': the end gap's
    finding carries its critical margin under both readings of "meet",
    and the matrix prints its share of ln d under equivalence only."""
    curves = synthetic(je=lambda a, e: 4 + e / 20 + 0.1 * (a == 0))
    ceiling = math.log(128)
    gap = list(
        flow.gap(curves, 'simclr', 'bt', 'minfo_heldout/joint_entropy_cov',
                 30).values())
    expected = flow.gap_critical(gap, ceiling)
    assert 0.09 / ceiling < expected.share < 0.12 / ceiling
    for margin in (None, flow.MEET_MARGIN_FRACTION * ceiling):
        statements = flow.evaluate_statements(
            curves,
            ROLES,
            LABELS,
            1,
            15,
            30,
            meet_margin=margin,
            ceiling=ceiling)
        meet, = [f for f in statements[2].findings if f.critical]
        assert statements[2].critical == meet.critical == expected
        assert meet.verdict_text().endswith(
            f'; critical margin {expected.nats:.3f} nats = '
            f'{expected.share:.3f} ln d')
        assert [s.number for s in statements if s.critical] == ['2', '3']
    assert not any(
        s.critical
        for s in flow.evaluate_statements(curves, ROLES, LABELS, 1, 15, 30))
    matrix = s3.verdict_matrix(curves, ROLES, LABELS, 15, 30, ceiling)
    table = s3.matrix_table(matrix, 15)
    row = next(
        r for r in table if r.startswith('| held-out, from epoch 1, '
                                         'equivalence |'))
    assert f'| holds ({expected.share:.3f}) |' in row
    row = next(
        r for r in table if r.startswith('| held-out, from epoch 1, '
                                         'difference |'))
    assert '(' not in row.split('|', 2)[2]


def test_a_small_end_gap_meets_as_equivalence_but_not_as_difference():
    # SimCLR 0.1 nats above the others all along: apart (difference), yet
    # within 5 % of ln 128 (equivalence).
    curves = synthetic(je=lambda a, e: 4 + e / 20 + 0.1 * (a == 0))
    by_difference = flow.evaluate_statements(curves, ROLES, LABELS, 1, 15, 30)
    margin = flow.MEET_MARGIN_FRACTION * math.log(128)
    by_equivalence = flow.evaluate_statements(
        curves, ROLES, LABELS, 1, 15, 30, meet_margin=margin)
    assert by_difference[2].number == by_equivalence[2].number == '3'
    assert by_difference[2].verdict == flow.FAILS
    assert by_equivalence[2].verdict == flow.HOLDS
    # Half a nat is beyond the margin: the gap fails either way.
    curves = synthetic(je=lambda a, e: 4 + e / 20 + 0.5 * (a == 0))
    assert flow.evaluate_statements(
        curves, ROLES, LABELS, 1, 15, 30,
        meet_margin=margin)[2].verdict == flow.FAILS


def test_theorems_are_the_seekers_rise_and_report_the_ceiling_share():
    # BT (a=2) and spectral (a=3) gain joint entropy, the others lose it.
    curves = synthetic(je=lambda a, e: 3 + (1 if a >= 2 else -1) * e / 30)
    t1, t2 = flow.theorem_statements(
        curves, ROLES, LABELS, 0, 30, ceiling=math.log(128))
    assert (t1.number, t1.verdict) == ('T1', flow.HOLDS)
    assert (t2.number, t2.verdict) == ('T2', flow.HOLDS)
    share = [f for f in t2.findings if 'ln d' in f.subject]
    assert [f.subject.split(':')[0]
            for f in share] == ['Barlow Twins', 'Spectral']
    bt = [
        curves[('bt', s)]['minfo_heldout/joint_entropy_cov'][30]
        for s in range(5)
    ]
    assert share[0].interval.mean == pytest.approx(
        np.mean(bt) / math.log(128), rel=1e-12)
    curves = synthetic(je=lambda a, e: 4 - e / 30)
    assert flow.theorem_statements(curves, ROLES, LABELS, 0,
                                   30)[1].verdict == flow.FAILS


def test_the_matrix_marks_a_baseline_that_was_never_logged():
    curves = synthetic(
        je=lambda a, e: 4 + e / 20, prefixes=('minfo_heldout', 'minfo'))
    matrix = s3.verdict_matrix(curves, ROLES, LABELS, 15, 30, math.log(128))
    assert len(matrix) == 12
    unlogged = [r for r, st in matrix.items() if not st]
    assert {(r.prefix, r.first) for r in unlogged} == {('minfo', 0)}
    held = matrix[s3.Reading('minfo_heldout', 0, False)]
    assert [s.number
            for s in held] == ['1', '2', '3', '4', '5', 'J', 'T1', 'T2']
    table = s3.matrix_table(matrix, 15)
    assert '| training, from init (0), difference | ' + ' | '.join(
        ['–'] * 8) + ' |' in table
    summary = s3.holding_summary(matrix, 15)
    assert summary[0].startswith('- **1** holds under 10 of 10 readings')


def test_roles_are_the_arms_named_after_them():
    assert s3.roles_by_prefix(['simclr90', 'barlowtwins90']) == {
        'simclr': 'simclr90',
        'barlowtwins': 'barlowtwins90'
    }
    with pytest.raises(ValueError, match='all start with role'):
        s3.roles_by_prefix(['simclr', 'simclr2', 'barlowtwins'])
    with pytest.raises(ValueError, match="'barlowtwins'"):
        s3.roles_by_prefix(['simclr', 'byol'])


def test_the_controls_page_is_written_from_runs_json(repo_root, tmp_path):
    """The committed campaign as base and, under another width, as a
    control: the page, its matrices and the changes the wider margin
    makes, through the command line."""
    for name in ('base', 'wide'):
        (tmp_path / name).mkdir()
        shutil.copy(f'{repo_root}/docs/siamese/runs.json', tmp_path / name)
    report = tmp_path / 'controls.md'
    proc = subprocess.run([
        sys.executable, 'tools/analysis/section3_controls.py', '--control',
        f'base={tmp_path / "base"}:128:projector 128', '--control',
        f'wide={tmp_path / "wide"}:{10**12}:a wide ceiling', '--report',
        str(report)
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = report.read_text()
    assert page.count('| reading | 1 | 2 | 3 | 4 | 5 | J | T1 | T2 |') == 2
    # ln 1e12 makes the margin 1.38 nats: the MI gap of 1.18 [1.10, 1.27]
    # meets as equivalence, so statement 2 holds there.
    assert '- **base** ' not in page
    assert ('  - reversed: 2 under "held-out, from epoch 1, equivalence" '
            '(fails -> holds)') in page.splitlines()
    for figure in ('gaps_over_training.png', 'curves_by_control.png'):
        assert (tmp_path / 'siamese_controls' / 'figures' /
                figure).stat().st_size > 10_000
        assert f'(siamese_controls/figures/{figure})' in page
    bad = subprocess.run([
        sys.executable, 'tools/analysis/section3_controls.py', '--control',
        'base=x:wide:t', '--report',
        str(report)
    ],
                         cwd=repo_root,
                         capture_output=True,
                         text=True,
                         timeout=600)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith(
        'section3_controls.py: error: a control is NAME=DIR:D:TITLE')


def test_rank_correlations_leave_random_init_out(repo_root):
    spec, rows = read_runs(f'{repo_root}/docs/siamese')
    key_x, key_y = 'mean/repr/erank_gram', 'mean/linear_top1'
    trained = [(r[key_x], r[key_y]) for r in rows if r['arm'] != 'random'
               and r['epoch'] == 30 and key_x in r and key_y in r]
    everything = trained + [(r[key_x], r[key_y]) for r in rows
                            if r['arm'] == 'random' and key_x in r]
    r_trained = stats.pearsonr(*np.array(trained).T)
    r_all = stats.pearsonr(*np.array(everything).T)
    line = correlation_line(rows, spec, 30, key_x, key_y, 'x with y')
    assert line == (f'* Pearson correlation of x with y over the '
                    f'{len(trained)} trained runs at epoch 30: '
                    f'{r_trained.statistic:+.2f} (p = '
                    f'{r_trained.pvalue:.2g}); with the '
                    f'{len(everything) - len(trained)} random-init runs as '
                    f'well: {r_all.statistic:+.2f}.')
    assert len(trained) == 20 and abs(r_trained.statistic) < 0.5


def test_shipped_controls_page_is_rebuilt_from_runs_json(repo_root, tmp_path):
    """docs/siamese_controls.md is the page of the committed runs.json
    files: its own command, run on copies of them and of the notes, gives
    every line after the one naming the command and date."""
    import re
    import shlex
    shipped = open(f'{repo_root}/docs/siamese_controls.md').read()
    command = shlex.split(
        re.search(r'Generated by `([^`]*)`', shipped).group(1))
    assert command[:2] == ['python', 'tools/analysis/section3_controls.py']
    args = []
    for flag, value in zip(command[2::2], command[3::2]):
        if flag == '--control':
            name, _, rest = value.partition('=')
            folder, width, title = rest.split(':', 2)
            copy = tmp_path / folder
            copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(f'{repo_root}/{folder}/runs.json', copy)
            value = f'{name}={copy}:{width}:{title}'
        elif flag in ('--notes', '--report'):
            (tmp_path / value).parent.mkdir(parents=True, exist_ok=True)
            if flag == '--notes':
                shutil.copy(f'{repo_root}/{value}', tmp_path / value)
            value = str(tmp_path / value)
        args += [flag, value]
    proc = subprocess.run([sys.executable, *command[1:2], *args],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = (tmp_path / 'docs' / 'siamese_controls.md').read_text()
    assert rebuilt.splitlines()[3:] == shipped.splitlines()[3:]


def test_welch_interval_is_the_welch_satterthwaite_interval():
    rng = np.random.default_rng(2)
    for _ in range(50):
        a = rng.normal(0.3, rng.uniform(0.01, 0.5), rng.integers(2, 7))
        b = rng.normal(0.0, rng.uniform(0.01, 0.5), rng.integers(2, 7))
        va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        df = (va + vb)**2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
        half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
        diff = a.mean() - b.mean()
        iv = welch_interval(a, b)
        assert (iv.mean, iv.low, iv.high) == pytest.approx(
            (diff, diff - half, diff + half), rel=1e-10, abs=1e-12)
        assert iv.n == min(a.size, b.size)
    assert not welch_interval([1.0], [2.0, 3.0]).has_interval
    with pytest.raises(ValueError, match='second must be a non-empty'):
        welch_interval([1.0, 2.0], [float('nan')])


def loaded(name, curves, roles, seeds):
    arms = {r: a for r, a in ROLES.items() if r in roles}
    kept = {
        k: v
        for k, v in curves.items() if k[1] in seeds and k[0] in arms.values()
    }
    return s3.LoadedControl(
        s3.Control(name, f'{name} title', '/nowhere', 128), kept, arms, LABELS,
        30, 15, {LABELS[a]: len(seeds)
                 for a in arms.values()})


def test_a_control_is_compared_with_the_base_on_its_seeds_and_methods():
    """Base: SimCLR's joint entropy 0.5 nats above the others (3 fails).
    Control: no gap, 3 seeds, SimCLR and Barlow Twins only. The control is
    set against the base on those seeds and methods, and the gap that
    closed is a reversal of 3 under equivalence, with both intervals."""
    base = loaded('base',
                  synthetic(je=lambda a, e: 4 + e / 20 + 0.5 * (a == 0)),
                  ROLES, range(5))
    control = loaded('ctl', synthetic(je=lambda a, e: 4 + e / 20),
                     {'simclr', 'barlowtwins'}, range(3))
    same = s3.matched(base, control)
    assert same.control.name == 'base on seeds 0, 1, 2 without BYOL, Spectral'
    assert set(same.arms) == {'simclr', 'barlowtwins'}
    assert {k[1] for k in same.curves} == {0, 1, 2}
    assert s3.matched(base, base) is base
    elsewhere = dataclasses.replace(
        control,
        curves={(n, s + 10): v
                for (n, s), v in control.curves.items()})
    with pytest.raises(ValueError, match=r'no run with the seeds \[10, 11'):
        s3.matched(base, elsewhere)
    changes = s3.verdict_changes(same, control)
    reversal = next(c for c in changes
                    if c.reading == 'held-out, from epoch 1, equivalence'
                    and c.number == '3')
    assert (reversal.before, reversal.after) == (flow.FAILS, flow.HOLDS)
    assert s3.is_reversal(reversal)
    gap_line, = [f for f in reversal.findings if 'margin' in f]
    before_text, after_text = gap_line.split(' -> ')
    assert 'beyond margin; critical margin ' in before_text
    assert 'within margin; critical margin ' in after_text
    rows = s3.change_rows(base, [(control, same)])
    assert ('  - reversed: 3 under "held-out, from epoch 1, equivalence" '
            '(fails -> holds)') in rows
    # The gap's change as a fraction of ln d, base on the same seeds.
    row = next(
        r for r in s3.gap_rows(base, [(control, same)])
        if r.startswith('| ctl ') and 'joint_entropy' in r)
    after = np.array(s3.gap_values(control, 'joint_entropy', 30))
    before = np.array(s3.gap_values(same, 'joint_entropy', 30))
    expected = welch_interval(after / math.log(128), before / math.log(128))
    assert f'{expected.mean:+.3f} [{expected.low:+.3f}' in row
    assert expected.high < -0.5 / math.log(128) + 0.01
    critical = flow.gap_critical(list(after), math.log(128))
    assert f'| {critical.nats:.3f} ({critical.share:.3f}) |' in row
    # Each rise from the initialisation against the base's (Welch).
    row = next(
        r for r in s3.rise_rows([(control, same)])
        if r.startswith('| ctl | Barlow Twins | mutual_info |'))
    after = s3.rise_values(control, 'barlowtwins', 'mutual_info')
    before = s3.rise_values(same, 'barlowtwins', 'mutual_info')
    assert len(after) == len(before) == 3
    assert row.endswith(f'| {welch_interval(after, before).text(3)} |')
