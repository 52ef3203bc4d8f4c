"""Every workaround for an upstream incompatibility, in one place.

mmengine 0.10.7 and mmpretrain 1.2.0 predate several PyTorch and setuptools
changes. Each fix below names the upstream problem and what release removes
the need for it, so that it can be deleted on that day. All fixes are applied
once, by :func:`apply_all`, when ``mmae_plugin`` is imported (configs do that
with ``custom_imports``). Each changes behaviour only in the situation it
describes and hands every other case to the upstream code untouched; on a GPU
cluster with NCCL, the distributed set-up is upstream's.
"""
import builtins
import functools
import locale
import os
import os.path as osp
import pickle
import re
import stat
import tempfile
import types
from typing import IO, Any, Callable, Dict, List, Optional, Union

import torch
from mmengine.logging.history_buffer import HistoryBuffer

_APPLIED = False


# --------------------------------------------------------------------------
# (a) Checkpoints under ``torch.load(weights_only=True)``.
#
# Upstream: torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``;
# mmengine 0.10.7 (``mmengine.runner.checkpoint``) calls ``torch.load``
# without the argument, so resume, ``load_from``, ``Pretrained`` init and
# ``mmpretrain.get_model`` fail with "Unsupported global: mmengine.logging.
# history_buffer.HistoryBuffer". Not fixed in any mmengine release as of
# 0.10.7. Switching the check off (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD) would let
# a checkpoint run arbitrary code; instead the exact classes an mmengine
# checkpoint stores are allow-listed and the protection stays on.
#
# The allow-list must not be changeable by the data it loads. Upstream's
# ``HistoryBuffer.__setstate__`` copies the checkpoint's ``statistics_methods``
# into the class-level ``HistoryBuffer._statistics_methods`` (so a checkpoint
# could redefine ``mean`` as ``min`` for the whole process), so under
# ``weights_only`` the class path of ``HistoryBuffer`` resolves to
# :class:`CheckpointHistoryBuffer`, whose ``__setstate__`` only checks the
# checkpoint's statistics against this process's and turns the object into a
# plain ``HistoryBuffer``. Ordinary pickling (``copy.deepcopy``, full
# ``pickle``) keeps upstream's ``__setstate__``.
# --------------------------------------------------------------------------
#: The statistics ``HistoryBuffer`` defines itself; the only names the
#: restricted ``getattr`` below resolves, whatever a checkpoint contains.
BUILTIN_STATISTICS = ('min', 'max', 'current', 'mean')


class RegisteredStatistic:
    """Inert stand-in a checkpoint gets for a statistic registered by code.

    A statistic registered with ``HistoryBuffer.register_statistics`` is
    pickled by its import path (``my_module.my_stat``). Allow-listing the
    function itself would let a checkpoint call it with arguments of its
    choosing; the path resolves to this object instead, which cannot be
    called or instantiated, and which :class:`CheckpointHistoryBuffer`
    compares with the statistic this process registered.

    Args:
        name: The statistic's name in ``HistoryBuffer._statistics_methods``.
        method: The function registered under that name.
    """

    __slots__ = ('name', 'method')

    def __init__(self, name: str, method: Callable) -> None:
        self.name, self.method = name, method

    def __repr__(self) -> str:
        return f'RegisteredStatistic({self.name!r})'


class RegisteredStatisticOwner:
    """Inert stand-in for the class a registered statistic is defined in.

    Pickle protocol 2 (``torch.save``'s default) stores ``Owner.my_stat`` as
    ``getattr(Owner, 'my_stat')``; this object lets the restricted
    ``getattr`` resolve exactly the registered paths below ``Owner``.

    Args:
        path: Import path of the owner (``my_module.Owner``).
    """

    __slots__ = ('path', )

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f'RegisteredStatisticOwner({self.path!r})'


# Import path -> stand-in, for statistics registered by code in this process
# (never by a checkpoint: CheckpointHistoryBuffer registers nothing).
_REGISTERED_STATISTICS: Dict[str, Any] = {}


def history_buffer_statistic(owner: Any, name: str) -> Any:
    """Stand-in for ``getattr`` that only fetches HistoryBuffer statistics.

    mmengine's ``HistoryBuffer`` pickles its statistics methods as
    ``getattr(HistoryBuffer, 'min')``. Allow-listing the real ``getattr``
    would let a checkpoint reach any attribute of any allowed object, so
    ``getattr`` in a checkpoint resolves to this function instead. The names
    it resolves are fixed (:data:`BUILTIN_STATISTICS`, plus statistics that
    code registered in this process under a class), never read from state a
    checkpoint can change.

    Args:
        owner: The object the pickle asks an attribute of.
        name: The attribute name.

    Returns:
        The statistics method, or the stand-in of a registered one.
    """
    if type(name) is str:
        if (owner is HistoryBuffer or owner is CheckpointHistoryBuffer) \
                and name in BUILTIN_STATISTICS:
            return HistoryBuffer.__dict__[name]
        if type(owner) is RegisteredStatisticOwner:
            found = _REGISTERED_STATISTICS.get(f'{owner.path}.{name}')
            if found is not None:
                return found
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only the '
        f'HistoryBuffer statistics {BUILTIN_STATISTICS} and statistics '
        'registered by code in this process are allowed under weights_only')


class CheckpointHistoryBuffer(HistoryBuffer):
    """What a checkpoint's ``HistoryBuffer`` is rebuilt as under weights_only.

    ``torch.load(weights_only=True)`` calls ``__setstate__`` of the class the
    pickle names; mapping ``HistoryBuffer``'s path to this subclass replaces
    upstream's ``__setstate__`` for checkpoint loads only. The object becomes
    a plain ``HistoryBuffer`` once its state is set.
    """

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(
                f'HistoryBuffer state must be a dict, got {type(state)}')
        state = dict(state)
        check_checkpoint_statistics(state.pop('statistics_methods', {}))
        unknown = set(state) - set(vars(HistoryBuffer()))
        if unknown:
            raise pickle.UnpicklingError(
                f'HistoryBuffer state has unknown attribute(s) '
                f'{sorted(map(repr, unknown))}')
        # Inserts only the four built-ins if missing, as HistoryBuffer() does.
        self._set_default_statistics()
        self.__dict__.update(state)
        self.__class__ = HistoryBuffer


def check_checkpoint_statistics(statistics: Any) -> None:
    """Refuse a checkpoint whose statistics differ from this process's.

    Args:
        statistics: The ``statistics_methods`` a checkpoint's HistoryBuffer
            carries, name -> function (or :class:`RegisteredStatistic`).

    Raises:
        pickle.UnpicklingError: If a name is not registered here with the
            very same function.
    """
    if not isinstance(statistics, dict):
        raise pickle.UnpicklingError(
            f'HistoryBuffer statistics_methods must be a dict, got '
            f'{type(statistics)}')
    HistoryBuffer()  # the built-in four are registered on the first instance
    registered = HistoryBuffer._statistics_methods
    for name, method in statistics.items():
        if type(method) is RegisteredStatistic:
            method = method.method if method.name == name else None
        if type(name) is not str or registered.get(name) is not method:
            raise pickle.UnpicklingError(
                f'checkpoint HistoryBuffer statistic {name!r} is {method!r}, '
                f'but this process has {registered.get(name)!r}; a checkpoint '
                'cannot define or redefine statistics (register yours with '
                'HistoryBuffer.register_statistics before loading)')


def allow_registered_statistic(method: Callable) -> None:
    """Let checkpoints name a statistic that code registered in this process.

    Args:
        method: The function passed to ``HistoryBuffer.register_statistics``.
    """
    module = getattr(method, '__module__', None)
    qualname = getattr(method, '__qualname__', '')
    if not module or not qualname or '<locals>' in qualname:
        return  # pickle cannot store it by path, so no checkpoint names it
    parts = qualname.split('.')
    safe = [(RegisteredStatistic(method.__name__, method),
             f'{module}.{qualname}')]
    for depth in range(1, len(parts)):
        owner = '.'.join([module] + parts[:depth])
        safe.append((RegisteredStatisticOwner(owner), owner))
    for stand_in, path in safe:
        _REGISTERED_STATISTICS[path] = stand_in
    torch.serialization.add_safe_globals(safe)


def remember_registered_statistics() -> None:
    """Allow-list statistics registered by code, now and later, by path.

    Upstream: mmengine 0.10.7 pickles registered statistics by path, so a
    checkpoint of a process that registered one was refused with
    "Unsupported global: <module>.my_stat". Statistics registered before
    ``mmae_plugin`` was imported count as registered by code: before the
    plugin, no checkpoint holding a HistoryBuffer loads under weights_only.
    """
    original = HistoryBuffer.register_statistics.__func__
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def register_statistics(cls, method: Callable) -> Callable:
        method = original(cls, method)
        allow_registered_statistic(method)
        return method

    register_statistics._mmae_fixed = True
    HistoryBuffer.register_statistics = classmethod(register_statistics)
    HistoryBuffer()  # registers the built-in four
    for name, method in list(HistoryBuffer._statistics_methods.items()):
        if name not in BUILTIN_STATISTICS:
            allow_registered_statistic(method)


def checkpoint_safe_globals() -> List[Any]:
    """Classes and functions an mmengine/mmpretrain checkpoint pickles.

    Returns:
        The objects to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config.config import ConfigDict

    # numpy arrays and scalars inside HistoryBuffer (message hub) and meta.
    numpy_core = getattr(np, '_core', None) or np.core
    dtype_classes = [type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)]
    return [
        (CheckpointHistoryBuffer,
         f'{HistoryBuffer.__module__}.{HistoryBuffer.__qualname__}'),
        ConfigDict, np.ndarray, np.dtype,
        numpy_core.multiarray._reconstruct, numpy_core.multiarray.scalar,
        *dtype_classes,
        # pickle protocol 2 spells the builtin module ``__builtin__``.
        (history_buffer_statistic, '__builtin__.getattr'),
        (history_buffer_statistic, 'builtins.getattr'),
    ]


def allow_mmengine_checkpoints() -> None:
    """Allow-list mmengine's checkpoint contents for ``weights_only`` loads."""
    torch.serialization.add_safe_globals(checkpoint_safe_globals())


# --------------------------------------------------------------------------
# (a2) Checkpoints from URLs unpickled in full.
#
# Upstream: mmengine 0.10.7 ``load_from_http`` (used by ``http(s)://``,
# ``torchvision://``, ``modelzoo://``, ``open-mmlab://``, ``openmmlab://``,
# ``mmcls://`` and so by ``load_from``, ``--resume``, ``Pretrained`` init and
# ``mmpretrain.get_model``) calls ``torch.hub.load_state_dict_from_url``,
# whose ``weights_only`` defaults to False: any downloaded or cached
# checkpoint could run code. Its ``torch.load`` calls for local files rely on
# torch's default, which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns off.
# Not fixed in any mmengine release as of 0.10.7. The URL loader gets
# ``weights_only=True`` and the checkpoint module's ``torch.load`` passes it
# explicitly (an explicit argument is not overridden by that variable).
# --------------------------------------------------------------------------
class TorchWithWeightsOnlyLoad(types.ModuleType):
    """``torch`` as seen by ``mmengine.runner.checkpoint``: loads are safe.

    Every attribute is torch's own except :meth:`load`, which always passes
    ``weights_only=True``.
    """

    def __init__(self) -> None:
        super().__init__(torch.__name__, torch.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(f: Any, *args, **kwargs) -> Any:
        """``torch.load`` with ``weights_only=True`` whatever is asked."""
        kwargs['weights_only'] = True
        return torch.load(f, *args, **kwargs)


def load_checkpoints_weights_only() -> None:
    """Make every mmengine checkpoint scheme load with weights_only=True."""
    import mmengine.runner.checkpoint as checkpoint_module
    import mmengine.utils.dl_utils as dl_utils
    import mmengine.utils.dl_utils.hub as hub

    if not isinstance(checkpoint_module.torch, TorchWithWeightsOnlyLoad):
        checkpoint_module.torch = TorchWithWeightsOnlyLoad()

    original = hub.load_url
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def load_url(url: str, *args, **kwargs) -> Any:
        kwargs['weights_only'] = True
        return original(url, *args, **kwargs)

    load_url._mmae_fixed = True
    for module in (hub, dl_utils, checkpoint_module):
        module.load_url = load_url


# --------------------------------------------------------------------------
# (b) ``_scope_`` reaching ``collate_fn``.
#
# Upstream: configs inherited through ``mmpretrain::`` get a ``_scope_`` key
# in every typed dict; mmengine 0.10.7 ``Runner.build_dataloader`` forwards
# all remaining keys of ``collate_fn`` to the function, which fails with
# "default_collate() got an unexpected keyword argument '_scope_'". Not
# fixed in any mmengine release as of 0.10.7.
# --------------------------------------------------------------------------
def strip_collate_scope() -> None:
    """Drop ``_scope_`` from ``collate_fn`` configs before mmengine reads them."""
    from mmengine.runner import Runner

    original = Runner.build_dataloader
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def build_dataloader(dataloader, *args, **kwargs):
        if isinstance(dataloader, dict) and isinstance(
                dataloader.get('collate_fn'), dict):
            dataloader = dataloader.copy()
            collate_fn = dict(dataloader['collate_fn'])
            collate_fn.pop('_scope_', None)
            dataloader['collate_fn'] = collate_fn
        return original(dataloader, *args, **kwargs)

    build_dataloader._mmae_fixed = True
    Runner.build_dataloader = staticmethod(build_dataloader)


# --------------------------------------------------------------------------
# (c) Multi-process training on a machine without any accelerator.
#
# Upstream: mmengine 0.10.7 ``_init_dist_pytorch`` calls
# ``torch.cuda.set_device`` whenever no NPU/MLU/MUSA is found, which fails
# without CUDA, and the default dist backend is NCCL, which needs CUDA;
# ``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to DDP, which DDP
# rejects for CPU modules. Not fixed in any mmengine release as of 0.10.7.
# Only when there is no CUDA, NPU, MLU or MUSA device (the probes upstream
# dispatches on) and ``init_backend='torch'``: ``set_device`` is skipped,
# NCCL becomes gloo and any other requested backend (gloo, mpi) is used as
# requested. Every other case (an accelerator, deepspeed, colossalai) runs
# upstream's code untouched.
# --------------------------------------------------------------------------
def has_dist_accelerator() -> bool:
    """Whether mmengine's ``_init_dist_pytorch`` has a device to set.

    Returns:
        True if CUDA, or an NPU, MLU or MUSA device (as mmengine's own probes
        in ``mmengine.dist.utils`` see them), is available.
    """
    import mmengine.dist.utils as dist_utils
    return (torch.cuda.is_available() or dist_utils.is_npu_available()
            or dist_utils.is_mlu_available()
            or dist_utils.is_musa_available())


def enable_cpu_distributed() -> None:
    """Let ``--launcher pytorch`` and DDP run on machines without CUDA."""
    import mmengine.dist.utils as dist_utils
    from mmengine.model import MMDistributedDataParallel

    original_init = dist_utils._init_dist_pytorch
    if not getattr(original_init, '_mmae_fixed', False):

        @functools.wraps(original_init)
        def init_dist_pytorch(backend: str, init_backend: str = 'torch',
                              **kwargs) -> None:
            if init_backend != 'torch' or has_dist_accelerator():
                return original_init(backend, init_backend, **kwargs)
            torch.distributed.init_process_group(
                backend='gloo' if backend == 'nccl' else backend, **kwargs)

        init_dist_pytorch._mmae_fixed = True
        dist_utils._init_dist_pytorch = init_dist_pytorch

    original_ddp_init = MMDistributedDataParallel.__init__
    if not getattr(original_ddp_init, '_mmae_fixed', False):

        @functools.wraps(original_ddp_init)
        def ddp_init(self, module, detect_anomalous_params=False, **kwargs):
            if _has_only_cpu_params(module):
                kwargs['device_ids'] = None
            original_ddp_init(self, module, detect_anomalous_params, **kwargs)

        ddp_init._mmae_fixed = True
        MMDistributedDataParallel.__init__ = ddp_init


def _has_only_cpu_params(module: torch.nn.Module) -> bool:
    devices = {p.device.type for p in module.parameters()}
    return devices <= {'cpu'}


# --------------------------------------------------------------------------
# (e) Checkpoints written in place.
#
# Upstream: mmengine 0.10.7 ``LocalBackend.put`` / ``put_text`` open the
# target with 'wb' / 'w' and write into it, and ``CheckpointHook`` writes
# ``last_checkpoint`` with ``open(..., 'w')``, so a job killed while saving
# leaves a truncated ``epoch_N.pth`` or an empty ``last_checkpoint``: resume
# then fails. Not fixed in any mmengine release as of 0.10.7. Writing to a
# temporary file ``.<name>.XXXXXXXX.tmp`` beside the target and renaming it
# over the target makes every save all-or-nothing.
#
# Only where a rename is equivalent to upstream's in-place write: the target
# (after following symlinks, so a symlink is written through as upstream
# does) is missing or a regular file with one link owned by us, and its
# folder accepts a new file. Hard links, FIFOs, devices and files of other
# owners get upstream's in-place write. The new file gets the old file's
# mode, or ``0o666 & ~umask`` like ``open``. Temporary files left by a killed
# write (``.<name>.<pid>.XXXXXXXX.tmp``) are removed by the next write of the
# same file and, in the work and checkpoint folders, when training starts,
# once the process that wrote them is gone: every rank of a job may write the
# same file (mmengine dumps test metrics on each rank), and one writer must
# not delete another's live temporary.
# --------------------------------------------------------------------------
_TMP_NAME = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$')


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows.

    Returns:
        The umask bits.
    """
    try:
        with builtins.open('/proc/self/status') as status:
            for line in status:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_target(filepath: Union[str, 'os.PathLike']) -> Optional[str]:
    """Where an atomic write of ``filepath`` goes, or None for upstream's.

    Args:
        filepath: The path ``put``/``put_text`` was given.

    Returns:
        The real path to replace, or None when only an in-place write keeps
        upstream's semantics (hard link, special file, another owner, missing
        folder of a symlink's target).
    """
    real = osp.realpath(filepath)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return real if osp.isdir(osp.dirname(real)) else None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or \
            info.st_uid != os.geteuid():
        return None
    return real


def remove_orphan_temporaries(folder: str, name: Optional[str] = None) -> None:
    """Delete temporaries of interrupted atomic writes whose writer is gone.

    Args:
        folder: Where to look.
        name: Only those of this target file name; None for all.
    """
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        match = _TMP_NAME.match(entry)
        if match and (name is None or match.group('name') == name) \
                and not _process_alive(int(match.group('pid'))):
            try:
                os.remove(osp.join(folder, entry))
            except OSError:
                pass


def write_atomically(data: Union[bytes, str], filepath: str,
                     mode: str = 'wb',
                     encoding: Optional[str] = None) -> None:
    """Write ``data`` to ``filepath`` so readers see the old or new file only.

    Args:
        data: Bytes-like for ``mode='wb'``, str for ``mode='w'``; anything
            else raises TypeError (as ``open(...).write`` does) and leaves
            the target untouched.
        filepath: Destination: a real path whose folder exists (see
            :func:`atomic_write_target`).
        mode: ``'wb'`` or ``'w'``.
        encoding: Text encoding for ``mode='w'``.
    """
    if mode not in ('wb', 'w'):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    folder, name = osp.split(filepath)
    try:
        file_mode = stat.S_IMODE(os.stat(filepath).st_mode)
    except FileNotFoundError:
        file_mode = 0o666 & ~current_umask()
    remove_orphan_temporaries(folder, name)
    fd, tmp_path = tempfile.mkstemp(
        dir=folder, prefix=f'.{name}.{os.getpid()}.', suffix='.tmp')
    try:
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, mode, encoding=encoding) as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_path, filepath)
    except BaseException:
        if osp.lexists(tmp_path):
            os.remove(tmp_path)
        raise


def write_local_files_atomically() -> None:
    """Route mmengine's local ``put`` and ``put_text`` through a rename."""
    from mmengine.fileio.backends import LocalBackend

    upstream_put, upstream_put_text = LocalBackend.put, LocalBackend.put_text
    if getattr(upstream_put, '_mmae_fixed', False):
        return

    def write(obj: Any, filepath, mode: str, encoding: Optional[str],
              upstream: Callable[[], None]) -> None:
        os.makedirs(osp.dirname(filepath) or '.', exist_ok=True)
        target = atomic_write_target(filepath)
        if target is None:
            return upstream()
        try:
            write_atomically(obj, target, mode, encoding)
        except PermissionError:
            upstream()  # a writable file in a folder we may not add to

    @functools.wraps(upstream_put)
    def put(self, obj: bytes, filepath) -> None:
        write(obj, filepath, 'wb', None,
              lambda: upstream_put(self, obj, filepath))

    @functools.wraps(upstream_put_text)
    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        write(obj, filepath, 'w', encoding,
              lambda: upstream_put_text(self, obj, filepath, encoding))

    put._mmae_fixed = put_text._mmae_fixed = True
    LocalBackend.put, LocalBackend.put_text = put, put_text


class _AtomicTextFile:
    """File-like object for ``open(path, 'w')`` that writes on close."""

    def __init__(self, path: str) -> None:
        self.path, self._parts = path, []

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f'write() argument must be str, not '
                            f'{type(text).__name__}')
        self._parts.append(text)
        return len(text)

    def __enter__(self) -> '_AtomicTextFile':
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            from mmengine.fileio.backends import LocalBackend
            LocalBackend().put_text(''.join(self._parts), self.path,
                                    locale.getpreferredencoding(False))


def open_last_checkpoint_atomically(file: Any, mode: str = 'r', *args,
                                    **kwargs) -> Union[IO, _AtomicTextFile]:
    """``open`` for ``mmengine.hooks.checkpoint_hook``.

    Args:
        file: Path to open.
        mode: As for ``open``.
        *args: As for ``open``.
        **kwargs: As for ``open``.

    Returns:
        A writer that replaces ``last_checkpoint`` atomically on close for
        ``open(<...>/last_checkpoint, 'w')``, else ``open``'s file object.
    """
    if mode == 'w' and not args and not kwargs and isinstance(
            file, (str, os.PathLike)) and \
            osp.basename(file) == 'last_checkpoint':
        return _AtomicTextFile(os.fspath(file))
    return builtins.open(file, mode, *args, **kwargs)


def write_last_checkpoint_atomically() -> None:
    """Write ``last_checkpoint`` atomically; clean up orphans at start."""
    import mmengine.hooks.checkpoint_hook as hook_module
    from mmengine.dist import is_main_process
    from mmengine.fileio.backends import LocalBackend

    hook_module.open = open_last_checkpoint_atomically
    hook_class = hook_module.CheckpointHook
    original = hook_class.before_train
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def before_train(self, runner) -> None:
        original(self, runner)
        if is_main_process() and isinstance(self.file_backend, LocalBackend):
            for folder in {str(self.out_dir), str(runner.work_dir)}:
                remove_orphan_temporaries(folder)

    before_train._mmae_fixed = True
    hook_class.before_train = before_train


# --------------------------------------------------------------------------
# (d) ``mmpretrain::`` config bases need ``pkg_resources``.
#
# Upstream: mmengine 0.10.7 resolves ``package::`` bases through
# ``pkg_resources``, removed in setuptools 82. Fixed on mmengine's main
# branch (importlib.metadata), not in a release as of 0.10.7. Our setup.py
# pins ``setuptools<82``; this check turns the obscure failure into a clear
# message for anyone who upgraded setuptools by hand.
# --------------------------------------------------------------------------
def require_pkg_resources() -> None:
    """Raise a clear error if ``pkg_resources`` (setuptools < 82) is missing."""
    try:
        import pkg_resources  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'mmengine 0.10.7 needs pkg_resources to resolve "mmpretrain::" '
            "config bases; install it with: pip install 'setuptools<82'"
        ) from err


FIXES: List[Callable[[], None]] = [
    require_pkg_resources,
    allow_mmengine_checkpoints,
    remember_registered_statistics,
    load_checkpoints_weights_only,
    strip_collate_scope,
    enable_cpu_distributed,
    write_local_files_atomically,
    write_last_checkpoint_atomically,
]


def apply_all() -> None:
    """Apply every workaround once (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    for fix in FIXES:
        fix()
    _APPLIED = True
