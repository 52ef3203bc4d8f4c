"""Gradients of the gathered regularisers under real 2-process gloo DDP.

``gather='global'`` must reproduce one process on the concatenated batch;
``gather='reference'`` (the published code's gather) must give exactly half.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.models import TCRLoss, UniformityLoss

WORLD_SIZE = 2
LOCAL_BATCH = 6
LOSSES = {
    'tcr':
    lambda gather: TCRLoss(mu=1.0, gather=gather, loss_weight=1.0),
    'tcr_paper_centered':
    lambda gather: TCRLoss(
        mu=2.0, form='paper', centering=True, gather=gather, loss_weight=1.0),
    'unif':
    lambda gather: UniformityLoss(gather=gather, loss_weight=1.0),
}


def make_model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 8).double()
    inputs = torch.randn(WORLD_SIZE * LOCAL_BATCH, 5, dtype=torch.float64)
    return model, inputs


def param_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


CASES = [(name, 'global') for name in LOSSES] + [('tcr', 'reference'),
                                                 ('tcr', 'local')]


def worker(rank, env, out_dir):
    # conftest's CPU environment (no GPU visible, a free MASTER_PORT), set
    # before anything in this fresh process touches CUDA.
    os.environ.update(env)
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    try:
        for loss_name, gather in CASES:
            model, inputs = make_model_and_data()
            ddp = DistributedDataParallel(model)
            local = inputs[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH]
            LOSSES[loss_name](gather)(ddp(local)).backward()
            torch.save(
                param_grads(model),
                os.path.join(out_dir, f'{loss_name}-{gather}-{rank}.pt'))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope='module')
def distributed_grads(tmp_path_factory, cpu_dist_env_factory):
    """Parameter gradients of every case, from one 2-process gloo run."""
    out_dir = tmp_path_factory.mktemp('ddp')
    mp.spawn(
        worker,
        args=(cpu_dist_env_factory(), str(out_dir)),
        nprocs=WORLD_SIZE,
        join=True)
    grads = {}
    for loss_name, gather in CASES:
        per_rank = [
            torch.load(out_dir / f'{loss_name}-{gather}-{r}.pt')
            for r in range(WORLD_SIZE)
        ]
        torch.testing.assert_close(per_rank[0], per_rank[1])  # DDP in sync
        grads[loss_name, gather] = per_rank[0]
    return grads


def single_process_grads(loss_name):
    model, inputs = make_model_and_data()
    LOSSES[loss_name]('global')(model(inputs)).backward()
    return param_grads(model)


@pytest.mark.parametrize('loss_name', list(LOSSES))
def test_global_gather_equals_one_process_on_global_batch(
        loss_name, distributed_grads):
    expected = single_process_grads(loss_name)
    got = distributed_grads[loss_name, 'global']
    rel = (got - expected).norm() / expected.norm()
    assert rel < 1e-5, f'relative error {rel:.2e}'


def test_reference_gather_gives_half_the_gradient(distributed_grads):
    expected = single_process_grads('tcr')
    got = distributed_grads['tcr', 'reference']
    torch.testing.assert_close(
        got, expected / WORLD_SIZE, rtol=1e-10, atol=1e-12)


def test_local_gather_differs_from_global(distributed_grads):
    # Sanity check that the comparisons above can fail.
    expected = single_process_grads('tcr')
    got = distributed_grads['tcr', 'local']
    assert (got - expected).norm() / expected.norm() > 1e-3


# --------------------------------------------------------------------------
# The padded one-collective gather with 2 and 3 gloo processes: unequal and
# empty ranks, every rank's outcome compared, float64 numpy references.
# --------------------------------------------------------------------------
import numpy as np  # noqa: E402
from _helpers_gloo import run_gloo_ranks  # noqa: E402
from _helpers_gloo import loss_and_grad, split_rows
from scipy_matrix_info_reference import coding_rate  # noqa: E402
from scipy_matrix_info_reference import finite_difference_grad, uniformity

from mmae_plugin.models.losses.feature_regularizer import (  # noqa: E402
    SKIP_GATHER_REFUSED, SKIP_TOO_FEW_ROWS)
from mmae_plugin.models.utils.gather import gather_rows  # noqa: E402

#: Per world size: the rows of each rank at the first call (which agrees
#: the layout: capacity = the largest count) and at a second call (the
#: steady state: one collective), an empty rank in each.
SPLITS = {2: ((5, 0), (2, 4)), 3: ((5, 0, 3), (1, 4, 0))}
#: name -> (width, loss factory, float64 numpy reference of the loss).
PADDED_LOSSES = {
    'tcr': (6, lambda gather: TCRLoss(mu=1.0, gather=gather, loss_weight=1.0),
            lambda z: -coding_rate(z, 'reference', 1.0, False)),
    'tcr_paper_centered': (6, lambda gather: TCRLoss(
        mu=2.0, form='paper', centering=True, gather=gather, loss_weight=1.0),
                           lambda z: -coding_rate(z, 'paper', 2.0, True)),
    # Wider than the padded batch: the Gram is taken on the samples side,
    # where every zero padding row adds log(mu) that the offset removes.
    'tcr_paper_wide': (20, lambda gather: TCRLoss(
        mu=2.0, form='paper', gather=gather, loss_weight=1.0),
                       lambda z: -coding_rate(z, 'paper', 2.0, False)),
    'unif': (6, lambda gather: UniformityLoss(gather=gather, loss_weight=1.0),
             uniformity),
}
PADDED_CASES = [(name, 'global')
                for name in PADDED_LOSSES] + [('tcr', 'reference'),
                                              ('unif', 'reference')]


def outcome(call):
    """``call()``'s result, or the error it raised, as JSON-able data."""
    try:
        return dict(result=call())
    except Exception as error:  # every rank must record the same
        return dict(error=f'{type(error).__name__}: {error}')


def run_scenarios(rank, world):
    """Every scenario on this rank, in the same order on every rank.

    A scenario that raises must raise on every rank at the same point, so
    the ranks stay in step for the next one (a rank raising alone would
    leave the others in a collective and the run would time out).
    """
    results = {}
    first, second = SPLITS[world]
    for name, gather in PADDED_CASES:
        width, make, _ = PADDED_LOSSES[name]
        loss_fn = make(gather)
        for call, counts in enumerate((first, second)):
            _, parts = split_rows(counts, width, seed=call)
            results[f'{name}-{gather}-{call}'] = outcome(
                lambda: loss_and_grad(loss_fn, parts[rank]))
    _, parts = split_rows(first, 6, seed=0)
    with torch.no_grad():
        results['hook'] = outcome(lambda: gather_rows(parts[rank]).tolist())
    # Fewer than 2 rows in all, and no row at all: skipped alike.
    one_row = [1] + [0] * (world - 1)
    results['one_row'] = outcome(lambda: loss_and_grad(
        TCRLoss(loss_weight=1.0),
        split_rows(one_row, 6, 0)[1][rank]))
    results['no_row'] = outcome(lambda: loss_and_grad(
        UniformityLoss(loss_weight=1.0), torch.zeros(
            0, 6, dtype=torch.float64)))
    # Another width or dtype on the last rank at the first call: refused
    # with the same error everywhere (before: SIGABRT in gloo).
    wide = 7 if rank == world - 1 else 6
    results['width'] = outcome(lambda: loss_and_grad(
        TCRLoss(), torch.ones(3, wide, dtype=torch.float64)))
    results['width_hook'] = outcome(
        lambda: gather_rows(torch.ones(3, wide)).tolist())
    dtype = torch.float32 if rank == world - 1 else torch.float64
    results['dtype'] = outcome(
        lambda: gather_rows(torch.ones(2, 6, dtype=dtype)).tolist())
    results['capacity'] = outcome(lambda: loss_and_grad(
        TCRLoss(gather_capacity=2), torch.ones(3, 6, dtype=torch.float64)))
    # After the layout is agreed (capacity 3), rank 1 sends 5 rows, then
    # rows of another width: the term is skipped on every rank and the
    # reason names rank 1's rows; a later fitting call works again.
    loss_fn = TCRLoss(loss_weight=1.0)
    _, parts = split_rows([3] * world, 6, seed=3)
    results['agreed'] = outcome(lambda: loss_and_grad(loss_fn, parts[rank]))
    for case, bad in (('too_many', torch.randn(5, 6, dtype=torch.float64)),
                      ('other_width', torch.randn(2, 8, dtype=torch.float64))):
        rows = bad if rank == 1 else parts[rank]
        results[case] = outcome(lambda: loss_and_grad(loss_fn, rows) +
                                [loss_fn.skip_reason(int(loss_fn.skip_code))])
    results['fits_again'] = outcome(
        lambda: loss_and_grad(loss_fn, parts[rank]))
    return results


@pytest.fixture(scope='module', params=[2, 3], ids=['2ranks', '3ranks'])
def padded_results(request, tmp_path_factory):
    world = request.param
    out_dir = tmp_path_factory.mktemp(f'padded{world}')
    # Bounded: a rank raising alone would leave the others hanging.
    return world, run_gloo_ranks(
        run_scenarios, world, str(out_dir), timeout=300)


@pytest.mark.parametrize('name,gather', PADDED_CASES)
def test_padded_gather_matches_numpy_with_empty_ranks(padded_results, name,
                                                      gather):
    world, results = padded_results
    width, _, reference = PADDED_LOSSES[name]
    # 'global': every rank's backward sums the W ranks' (equal) gradients
    # of the same loss; 'reference' keeps this rank's own.
    factor = world if gather == 'global' else 1
    for call, counts in enumerate(SPLITS[world]):
        rows, _ = split_rows(counts, width, seed=call)
        rows = rows.numpy()
        expected = reference(rows)
        grad = finite_difference_grad(reference, rows)
        starts = np.cumsum((0, ) + counts)
        for rank in range(world):
            value, code, local_grad = \
                results[rank][f'{name}-{gather}-{call}']['result']
            assert code == 0
            assert value == pytest.approx(expected, rel=1e-6)
            np.testing.assert_allclose(
                np.array(local_grad).reshape(counts[rank], width),
                factor * grad[starts[rank]:starts[rank + 1]],
                rtol=1e-5,
                atol=1e-7)


def test_hook_gather_concatenates_with_an_empty_rank(padded_results):
    world, results = padded_results
    rows, _ = split_rows(SPLITS[world][0], 6, seed=0)
    for rank in range(world):
        np.testing.assert_array_equal(
            np.array(results[rank]['hook']['result']), rows.numpy())


@pytest.mark.parametrize('case', ['one_row', 'no_row'])
def test_too_few_rows_skip_the_term_on_every_rank(padded_results, case):
    world, results = padded_results
    outcomes = [results[rank][case]['result'] for rank in range(world)]
    for value, code, grad in outcomes:
        assert (value, code) == (0.0, SKIP_TOO_FEW_ROWS)
        assert not np.any(grad)


@pytest.mark.parametrize('case,expected', [
    ('width', 'rank 1: 3 rows of (7,) float64'),
    ('width_hook', 'rows of (7,) float32'),
    ('dtype', 'rows of (6,) float32'),
    ('capacity', 'gather_capacity=2'),
])
def test_mismatched_ranks_raise_the_same_error_everywhere(
        padded_results, case, expected):
    world, results = padded_results
    errors = {results[rank][case].get('error') for rank in range(world)}
    assert len(errors) == 1, errors
    error = errors.pop()
    assert error is not None and error.startswith('ValueError: ')
    assert 'across ranks' in error
    if case == 'width':  # the last rank is rank 1 with 2 ranks, 2 with 3
        expected = expected.replace('rank 1', f'rank {world - 1}')
    assert expected in error, error


@pytest.mark.parametrize('case,expected', [
    ('too_many', 'rank 1: 5 rows of (6,) float64'),
    ('other_width', 'rank 1: 2 rows of (8,) float64'),
])
def test_rows_that_no_longer_fit_skip_the_term_on_every_rank(
        padded_results, case, expected):
    world, results = padded_results
    reasons = set()
    for rank in range(world):
        value, code, grad, reason = results[rank][case]['result']
        assert (value, code) == (0.0, SKIP_GATHER_REFUSED)
        assert not np.any(grad)  # a finite, zero gradient
        reasons.add(reason)
    assert len(reasons) == 1, reasons
    reason = reasons.pop()
    assert expected in reason and 'capacity 3 rows of (6,)' in reason
    # The same loss gathers again once the rows fit.
    rows, _ = split_rows([3] * world, 6, seed=3)
    expected_value = -coding_rate(rows.numpy(), 'reference', 1.0, False)
    for rank in range(world):
        for step in ('agreed', 'fits_again'):
            value, code, _ = results[rank][step]['result']
            assert code == 0 and value == pytest.approx(
                expected_value, rel=1e-6)
