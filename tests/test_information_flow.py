"""Per-epoch hook curves of a comparison and the information-flow verdicts.

The curves are read from what mmengine's own ``LocalVisBackend`` writes
(two segments, the second repeating an epoch as a resume after a kill
mid-epoch does); the verdicts are checked on curves whose answer is known
by construction, and every interval against scipy's t-interval.
"""
import json
import math

import numpy as np
import pytest
from scipy import stats

from mmae_compare.curves import (curves_from_json, curves_to_json,
                                 read_epoch_curves)
from studies import information_flow as flow


def log_segment(run_dir, name, records):
    """Scalars logged through mmengine's LocalVisBackend, one segment."""
    from mmengine.visualization import LocalVisBackend
    backend = LocalVisBackend(save_dir=str(run_dir / name / 'vis_data'))
    for step, epoch, scalars in records:
        backend.add_scalars({**scalars, 'epoch': epoch}, step=step)
    return backend


def test_curves_average_each_epoch_and_count_a_repeated_step_once(tmp_path):
    log_segment(
        tmp_path,
        '20261203_100000',
        [
            (0, 0, {
                'minfo_heldout/mutual_info_cov': 1.0
            }),
            (10, 1, {
                'loss': 5.0,
                'minfo/mutual_info_cov': 2.0
            }),
            (20, 1, {
                'loss': 4.0,
                'minfo/mutual_info_cov': 4.0
            }),
            (20, 1, {
                'minfo_heldout/mutual_info_cov': 1.5
            }),
            (30, 2, {
                'minfo/mutual_info_cov': 100.0
            }),  # killed mid-epoch 2
        ])
    log_segment(
        tmp_path,
        '20261203_110000',
        [
            (20, 1, {
                'minfo_heldout/mutual_info_cov': 1.5
            }),  # on resume
            (30, 2, {
                'minfo/mutual_info_cov': 6.0
            }),  # epoch 2 re-run
            (40, 2, {
                'minfo/mutual_info_cov': 8.0
            }),
            (40, 2, {
                'minfo_heldout/mutual_info_cov': 2.5
            }),
        ])
    curves = read_epoch_curves(str(tmp_path))
    assert curves == {
        'minfo/mutual_info_cov': {
            1: 3.0,
            2: 7.0
        },
        'minfo_heldout/mutual_info_cov': {
            0: 1.0,
            1: 1.5,
            2: 2.5
        }
    }
    assert curves_from_json(json.loads(json.dumps(
        curves_to_json(curves)))) == curves
    assert read_epoch_curves(str(tmp_path / 'nothing')) == {}


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
SEEDS = range(5)
NOISE = np.random.default_rng(0).normal(0, 0.01, (5, 4, 31))
#: The spectrum JS's own noise: drawn with the matrix JS's, their ratio
#: would be the same on every seed, which has no interval.
SPECTRUM_NOISE = np.random.default_rng(1).normal(0, 0.01, (5, 4, 31))


def make_curves(mi, je, js, sjs, ent=3.0, prefix='minfo_heldout'):
    """Curves of every role: ``quantity(arm_index, epoch)`` plus noise."""
    curves = {}
    for a, arm in enumerate(ROLES.values()):
        for seed in SEEDS:
            run = {}
            for name, fn in (('mutual_info', mi), ('joint_entropy', je),
                             ('matrix_js', js), ('spectrum_js', sjs),
                             ('entropy_1', lambda a, e: ent)):
                noise = SPECTRUM_NOISE if name == 'spectrum_js' else NOISE
                run[flow.quantity_key(prefix, name)] = {
                    e: fn(a, e) + (noise[seed, a, e] * abs(fn(a, e)) if
                                   name.endswith('js') else noise[seed, a, e])
                    for e in range(31)
                }
            curves[(arm, seed)] = run
    return curves


def verdicts(curves, prefix='minfo_heldout'):
    return {
        s.number: s.verdict
        for s in flow.evaluate_statements(
            curves, ROLES, LABELS, first=1, mid=15, last=30, prefix=prefix)
    }


def meet(a, e):
    """SimCLR (a=0) above the others by 0.5 at epoch 0, equal at 30."""
    return 0.5 * (a == 0) * (1 - e / 30)


def holding_curves():
    """MI and JE rise; SimCLR and BT (a=2) apart mid-way, equal at the
    end; JS small (0.02 of 3 nats ... 0.06) and rising; spectrum JS a
    hundredth of it."""
    return make_curves(
        mi=lambda a, e: 1 + e / 10 + meet(a, e),
        je=lambda a, e: 4 + e / 20 + meet(a, e),
        js=lambda a, e: 0.02 + 0.002 * e,
        sjs=lambda a, e: 0.0002 + 0.00002 * e)


def failing_curves():
    """MI falls, SimCLR and BT stay apart, JE falls, JS large, spectrum JS
    close to the matrix JS, BT ends with less joint entropy."""
    return make_curves(
        mi=lambda a, e: 3 - e / 10 + 0.5 * (a == 0),
        je=lambda a, e: 5 - e / 20 - 0.3 * (a >= 2) + 0.5 * (a == 0),
        js=lambda a, e: 1.0 - 0.01 * e,
        sjs=lambda a, e: 0.8 * (1.0 - 0.01 * e))


def test_the_paper_holding_is_recognised_statement_by_statement():
    got = verdicts(holding_curves())
    assert got == {**{n: flow.HOLDS for n in '12345'}, 'J': got['J']}
    # SimCLR meeting Barlow Twins leaves "Barlow Twins ends higher" open;
    # BT and spectral (a >= 2) ending higher than SimCLR and BYOL holds it.
    assert got['J'] == flow.UNDECIDED
    curves = make_curves(
        mi=meet,
        js=meet,
        sjs=meet,
        je=lambda a, e: 4 + 0.3 * (a >= 2) * e / 30)
    assert verdicts(curves)['J'] == flow.HOLDS


def test_the_paper_failing_is_recognised_statement_by_statement():
    assert verdicts(failing_curves()) == {n: flow.FAILS for n in '12345J'}


def test_noise_alone_cannot_tell():
    curves = make_curves(
        mi=lambda a, e: 1.0,
        je=lambda a, e: 4.0,
        js=lambda a, e: 0.15,
        sjs=lambda a, e: 0.15)
    got = verdicts(curves)
    assert got['1'] == got['2'] == got['J'] == flow.UNDECIDED, got
    # The same quantities on the training batches are simply absent.
    assert set(verdicts(curves, prefix='minfo').values()) == {flow.UNDECIDED}


def test_intervals_are_scipys_t_intervals_and_ratios_geometric():
    rng = np.random.default_rng(3)
    a = {s: float(x) for s, x in enumerate(rng.normal(2, 1, 5))}
    b = {s: float(x) for s, x in enumerate(rng.uniform(0.1, 1, 5))}
    curves = {('x', s): {
        'k/a': {
            1: 0.0,
            30: a[s]
        },
        'k/b': {
            30: b[s]
        }
    }
              for s in range(5)}
    rise = flow.rise(curves, 'x', 'k/a', 1, 30)
    d = np.array([a[s] for s in range(5)])
    low, high = stats.t.interval(0.95, 4, d.mean(), stats.sem(d))
    assert (rise.mean, rise.low, rise.high, rise.n) == pytest.approx(
        (d.mean(), low, high, 5), rel=1e-12)
    pos = {s: abs(v) + 0.1 for s, v in a.items()}
    curves = {('x', s): {
        'k/a': {
            30: pos[s]
        },
        'k/b': {
            30: b[s]
        }
    }
              for s in range(5)}
    ratio = flow.fraction(curves, 'x', 'k/a', 'k/b', 30)
    logs = np.log([pos[s] / b[s] for s in range(5)])
    low, high = stats.t.interval(0.95, 4, logs.mean(), stats.sem(logs))
    assert (ratio.mean, ratio.low, ratio.high) == pytest.approx(
        (math.exp(logs.mean()), math.exp(low), math.exp(high)), rel=1e-12)


def test_a_ratio_equal_on_every_seed_has_no_interval_and_no_verdict():
    curves = {('x', s): {
        'k/a': {
            30: 0.02 * (s + 1)
        },
        'k/b': {
            30: s + 1.0
        }
    }
              for s in range(5)}
    ratio = flow.fraction(curves, 'x', 'k/a', 'k/b', 30)
    assert ratio.n == 5 and not ratio.has_interval
    assert ratio.mean == pytest.approx(0.02, rel=1e-12)
    assert flow.below_verdict(ratio, 0.1) == flow.UNDECIDED


def test_meeting_needs_the_gap_gone_at_the_end():
    base = lambda a, e: 1 + e / 10  # noqa: E731
    # Apart all along: fails; never apart: cannot tell.
    apart = make_curves(
        mi=lambda a, e: base(a, e) + 0.5 * (a == 0),
        je=base,
        js=base,
        sjs=base)
    together = make_curves(mi=base, je=base, js=base, sjs=base)
    assert verdicts(apart)['2'] == flow.FAILS
    assert verdicts(together)['2'] == flow.UNDECIDED


def variant_rows(curves, variant, suffix):
    """``measure_variants`` records of ``curves`` at epochs 1, 15 and 30,
    each key renamed as the variant logs it (``_cov`` -> ``suffix``)."""
    rows = []
    for (arm, seed), run in curves.items():
        for epoch in (1, 15, 30):
            row = {
                'arm': arm,
                'seed': seed,
                'epoch': epoch,
                'variant': variant
            }
            for key, values in run.items():
                row[key[:-len('_cov')] + suffix] = values[epoch]
            rows.append(row)
    return rows


def test_each_variant_is_decided_by_the_statements_code():
    """A variant logged under its own key suffix (alpha, kernel) is read
    back as curves and decided statement by statement."""
    from studies import heldout_variants as hv
    holding, failing = holding_curves(), failing_curves()
    rows = (
        variant_rows(holding, 'logged', '_cov') +
        variant_rows(failing, 'alpha2', '_cov_alpha2') +
        variant_rows(holding, 'gram_kernel', '_gram'))
    assert hv.quantity_of('minfo_heldout/joint_entropy_cov_alpha2',
                          'minfo_heldout') == 'joint_entropy'
    assert hv.quantity_of('minfo/joint_entropy_cov', 'minfo_heldout') is None
    decided = hv.variant_statements(rows, ROLES, LABELS, 1, 15, 30)
    got = {
        v: {st.number: st.verdict
            for st in sts}
        for v, sts in decided.items()
    }
    on_curves = verdicts(holding)
    assert got['logged'] == got['gram_kernel'] == on_curves
    assert got['alpha2'] == verdicts(failing) == {
        n: flow.FAILS
        for n in '12345J'
    }
    report = hv.variant_report(rows, ROLES, LABELS, 1, 15, 30)
    assert '| variant | 1 | 2 | 3 | 4 | 5 | J |' in report
    assert '| alpha2 | ' + ' | '.join([flow.FAILS] * 6) + ' |' in report
    assert sum(line.startswith('<details>') for line in report) == 3


def test_roles_default_to_arm_names_and_reject_unknown_roles():
    assert flow.resolve_roles(['simclr', 'byol', 'bt'],
                              {'barlowtwins': 'bt'}) == {
                                  'simclr': 'simclr',
                                  'byol': 'byol',
                                  'barlowtwins': 'bt'
                              }
    assert flow.resolve_roles(['spectral'], {})['spectral'] == 'spectral'
    with pytest.raises(ValueError, match='ROLE in'):
        flow.resolve_roles([], {'moco': 'moco'})


@pytest.mark.parametrize('args, message', [
    (['--out-dir', 'docs/siamese', '--epochs', '1'
      ], '--epochs takes FIRST [MID] LAST, got [1]'),
    (['--out-dir', 'no/such/folder', '--epochs', '1', '30'
      ], 'comparison.json does not exist'),
])
def test_variants_command_line_errors_are_one_line(repo_root, tmp_path, args,
                                                   message):
    import subprocess
    import sys
    result = subprocess.run([
        sys.executable, 'tools/analysis/heldout_variants.py', *args, '--arms',
        'simclr', '--seeds', '0', '--report',
        str(tmp_path / 'report.md')
    ],
                            cwd=repo_root,
                            capture_output=True,
                            text=True,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines()
        if line.startswith('heldout_variants.py: error: ')
    ]
    assert message in result.stderr
    assert not (tmp_path / 'report.md').exists()


def test_a_checkpoint_measured_again_reproduces_its_logged_values(
        tmp_path, repo_root):
    """The variant path (real runner, load_from, the hook's held-out pass
    before training) gives exactly what the hook logged while training,
    and a variant gives something else."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    from studies.heldout_variants import measure_checkpoint
    cfg = Config.fromfile(f'{repo_root}/configs/fashion_mnist/'
                          'simclr_fmnist.py')
    cfg.merge_from_dict({
        'train_dataloader.dataset.indices': 128,
        'train_dataloader.batch_size': 64,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_cfg.max_epochs': 1,
        'optim_wrapper.optimizer.lr': 0.3
    })
    cfg.custom_hooks[0]['heldout'].update(num_batches=2, batch_size=32)
    config = str(tmp_path / 'simclr.py')
    cfg.dump(config)
    cfg.work_dir = str(tmp_path / 'train')
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = [h for h in runner.hooks if type(h).__name__ == 'MatrixInfoHook']
    logged = hook[0].heldout_history[-1]
    assert logged['epoch'] == 1
    checkpoint = str(tmp_path / 'train' / 'epoch_1.pth')
    again = measure_checkpoint(config, checkpoint, {}, str(tmp_path / 'a'))
    assert again == pytest.approx(
        {k: v
         for k, v in logged.items() if k not in ('epoch', 'step')},
        rel=1e-9,
        abs=1e-12)
    other = measure_checkpoint(config, checkpoint, {'alpha': 2.0},
                               str(tmp_path / 'b'))
    assert other['minfo_heldout/matrix_js_cov'] == pytest.approx(
        again['minfo_heldout/matrix_js_cov'])  # alpha-free
    assert other['minfo_heldout/mutual_info_cov_alpha2'] != pytest.approx(
        again['minfo_heldout/mutual_info_cov'])


def test_shipped_information_flow_page_is_rebuilt_from_runs_json(
        repo_root, tmp_path):
    """docs/siamese_information_flow.md is the page of docs/siamese/
    runs.json: rebuilt from copies of that file and the notes alone, every
    line after the one naming the command and date is the same."""
    import shutil
    import subprocess
    import sys
    docs = f'{repo_root}/docs'
    shipped = open(f'{docs}/siamese_information_flow.md').read()
    (tmp_path / 'siamese').mkdir()
    for name in ('runs.json', 'information_flow_notes.md'):
        shutil.copy(f'{docs}/siamese/{name}', tmp_path / 'siamese')
    proc = subprocess.run([
        sys.executable, 'tools/analysis/information_flow.py', '--out-dir',
        str(tmp_path / 'siamese'), '--report',
        str(tmp_path / 'siamese_information_flow.md'), '--notes',
        str(tmp_path / 'siamese' / 'information_flow_notes.md')
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = (tmp_path / 'siamese_information_flow.md').read_text()
    assert rebuilt.splitlines()[3:] == shipped.splitlines()[3:]
    assert rebuilt.splitlines()[0] == shipped.splitlines()[0]
