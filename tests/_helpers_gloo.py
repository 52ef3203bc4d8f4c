"""Test helper: run a function on W CPU (gloo) ranks and collect results.

Used by the gather tests (``test_distributed_gather``,
``test_rank_agreement``): each rank runs ``body(rank, world)`` in a fresh
spawned process inside a gloo process group and writes what it returns as
JSON; the parent waits a bounded time (a rank left alone in a collective
hangs instead of failing), kills hung ranks and fails, and returns every
rank's results in rank order. Also the rows and per-rank outcome the gather
tests draw and record alike.
"""
import json
import os
from typing import Any, Callable, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Fresh processes, as spawn gives, without each rank importing torch and
#: mmpretrain again (about 6 CPU-seconds a rank): one fork server per test
#: process imports them once and forks every rank from that clean state.
START_METHOD = 'forkserver'
mp.set_forkserver_preload([
    'torch', 'torch.distributed', 'mmpretrain.models',
    'mmae_plugin.registration'
])


def _gloo_rank(rank: int, body: Callable[[int, int], Any], world: int,
               port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        CUDA_VISIBLE_DEVICES='')
    dist.init_process_group('gloo', rank=rank, world_size=world)
    try:
        results = body(rank, world)
        with open(os.path.join(out_dir, f'{rank}.json'), 'w') as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def run_gloo_ranks(body: Callable[[int, int], Any],
                   world: int,
                   out_dir: str,
                   timeout: float = 300) -> List[Any]:
    """``body(rank, world)`` of every rank, run in ``world`` gloo processes.

    Args:
        body: A module-level function (spawned processes import it by
            name) returning JSON-able data; it must call the same
            collectives in the same order on every rank.
        world: Number of ranks.
        out_dir: Where the ranks write ``<rank>.json``.
        timeout: Seconds each rank may take before it counts as hung.

    Returns:
        The ranks' results, rank 0 first.
    """
    from conftest import pick_free_port
    context = mp.start_processes(
        _gloo_rank,
        args=(body, world, pick_free_port(), str(out_dir)),
        nprocs=world,
        join=False,
        start_method=START_METHOD)
    for process in context.processes:
        process.join(timeout=timeout)
    alive = [p for p in context.processes if p.is_alive()]
    for process in alive:
        process.kill()
    assert not alive, 'a rank hung in a collective'
    assert [p.exitcode for p in context.processes] == [0] * world, \
        [p.exitcode for p in context.processes]
    results = []
    for rank in range(world):
        with open(os.path.join(out_dir, f'{rank}.json')) as f:
            results.append(json.load(f))
    return results


def split_rows(counts: Sequence[int], width: int,
               seed: int) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """All rows of one call (float64, seeded) and each rank's share."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(
        sum(counts), width, generator=generator, dtype=torch.float64)
    return rows, list(rows.split(list(counts)))


def loss_and_grad(loss_fn: Callable, rows: torch.Tensor) -> list:
    """Value, skip code and gradient of ``loss_fn`` at this rank's rows."""
    z = rows.clone().requires_grad_()
    value = loss_fn(z)
    value.backward()
    return [value.item(), int(loss_fn.skip_code), z.grad.tolist()]
