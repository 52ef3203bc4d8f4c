"""Collectives per training step of M-MAE under real 2-process gloo DDP.

The regulariser's gather must meet the other ranks once in the forward pass
(one all-gather that carries the rows and their counts together) and once
in the backward (the gradient's reduction), both on the default process
group: no row-count exchange before the all-gather, no gloo side group, and
no host read from plugin code in the step. Before, every step made a
row-count all-gather first (over a gloo side group under NCCL), so the CPUs
of all ranks met once per step.

The counter wraps the collectives of ``torch.distributed`` in each child
process and is armed inside ``train_step`` (forward, backward, optimizer
step) of steady-state iterations. DDP's own gradient all-reduce runs inside
its C++ reducer and is not seen here; it is the same with or without the
regulariser.

The same run then checks that rows which stop fitting the gather's layout
on one rank (here rank 1 doubles its features at one iteration) stop every
rank at the next iteration with the same error.
"""
import collections
import functools
import inspect
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _helpers_gloo import START_METHOD  # noqa: E402

import mmae_plugin

PLUGIN_DIR = os.path.dirname(os.path.abspath(mmae_plugin.__file__))
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
WORLD_SIZE = 2
LOCAL_BATCH = 8
ITERS = 6
#: Iterations whose ``train_step`` is counted (the first agrees the gather
#: layout once, by design).
COUNTED_ITERS = (1, 2)
#: Iteration (0-based) at which rank 1's features stop fitting.
INJECT_ITER = 3

#: ``torch.distributed`` functions that meet other ranks.
COLLECTIVES = ('all_gather', 'all_gather_into_tensor', 'all_gather_object',
               'all_reduce', 'all_to_all', 'all_to_all_single', 'barrier',
               'broadcast', 'broadcast_object_list', 'gather', 'irecv',
               'isend', 'recv', 'reduce', 'reduce_scatter',
               'reduce_scatter_tensor', 'scatter', 'send',
               '_broadcast_coalesced')
#: Functions that make process groups (a side group would show here).
GROUP_MAKERS = ('new_group', 'new_subgroups')


def _caller_outside_torch() -> str:
    """Path (relative to the plugin, when inside it) of the first caller
    frame outside torch."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    if frame is None:
        return ''
    filename = frame.f_code.co_filename
    if filename.startswith(PLUGIN_DIR):
        return 'mmae_plugin/' + os.path.relpath(filename, PLUGIN_DIR)
    return os.path.basename(filename)


def _group_of(original: Callable, args: tuple, kwargs: dict) -> Any:
    """The ``group`` (or ``process_group``) argument of a call, if any."""
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):  # C++ functions: positional pg first
        return args[0] if args else kwargs.get('process_group')
    return bound.arguments.get('group', bound.arguments.get('process_group'))


class CollectiveCounter:
    """Records the collectives called while ``active`` and every group made.

    Each record is ``[name, on_default_group, caller]``.
    """

    def __init__(self) -> None:
        self.active = False
        self.calls: List[list] = []
        self.groups_made: List[str] = []

    def install(self) -> None:
        for name in COLLECTIVES + GROUP_MAKERS:
            if hasattr(dist, name):
                setattr(dist, name, self._wrapped(name, getattr(dist, name)))

    def _wrapped(self, name: str, original: Callable) -> Callable:
        counter = self

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if name in GROUP_MAKERS:
                counter.groups_made.append(_caller_outside_torch())
            elif counter.active:
                group = _group_of(original, args, kwargs)
                default = group is None or group is dist.group.WORLD
                counter.calls.append([name, default, _caller_outside_torch()])
            return original(*args, **kwargs)

        return counted


def _train_step_counter(runner, counter: CollectiveCounter, syncs: Any,
                        steps: List[list]) -> None:
    """Arms ``counter`` and ``syncs`` (host reads) inside ``train_step`` of
    the counted iterations and makes rank 1's regulariser input twice as
    long at ``INJECT_ITER``."""
    model = runner.model
    train_step = model.train_step

    def counted_train_step(*args, **kwargs):
        if runner.iter == INJECT_ITER and dist.get_rank() == 1:
            _double_features_once(model.module.regularizer)
        counter.active = syncs.active = runner.iter in COUNTED_ITERS
        counter.calls = []
        try:
            return train_step(*args, **kwargs)
        finally:
            if counter.active:
                steps.append(counter.calls)
            counter.active = syncs.active = False

    model.train_step = counted_train_step


def _double_features_once(regularizer: torch.nn.Module) -> None:
    """The next forward of ``regularizer`` gets every row twice."""
    handles = []

    def doubled(module, args):
        handles.pop().remove()
        return (torch.cat([args[0], args[0]]), )

    handles.append(regularizer.register_forward_pre_hook(doubled))


def runner_worker(rank: int, env: Dict[str, str], repo_root: str,
                  work_dir: str, out_dir: str) -> None:
    """Train M-MAE with the real Runner under DDP, counting collectives."""
    os.environ.update(
        env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE))
    torch.set_num_threads(1)
    from mmengine.config import Config
    from mmengine.runner import Runner
    from test_host_syncs import SyncCounter

    import mmae_plugin.registration  # noqa: F401  (the models, hooks)
    counter = CollectiveCounter()
    counter.install()
    syncs = SyncCounter()
    syncs.install()
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs', 'fashion_mnist', 'mmae_fmnist.py'))
    # The process group and DDP's CPU placement are set up here, with
    # torch and mmengine's own options, so that nothing but the gather is
    # plugin code: mmengine then finds the group initialised, and builds
    # DDP without the device_ids a CPU module cannot take.
    dist.init_process_group('gloo', rank=rank, world_size=WORLD_SIZE)
    cfg.launcher = 'pytorch'
    cfg.model_wrapper_cfg = dict(
        type='MMDistributedDataParallel',
        device_ids=None,
        broadcast_buffers=False)
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1
    cfg.train_dataloader.update(
        batch_size=LOCAL_BATCH, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.indices = WORLD_SIZE * LOCAL_BATCH * ITERS
    runner = Runner.from_cfg(cfg)
    steps: List[list] = []
    _train_step_counter(runner, counter, syncs, steps)
    error: Optional[str] = None
    try:
        runner.train()
    except Exception as exc:  # recorded: both ranks must raise alike
        error = f'{type(exc).__name__}: {exc}'
    finally:
        syncs.uninstall()
    sync_sites: Dict[str, int] = collections.Counter()
    for site, count in syncs.sites.items():
        sync_sites[':'.join(map(str, site))] += count
    with open(os.path.join(out_dir, f'{rank}.json'), 'w') as f:
        json.dump(
            dict(
                steps=steps,
                groups_made=counter.groups_made,
                syncs=dict(sync_sites),
                error=error), f)
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope='module')
def ddp_run(repo_root, tmp_path_factory, cpu_dist_env_factory):
    """Every rank's record of one 2-process M-MAE run."""
    out_dir = tmp_path_factory.mktemp('collectives')
    env = cpu_dist_env_factory(OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    context = mp.start_processes(
        runner_worker,
        args=(env, repo_root, str(out_dir / 'work'), str(out_dir)),
        nprocs=WORLD_SIZE,
        join=False,
        start_method=START_METHOD)
    deadline = time.monotonic() + 300
    # join() raises a child's exception with its traceback; the deadline
    # bounds a rank left hanging in a collective.
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail('a rank hung')
    return [
        json.loads((out_dir / f'{rank}.json').read_text())
        for rank in range(WORLD_SIZE)
    ]


GATHER = 'mmae_plugin/models/utils/gather.py'


def test_one_collective_per_step_in_forward_one_in_backward(ddp_run):
    for rank, record in enumerate(ddp_run):
        assert len(record['steps']) == len(COUNTED_ITERS), record['steps']
        for calls in record['steps']:
            assert calls == [['all_gather_into_tensor', True, GATHER],
                             ['all_reduce', True, GATHER]], (rank, calls)


def test_no_side_group_is_made(ddp_run):
    for record in ddp_run:
        assert record['groups_made'] == []


def test_no_host_read_from_plugin_code_in_the_step(ddp_run):
    for record in ddp_run:
        assert record['syncs'] == {}


def test_rows_that_stop_fitting_stop_every_rank_alike(ddp_run):
    errors = {record['error'] for record in ddp_run}
    assert len(errors) == 1, errors
    error = errors.pop()
    assert error is not None and error.startswith('RuntimeError: ')
    assert f'at training iteration {INJECT_ITER + 1}' in error
    assert f'capacity {LOCAL_BATCH} rows' in error
    assert f'rank 1: {2 * LOCAL_BATCH} rows of (' in error
    assert f'rank 0: {LOCAL_BATCH} rows of (' in error


# --------------------------------------------------------------------------
# The NCCL branch, on the GPU machine (MMAE_TEST_CUDA=1 pytest -m cuda)
# --------------------------------------------------------------------------
#: Rows per rank: unequal with two GPUs; with one GPU a 1-rank NCCL group
#: still runs the NCCL path (uint8 slots, pinned header copy,
#: reduce_scatter_tensor in the backward).
NCCL_ROWS = {1: (5, ), 2: (5, 3)}
NCCL_WIDTH = 6


def nccl_rows(world: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(
        sum(NCCL_ROWS[world]),
        NCCL_WIDTH,
        generator=generator,
        dtype=torch.float64)


def nccl_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Gathers on CUDA under NCCL; the steady-state call runs under
    ``set_sync_debug_mode('error')`` (any host sync raises)."""
    from mmae_plugin.models.utils.gather import RowGatherer
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group('nccl', rank=rank, world_size=world)
    try:
        counts = NCCL_ROWS[world]
        start = sum(counts[:rank])
        local = nccl_rows(world)[start:start + counts[rank]].cuda()
        results = {}
        for gather in ('global', 'reference'):
            gatherer = RowGatherer()
            gatherer(local, gather)  # agrees the layout: one host read
            torch.cuda.synchronize()
            x = local.clone().requires_grad_()
            torch.cuda.set_sync_debug_mode('error')
            try:
                gathered = gatherer(x, gather)
                mask = gathered.valid.unsqueeze(1).to(gathered.rows.dtype)
                value = (gathered.rows * mask).square().sum()
                value.backward()
            finally:
                torch.cuda.set_sync_debug_mode('default')
            results[gather] = dict(
                value=value.item(),
                grad=x.grad.cpu().tolist(),
                rows=gathered.rows[gathered.valid].cpu().tolist())
        with open(os.path.join(out_dir, f'{rank}.json'), 'w') as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
def test_nccl_gather_is_exact_and_makes_no_host_sync(tmp_path):
    from conftest import pick_free_port
    world = min(torch.cuda.device_count(), 2)
    context = mp.start_processes(
        nccl_worker,
        args=(world, pick_free_port(), str(tmp_path)),
        nprocs=world,
        join=False,
        start_method='spawn')
    deadline = time.monotonic() + 120
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail('a rank hung in NCCL')
    rows = nccl_rows(world).numpy()
    counts = NCCL_ROWS[world]
    for rank in range(world):
        result = json.loads((tmp_path / f'{rank}.json').read_text())
        start = sum(counts[:rank])
        own = rows[start:start + counts[rank]]
        for gather, factor in (('global', world), ('reference', 1)):
            got = result[gather]
            assert got['rows'] == rows.tolist()  # bit for bit, in order
            assert got['value'] == pytest.approx(
                float((rows**2).sum()), rel=1e-12)
            # d/dx ||all rows||^2 = 2x; 'global' sums the W ranks' copies
            # (NCCL reduce_scatter), 'reference' keeps this rank's own.
            np.testing.assert_allclose(
                np.array(got['grad']), factor * 2 * own, rtol=1e-12)
