"""The randomized kill / damage / tampering / resume soak (issues 34, 44).

``tests/resume_soak_driver.py`` (see its docstring for the fault classes
and the invariants I1-I5 it checks after every cycle) runs in a
subprocess: a short soak in the default suite (24 cycles, about 15-25 s
on one core, touching most fault classes), 3 seeds x 300 cycles with
``MMAE_TEST_LONG=1``. The long soak's summaries are kept in docs/soak/.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

HERE = osp.dirname(osp.abspath(__file__))
LONG = os.environ.get('MMAE_TEST_LONG') == '1'
#: The fault classes a cycle injects beside ordinary kills and damages.
SPECIALS = ('forged_entries', 'copied_experiment', 'record_fault',
            'checkpoint_copied_new_dir', 'concurrent_launch', 'kill_mid_epoch',
            'record_efbig', 'new_run_over_checkpoints')


@pytest.mark.parametrize('cycles,seed', [(300, 0), (300, 1),
                                         (300, 2)] if LONG else [(24, 3)])
def test_random_faults_never_break_the_invariants(tmp_path, cycles, seed):
    out = tmp_path / 'soak.json'
    proc = subprocess.run([
        sys.executable,
        osp.join(HERE, 'resume_soak_driver.py'),
        str(out), '--cycles',
        str(cycles), '--seed',
        str(seed)
    ],
                          capture_output=True,
                          text=True,
                          env=dict(os.environ, OMP_NUM_THREADS='1'),
                          timeout=7200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary['cycles'] == cycles
    assert summary['violations'] == [], json.dumps(
        summary['violations'][:5], indent=1)
    faults = summary['fault_counts']
    # The soak exercised what it is for. The seed does not fix these
    # counts: whether an armed kill lands before its short run ends
    # depends on the machine's speed, and what is left to damage or copy
    # on where the kills landed. (24 cycles, seed 3, here: 6-10 armed,
    # 5-9 landed, 2-6 damages, 6-10 resumes, 7-8 of the 8 classes.) The
    # floors are about half of that.
    assert summary['kills_armed'] >= cycles // 8
    assert summary['kills'] >= 1
    assert summary['damages'] >= cycles // 16
    assert summary['resumes'] >= cycles // 6
    touched = [name for name in SPECIALS if faults.get(name)]
    assert len(touched) >= (len(SPECIALS) if LONG else 4), touched
    if LONG:
        assert summary['episodes'] >= cycles // 20
        assert summary['outcomes'].get('mid_epoch_resumes', 0) >= 1
        assert summary['outcomes'].get('concurrent_one_locked_out', 0) >= 1
        assert any(
            k.startswith('efbig_record_append_failed')
            for k in summary['outcomes'])
