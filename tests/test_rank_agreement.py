"""Every rank takes the same path, with real 2-process gloo runs on the CPU.

* A non-finite feature on rank 1 only (what an fp16 overflow produces):
  the real mmengine Runner, launched with ``torch.distributed.run``, skips
  the regulariser on both ranks in that step, warns once naming the
  iteration, and both processes finish (before the fix, rank 1 raised
  before the gather and rank 0 died of "Connection closed by peer").
* Unequal per-rank batches: the gathered regulariser equals a float64 numpy
  reference on the concatenated rows, and so do its gradients (before the
  fix, gloo aborted with "Received data size doesn't match expected
  size").
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _helpers_gloo import loss_and_grad, run_gloo_ranks, split_rows
from scipy_matrix_info_reference import (coding_rate, finite_difference_grad,
                                         uniformity)

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.models import TCRLoss, UniformityLoss
from mmae_plugin.models.utils.gather import gather_rows

WORLD_SIZE = 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ----------------------------------------------------- non-finite on rank 1
NAN_INJECTION = '''
"""Test helper: NaN features on one rank at one iteration."""
import json
import os

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


@HOOKS.register_module()
class NaNFeaturesOnOneRankHook(Hook):
    """Turns the regulariser's input into NaN on ``rank`` at ``iteration``
    and records every rank's logged ``reg_skipped``, ``loss_tcr`` and
    ``loss_rec`` per iteration (raw values, not the logger's means)."""

    def __init__(self, rank, iteration):
        self.rank, self.iteration = rank, iteration
        self.codes = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iteration and get_rank() == self.rank:
            model = getattr(runner.model, 'module', runner.model)
            handle = []

            def to_nan(module, args):
                handle.pop().remove()
                # Keeps the autograd graph (and so the all-gather's backward
                # on this rank), as an overflow in the forward would, but
                # passes a zero gradient back: the skipped term must not
                # turn it into NaN.
                everywhere = torch.ones_like(args[0], dtype=torch.bool)
                return (torch.where(everywhere, float('nan'), args[0]), )

            handle.append(model.regularizer.register_forward_pre_hook(to_nan))

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.codes.append([float(outputs[key]) for key in
                           ('reg_skipped', 'loss_tcr', 'loss_rec')])

    def after_run(self, runner):
        path = os.path.join(runner.work_dir, f'codes-{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(self.codes, f)
'''

CONFIG = '''
_base_ = [{base!r}]
custom_imports = dict(imports=['mmae_plugin', 'nan_injection'],
                      allow_failed_imports=False)
custom_hooks = [dict(type='ReseedHook'),
                dict(type='NaNFeaturesOnOneRankHook', rank=1, iteration=1)]
'''

ITERS, LOCAL_BATCH = 4, 4


def test_nan_on_one_rank_skips_the_term_on_every_rank(tmp_path, cpu_dist_env):
    (tmp_path / 'nan_injection.py').write_text(NAN_INJECTION)
    config = tmp_path / 'mmae_nan.py'
    config.write_text(
        CONFIG.format(
            base=os.path.join(REPO, 'configs', 'fashion_mnist',
                              'mmae_fmnist.py')))
    work_dir = tmp_path / 'work'
    options = [
        f'train_dataloader.batch_size={LOCAL_BATCH}',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        f'train_dataloader.dataset.indices={WORLD_SIZE * LOCAL_BATCH * ITERS}',
        'train_cfg.max_epochs=1',
        'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1000',
    ]
    env = dict(
        cpu_dist_env,
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore',
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path), REPO,
             os.environ.get('PYTHONPATH', '')]))
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node',
        str(WORLD_SIZE), '--master_addr', '127.0.0.1', '--master_port',
        env['MASTER_PORT'],
        os.path.join(REPO, 'tools', 'train.py'),
        str(config), '--launcher', 'pytorch', '--work-dir',
        str(work_dir), '--cfg-options'
    ] + options
    result = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    logged = [
        json.loads((work_dir / f'codes-{rank}.json').read_text())
        for rank in range(WORLD_SIZE)
    ]
    codes = [[row[0] for row in rows] for rows in logged]
    # Rank 0's own features were finite: it skipped because of rank 1's.
    assert codes[0] == codes[1] == [0.0, 1.0, 0.0, 0.0], codes
    for rows in logged:
        assert rows[1][1] == 0.0  # the skipped term
        assert all(row[1] < 0 for i, row in enumerate(rows) if i != 1)
        # Rank 1's zero term passed back a finite gradient: later steps
        # (and every reconstruction) stay finite.
        assert all(np.isfinite(row[2]) for row in rows)
    warnings = [line for line in output.splitlines() if 'was skipped' in line]
    assert len(warnings) == 1, warnings
    assert 'loss_tcr was skipped' in warnings[0]
    assert 'at training iteration 2 on every rank' in warnings[0]
    assert 'features contain non-finite values' in warnings[0]


# ---------------------------------------------------------- unequal batches
ROWS = (5, 3)  # rank 0, rank 1
DIM = 4
LOSSES = {
    'tcr': (lambda gather: TCRLoss(mu=1.0, gather=gather, loss_weight=1.0),
            lambda z: -coding_rate(z, 'reference', 1.0, False)),
    'tcr_paper_centered': (lambda gather: TCRLoss(
        mu=2.0, form='paper', centering=True, gather=gather, loss_weight=1.0),
                           lambda z: -coding_rate(z, 'paper', 2.0, True)),
    'unif': (lambda gather: UniformityLoss(gather=gather, loss_weight=1.0),
             uniformity),
}
CASES = [(name, 'global') for name in LOSSES] + [('tcr', 'reference')]


def all_rows() -> torch.Tensor:
    return split_rows(ROWS, DIM, seed=0)[0]


def unequal_scenarios(rank, world):
    """Every case's value, skip code and gradient, and the hook's gather."""
    local = split_rows(ROWS, DIM, seed=0)[1][rank]
    results = {
        f'{name}-{gather}': loss_and_grad(LOSSES[name][0](gather), local)
        for name, gather in CASES
    }
    with torch.no_grad():  # the hook's gather: same definition
        results['hook'] = gather_rows(local).tolist()
    return results


@pytest.fixture(scope='module')
def unequal_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp('unequal')
    # Bounded: a mismatched collective would hang, not fail.
    return run_gloo_ranks(
        unequal_scenarios, WORLD_SIZE, str(out_dir), timeout=240)


@pytest.mark.parametrize('name,gather', CASES)
def test_unequal_batches_match_numpy_on_the_concatenated_rows(
        unequal_results, name, gather):
    reference = LOSSES[name][1]
    rows = all_rows().numpy()
    # -coding_rate is the TCR loss; uniformity the loss itself.
    expected = reference(rows)
    grad = finite_difference_grad(reference, rows)
    # 'global': each rank's all-gather backward sums the W ranks' gradient
    # of the (same) global loss; 'reference' keeps this rank's share.
    factor = WORLD_SIZE if gather == 'global' else 1
    for rank in range(WORLD_SIZE):
        value, code, local_grad = unequal_results[rank][f'{name}-{gather}']
        assert code == 0.0
        assert value == pytest.approx(expected, rel=1e-6)
        start = sum(ROWS[:rank])
        np.testing.assert_allclose(
            np.array(local_grad),
            factor * grad[start:start + ROWS[rank]],
            rtol=1e-5,
            atol=1e-7)


def test_hook_gather_concatenates_unequal_rows(unequal_results):
    for rank in range(WORLD_SIZE):
        np.testing.assert_array_equal(
            np.array(unequal_results[rank]['hook']),
            all_rows().numpy())
