"""The randomized kill / damage / resume soak of issue 34.

``tests/resume_soak_driver.py`` (see its docstring for the faults and the
invariants) runs in a subprocess: a short soak in the default suite, at
least 200 cycles with ``MMAE_TEST_LONG=1``.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

HERE = osp.dirname(osp.abspath(__file__))
LONG = os.environ.get('MMAE_TEST_LONG') == '1'


@pytest.mark.parametrize('cycles,seed', [(200, 0)] if LONG else [(16, 3)])
def test_random_kills_and_damage_never_break_the_invariants(
        tmp_path, cycles, seed):
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
                          timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary['cycles'] == cycles
    assert summary['violations'] == []
    # The soak exercised what it is for. The seed does not fix these counts:
    # whether an armed kill lands before its short run ends depends on the
    # machine's speed, and what is left to damage on where the kills landed
    # (16 cycles, seed 3, six runs here: 6-7 armed, 2-4 landed, 3-5
    # damages, 10-11 resumes). The floors are about half of that.
    assert summary['kills_armed'] >= cycles // 5
    assert summary['kills'] >= 1
    assert summary['damages'] >= cycles // 8
    assert summary['resumes'] >= cycles // 4
