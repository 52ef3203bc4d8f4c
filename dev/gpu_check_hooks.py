"""What dev/gpu_check.sh's training stages measure inside the recipe.

**Device waits per step** (stage ``dist_train``). Two hooks bracket every
training iteration: :class:`SyncCountStart` runs first in
``before_train_iter`` and :class:`SyncCountStop` last in
``after_train_iter``, so the window holds the data preprocessor, the step
and every hook's work on it (the runtime-info hook settling the logged
values, the divergence check, the logger). Two counts per step:

* ``sync_debug``: ``torch.cuda.set_sync_debug_mode('warn')`` makes every
  operation that waits for the device through ``c10::cuda``'s synchronising
  calls (``.item()``, a blocking copy to the host, a data-dependent shape)
  warn; the warnings are counted, with where they came from. That mode does
  not see ``CUDAEvent::synchronize`` (``cudaEventSynchronize``), the wait of
  ``DeferredRuntimeInfoHook.settle`` on the previous step's copy;
* ``host_waits``: this module wraps ``torch.cuda.Event.synchronize``,
  ``torch.cuda.Stream.synchronize`` and ``torch.cuda.synchronize`` (in the
  check's processes only; the plugin is not changed) and counts their calls
  in the window: how many, whether the event or stream was still
  pending (``query()`` just before the call: the thread really waited),
  the time spent and the caller. A wrapped call during which the sync
  debug mode warned is flagged, so ``total`` (sync_debug + host waits it
  did not see) counts every wait once.

A third, independent count: the first :data:`PROFILED_ITERS` counted steps
run under ``torch.profiler`` (CPU, and CUDA activity with a GPU), each step
inside a ``record_function`` range, and the CUDA runtime calls that block
the host (``cudaEventSynchronize``, ``cudaStreamSynchronize``,
``cudaDeviceSynchronize``) and the host reads of a scalar
(``aten::_local_scalar_dense``, what ``.item()`` runs; the CPU equivalent
of a device wait) are counted per step. Rank 0 writes
``sync_counts.json`` to the work dir. On the CPU (the dry run) every window
is opened and counted the same way: the device counts are 0, the scalar
reads are not.

**Two ranks on one GPU** (stage ``two_ranks``, dev/gpu_check_two_ranks.py):
:func:`record_collectives` wraps ``torch.distributed``'s collectives and
records, per call site (the first frame in ``mmae_plugin``), the operation
and the device and dtype of its tensors; :class:`TwoRankRecord` keeps
every settled step's values (this rank's and, from the all-reduced table,
every rank's) and, under gloo with CUDA, has mmengine's collectives keep
their tensors on the GPU as they do under NCCL (mmengine's
``get_comm_device`` returns the CPU for gloo: the DivergenceHook's
all-reduce would otherwise run on a host copy). :func:`reduce_scatter_probe`
runs the regulariser's gather backward both ways (``all_reduce``, gloo's,
and ``reduce_scatter_tensor``, NCCL's) on this rank's device.

Not part of the plugin: a development harness, imported by the check's
derived configs (``custom_imports``) with ``dev/`` on ``PYTHONPATH``.
"""
import collections
import functools
import hashlib
import json
import os.path as osp
import statistics
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: Iterations (of this process) not counted: CUDA and allocator warm-up,
#: the dataloader's first batches.
WARMUP_ITERS = 3
#: Counted iterations also run under torch.profiler (the first ones).
PROFILED_ITERS = 2
SYNC_WARNING = 'synchronizing'
#: What the profiler counts per step: the CUDA runtime calls that block
#: the host, and the host reads of a scalar (``.item()``, ``.tolist()``).
PROFILED_CALLS = ('cudaEventSynchronize', 'cudaStreamSynchronize',
                  'cudaDeviceSynchronize', 'aten::_local_scalar_dense')
STEP_RANGE = 'gpu_check_step_'


def _caller_site(skip: tuple = ('torch', 'gpu_check_hooks')) -> str:
    """``file:line function`` of the innermost frame outside ``skip``."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        parts = frame.filename.replace('\\', '/').split('/')
        if any(part in skip or part == 'gpu_check_hooks.py' for part in parts):
            continue
        return f'{osp.basename(frame.filename)}:{frame.lineno} {frame.name}'
    return 'unknown'


# ------------------------------------------------------- device waits
class _Window:
    """The state the two hooks share: one window per counted iteration."""

    def __init__(self) -> None:
        self.open = False
        self.catcher: Optional[warnings.catch_warnings] = None
        self.caught: List[warnings.WarningMessage] = []
        self.waits: List[Dict[str, Any]] = []
        self.per_iter: Dict[int, Dict[str, Any]] = {}
        self.sites: collections.Counter = collections.Counter()
        self.wait_sites: collections.Counter = collections.Counter()
        self.seen = 0
        self.profiler: Optional[torch.profiler.profile] = None
        self.step_range: Optional[Any] = None
        self.profiled: List[int] = []
        self.profile: Dict[str, Any] = dict(
            iters=[], per_iter={}, whole_span={}, error=None)


_WINDOW = _Window()
_WAITS_WRAPPED = False


def _wrap_wait(kind: str, original: Callable) -> Callable:
    """``original`` (a host wait), recorded while a window is open."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not _WINDOW.open:
            return original(*args, **kwargs)
        pending = None
        if kind in ('event', 'stream') and args:
            try:  # cudaEventQuery / cudaStreamQuery: no wait
                pending = not args[0].query()
            except Exception:  # noqa: BLE001 (a query must not break it)
                pending = None
        before = len(_WINDOW.caught)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seen = any(
                SYNC_WARNING in str(m.message)
                for m in _WINDOW.caught[before:])
            _WINDOW.waits.append(
                dict(
                    kind=kind,
                    pending=pending,
                    ms=(time.perf_counter() - start) * 1e3,
                    seen_by_sync_debug=seen,
                    site=_caller_site()))

    wrapper.__gpu_check_wrapped__ = True
    return wrapper


def wrap_host_waits() -> None:
    """Wrap the host waits the sync debug mode does not see (idempotent).

    ``torch.cuda.Event.synchronize``, ``torch.cuda.Stream.synchronize``
    (class attributes: every instance, ``DeferredRuntimeInfoHook``'s
    events included) and ``torch.cuda.synchronize``. Outside a counting
    window the wrappers only call through.
    """
    global _WAITS_WRAPPED
    if _WAITS_WRAPPED:
        return
    torch.cuda.Event.synchronize = _wrap_wait('event',
                                              torch.cuda.Event.synchronize)
    torch.cuda.Stream.synchronize = _wrap_wait('stream',
                                               torch.cuda.Stream.synchronize)
    torch.cuda.synchronize = _wrap_wait('device', torch.cuda.synchronize)
    _WAITS_WRAPPED = True


def _profiler_start() -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        _WINDOW.profiler = torch.profiler.profile(activities=activities)
        _WINDOW.profiler.__enter__()
        _WINDOW.profile['activities'] = [a.name for a in activities]
    except Exception as error:  # noqa: BLE001 (reported, not fatal)
        _WINDOW.profiler = None
        _WINDOW.profile['error'] = f'start: {type(error).__name__}: {error}'


def _profiler_stop() -> None:
    """Stop the profiler; count :data:`PROFILED_CALLS` per step range."""
    profiler, _WINDOW.profiler = _WINDOW.profiler, None
    if profiler is None:
        return
    try:
        profiler.__exit__(None, None, None)
        events = profiler.events()
        ranges = {}
        for event in events:
            if event.name.startswith(STEP_RANGE) and \
                    event.device_type == torch.autograd.DeviceType.CPU:
                ranges.setdefault(
                    int(event.name[len(STEP_RANGE):]),
                    (event.time_range.start, event.time_range.end))
        per_iter = {it: dict.fromkeys(PROFILED_CALLS, 0) for it in ranges}
        whole = dict.fromkeys(PROFILED_CALLS, 0)
        # Any CUDA runtime call at all (cudaLaunchKernel, ...): none with a
        # GPU means CUPTI recorded nothing, and the zeros mean nothing.
        runtime_calls = 0
        for event in events:
            runtime_calls += event.name.startswith('cuda')
            if event.name not in whole:
                continue
            whole[event.name] += 1
            for it, (begin, end) in ranges.items():
                if begin <= event.time_range.start <= end:
                    per_iter[it][event.name] += 1
        _WINDOW.profile.update(
            iters=sorted(per_iter),
            per_iter={str(k): v
                      for k, v in sorted(per_iter.items())},
            whole_span=whole,
            runtime_calls_seen=runtime_calls)
    except Exception as error:  # noqa: BLE001 (reported, not fatal)
        _WINDOW.profile['error'] = f'stop: {type(error).__name__}: {error}'


@HOOKS.register_module()
class SyncCountStart(Hook):
    """Opens the counting window before anything else in an iteration."""

    priority = 'HIGHEST'

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        _WINDOW.seen += 1
        if _WINDOW.seen <= WARMUP_ITERS:
            return
        wrap_host_waits()
        iteration = runner.iter + 1  # 1-based, as the log
        if _WINDOW.seen <= WARMUP_ITERS + PROFILED_ITERS:
            if _WINDOW.seen == WARMUP_ITERS + 1:
                _profiler_start()
            if _WINDOW.profiler is not None:
                _WINDOW.step_range = torch.profiler.record_function(
                    f'{STEP_RANGE}{iteration}')
                _WINDOW.step_range.__enter__()
        _WINDOW.catcher = warnings.catch_warnings(record=True)
        _WINDOW.caught = _WINDOW.catcher.__enter__()
        warnings.simplefilter('always')
        _WINDOW.waits = []
        _WINDOW.open = True
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode('warn')


@HOOKS.register_module()
class SyncCountStop(Hook):
    """Closes the window after every other hook, writes the counts."""

    priority = 'LOWEST'

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if _WINDOW.catcher is None:
            return
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)
        _WINDOW.open = False
        debug = [m for m in _WINDOW.caught if SYNC_WARNING in str(m.message)]
        _WINDOW.catcher.__exit__(None, None, None)
        _WINDOW.catcher = None
        waits = _WINDOW.waits
        unseen = [w for w in waits if not w['seen_by_sync_debug']]
        _WINDOW.per_iter[runner.iter + 1] = dict(
            sync_debug=len(debug),
            host_waits=len(waits),
            event_waits=sum(w['kind'] == 'event' for w in waits),
            stream_waits=sum(w['kind'] == 'stream' for w in waits),
            device_syncs=sum(w['kind'] == 'device' for w in waits),
            pending=sum(bool(w['pending']) for w in waits),
            wait_ms=round(sum(w['ms'] for w in waits), 3),
            total=len(debug) + len(unseen))
        _WINDOW.sites.update(f'{osp.basename(m.filename)}:{m.lineno}'
                             for m in debug)
        _WINDOW.wait_sites.update(f'{w["kind"]} {w["site"]}' for w in waits)
        if _WINDOW.step_range is not None:
            _WINDOW.step_range.__exit__(None, None, None)
            _WINDOW.step_range = None
            if _WINDOW.seen >= WARMUP_ITERS + PROFILED_ITERS:
                _profiler_stop()

    def after_train(self, runner) -> None:
        _profiler_stop()  # training ended before the last profiled step

    def after_run(self, runner) -> None:
        if not is_main_process():
            return
        try:
            with open(osp.join(runner.work_dir, 'sync_counts.json'), 'w') as f:
                json.dump(sync_report(), f, indent=2)
        except OSError:
            traceback.print_exc()


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def sync_report() -> Dict[str, Any]:
    """What ``sync_counts.json`` holds (see the module docstring)."""
    per_iter = _WINDOW.per_iter

    def column(key: str) -> List[float]:
        return [counts[key] for counts in per_iter.values()]

    return dict(
        counted=torch.cuda.is_available(),
        device='cuda' if torch.cuda.is_available() else 'cpu',
        warmup_iters=WARMUP_ITERS,
        steps=len(per_iter),
        per_iter={str(k): v
                  for k, v in sorted(per_iter.items())},
        # the sync debug mode's count, as before (median, max)
        median=_median(column('sync_debug')),
        max=max(column('sync_debug'), default=None),
        host_waits_median=_median(column('host_waits')),
        host_waits_max=max(column('host_waits'), default=None),
        pending_waits=sum(column('pending')),
        wait_ms_median=_median(column('wait_ms')),
        total_median=_median(column('total')),
        total_max=max(column('total'), default=None),
        sites=dict(_WINDOW.sites.most_common(20)),
        wait_sites=dict(_WINDOW.wait_sites.most_common(20)),
        profiler=_WINDOW.profile)


# ------------------------------------------------------- two ranks
class _Collectives:
    """Collective calls seen by :func:`record_collectives`."""

    def __init__(self) -> None:
        self.calls: collections.Counter = collections.Counter()
        self.installed = False
        self.comm_device_patched = False


_COLLECTIVES = _Collectives()
#: torch.distributed functions recorded, and which argument is the input.
COLLECTIVES = dict(
    all_reduce=0,
    all_gather=1,
    all_gather_into_tensor=1,
    reduce_scatter=1,
    reduce_scatter_tensor=1,
    broadcast=0)


def _plugin_site() -> str:
    """The innermost ``mmae_plugin`` frame, else the innermost outside
    torch and this module (``file:line function``)."""
    stack = traceback.extract_stack()[:-2]
    for frame in reversed(stack):
        path = frame.filename.replace('\\', '/')
        if '/mmae_plugin/' in path:
            rel = path.split('/mmae_plugin/', 1)[1]
            return f'mmae_plugin/{rel}:{frame.lineno} {frame.name}'
    return _caller_site()


def _recorded(name: str, index: int, original: Callable) -> Callable:

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        tensor = args[index] if len(args) > index else None
        if isinstance(tensor, (list, tuple)):
            tensor = tensor[0] if tensor else None
        if torch.is_tensor(tensor):
            key = (name, tensor.device.type,
                   str(tensor.dtype).replace('torch.', ''), _plugin_site())
            _COLLECTIVES.calls[key] += 1
        return original(*args, **kwargs)

    return wrapper


def record_collectives() -> None:
    """Record every call of :data:`COLLECTIVES` (idempotent)."""
    if _COLLECTIVES.installed:
        return
    import torch.distributed as dist
    for name, index in COLLECTIVES.items():
        if hasattr(dist, name):
            setattr(dist, name, _recorded(name, index, getattr(dist, name)))
    _COLLECTIVES.installed = True


def collective_calls(reset: bool = False) -> List[Dict[str, Any]]:
    """The recorded calls, most frequent first.

    Args:
        reset: Start counting afresh afterwards.
    """
    calls = [
        dict(op=op, device=device, dtype=dtype, site=site, count=count)
        for (op, device, dtype,
             site), count in _COLLECTIVES.calls.most_common()
    ]
    if reset:
        _COLLECTIVES.calls.clear()
    return calls


def keep_comm_on_gpu() -> bool:
    """Under gloo with CUDA, mmengine's collectives keep their tensors on
    the GPU (as under NCCL) instead of copying them to the host.

    Returns:
        Whether mmengine's ``get_comm_device`` was patched.
    """
    import mmengine.dist.dist as mm_dist
    import torch.distributed as dist
    if _COLLECTIVES.comm_device_patched:
        return True
    if not (torch.cuda.is_available() and dist.is_initialized()
            and dist.get_backend() == dist.Backend.GLOO):
        return False
    original = mm_dist.get_comm_device

    @functools.wraps(original)
    def on_gpu(group=None):
        if dist.get_backend(group) == dist.Backend.GLOO:
            return torch.device('cuda', torch.cuda.current_device())
        return original(group)

    mm_dist.get_comm_device = on_gpu
    _COLLECTIVES.comm_device_patched = True
    return True


class _Steps:
    """What :class:`TwoRankRecord` keeps of this rank's run."""

    def __init__(self) -> None:
        self.steps: List[Dict[str, Any]] = []
        self.params: Dict[str, Any] = {}
        self.setup_collectives: List[Dict[str, Any]] = []


_STEPS = _Steps()


def parameter_digest(model: torch.nn.Module) -> Dict[str, Any]:
    """sha256 of every parameter's bytes (name order), their count and
    device: equal on every rank when DDP kept the replicas in step."""
    digest = hashlib.sha256()
    devices, count = set(), 0
    for name, param in sorted(model.named_parameters()):
        data = param.detach().reshape(-1).cpu()
        digest.update(name.encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
        devices.add(str(param.device))
        count += data.numel()
    return dict(
        sha256=digest.hexdigest(), numel=count, devices=sorted(devices))


@HOOKS.register_module()
class TwoRankRecord(Hook):
    """Keeps every settled step's values on this rank (see the module).

    Before training, sets the runner's set-up collectives apart (their
    count starts afresh), keeps mmengine's collectives on the GPU under
    gloo (:func:`keep_comm_on_gpu`) and subscribes to
    ``DeferredRuntimeInfoHook`` for every rank's values (the all-reduced
    table the DivergenceHook also reads); at the end of the run, a digest
    of the parameters.
    """

    priority = 'LOWEST'

    def before_train(self, runner) -> None:
        from mmae_plugin.engine.hooks.deferred_runtime_info_hook import \
            deferred_runtime_info_hook

        # The runner's set-up (weights' broadcast, seeds) apart: what
        # follows is the training's.
        _STEPS.setup_collectives = collective_calls(reset=True)
        keep_comm_on_gpu()
        hook = deferred_runtime_info_hook(runner)
        if hook is None:
            raise RuntimeError('TwoRankRecord needs DeferredRuntimeInfoHook '
                               '(default_hooks.runtime_info)')
        hook.subscribe(self._listen, every_rank=True)

    @staticmethod
    def _listen(runner, step) -> None:
        _STEPS.steps.append(
            dict(
                iteration=step.iteration,
                values={k: float(v)
                        for k, v in step.values.items()},
                every_rank=step.every_rank))

    def after_run(self, runner) -> None:
        _STEPS.params = parameter_digest(runner.model)


def two_rank_record() -> Dict[str, Any]:
    """This rank's steps, parameter digest, the collectives of the set-up
    and of the training (the count starts afresh)."""
    return dict(
        steps=_STEPS.steps,
        params=_STEPS.params,
        setup_collectives=_STEPS.setup_collectives,
        collectives=collective_calls(reset=True),
        comm_device_patched=_COLLECTIVES.comm_device_patched)


def reduce_scatter_probe(device: torch.device) -> Dict[str, Any]:
    """The regulariser's gather backward both ways, on ``device``.

    Gathers 3 rows of 2 float32 per rank with
    :class:`~mmae_plugin.models.utils.gather.RowGatherer` (``'global'``),
    then back-propagates ``sum(rows * w)`` (the same ``w`` on every rank,
    so this rank's gradient is ``world_size * w`` of its slot): once as the
    backend has it (gloo: ``all_reduce``), once with the NCCL branch
    (``reduce_scatter_tensor``) forced. Call on every rank.

    Returns:
        The gradients' agreement, each branch's error (None if it ran).
    """
    import torch.distributed as dist

    from mmae_plugin.models.utils.gather import RowGatherer

    world, rank = dist.get_world_size(), dist.get_rank()
    x = (torch.arange(6, dtype=torch.float32, device=device).reshape(3, 2) +
         10 * rank).requires_grad_()
    gatherer = RowGatherer(capacity=3, what='probe rows')

    def gradient() -> torch.Tensor:
        x.grad = None
        rows = gatherer(x, 'global').rows
        weights = torch.arange(
            1, rows.numel() + 1, dtype=rows.dtype,
            device=rows.device).reshape(rows.shape)
        (rows * weights).sum().backward()
        return x.grad.detach().clone()

    expected = (
        torch.arange(1, 3 * 2 * world + 1, dtype=torch.float32).reshape(
            world, 3, 2)[rank] * world)
    result = dict(device=str(x.device), backend=str(dist.get_backend()))
    for branch in ('all_reduce', 'reduce_scatter_tensor'):
        original = dist.get_backend
        if branch == 'reduce_scatter_tensor':
            dist.get_backend = lambda group=None: dist.Backend.NCCL
        try:
            grad = gradient().cpu()
            result[branch] = dict(
                ran=True,
                error=None,
                equals_expected=bool(torch.equal(grad, expected)))
        except Exception as error:  # noqa: BLE001 (reported)
            result[branch] = dict(
                ran=False,
                error=f'{type(error).__name__}: {error}'[:500],
                equals_expected=None)
        finally:
            dist.get_backend = original
    return result
