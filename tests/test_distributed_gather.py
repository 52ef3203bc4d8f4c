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

import mmae_plugin  # noqa: F401
from mmae_plugin.models import TCRLoss, UniformityLoss

WORLD_SIZE = 2
LOCAL_BATCH = 6
LOSSES = {
    'tcr': lambda gather: TCRLoss(mu=1.0, gather=gather, loss_weight=1.0),
    'tcr_paper_centered': lambda gather: TCRLoss(
        mu=2.0, form='paper', centering=True, gather=gather, loss_weight=1.0),
    'unif': lambda gather: UniformityLoss(gather=gather, loss_weight=1.0),
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
            torch.save(param_grads(model),
                       os.path.join(out_dir, f'{loss_name}-{gather}-{rank}.pt'))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope='module')
def distributed_grads(tmp_path_factory, cpu_dist_env_factory):
    """Parameter gradients of every case, from one 2-process gloo run."""
    out_dir = tmp_path_factory.mktemp('ddp')
    mp.spawn(worker, args=(cpu_dist_env_factory(), str(out_dir)),
             nprocs=WORLD_SIZE, join=True)
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
    torch.testing.assert_close(got, expected / WORLD_SIZE, rtol=1e-10,
                               atol=1e-12)


def test_local_gather_differs_from_global(distributed_grads):
    # Sanity check that the comparisons above can fail.
    expected = single_process_grads('tcr')
    got = distributed_grads['tcr', 'local']
    assert (got - expected).norm() / expected.norm() > 1e-3
