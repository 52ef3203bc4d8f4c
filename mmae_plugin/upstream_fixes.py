"""Every workaround for an upstream incompatibility, in one place.

mmengine 0.10.7 and mmpretrain 1.2.0 predate several PyTorch and setuptools
changes. Each fix below names the upstream problem and what release removes
the need for it, so that it can be deleted on that day. All fixes are applied
once, by :func:`apply_all`, when ``mmae_plugin`` is imported (configs do that
with ``custom_imports``). They only change behaviour in the situations they
describe; on a GPU cluster with NCCL nothing changes.
"""
import functools
import os
import pickle
import tempfile
from typing import Any, Callable, List, Union

import torch

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
# --------------------------------------------------------------------------
def history_buffer_statistic(owner: Any, name: str) -> Any:
    """Stand-in for ``getattr`` that only fetches HistoryBuffer statistics.

    mmengine's ``HistoryBuffer`` pickles its statistics methods (``min``,
    ``max``, ``mean``, ``current`` and registered ones) as
    ``getattr(HistoryBuffer, 'min')``. Allow-listing the real ``getattr``
    would let a checkpoint reach any attribute of any allowed object, so
    ``getattr`` in a checkpoint resolves to this function instead.

    Args:
        owner: The object the pickle asks an attribute of.
        name: The attribute name.

    Returns:
        The statistics method.
    """
    from mmengine.logging.history_buffer import HistoryBuffer
    # The built-in four are registered lazily, on the first instance.
    allowed = {'min', 'max', 'current', 'mean'} | set(
        HistoryBuffer._statistics_methods)
    if owner is HistoryBuffer and name in allowed:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only '
        'HistoryBuffer statistics methods are allowed under weights_only')


def checkpoint_safe_globals() -> List[Any]:
    """Classes and functions an mmengine/mmpretrain checkpoint pickles.

    Returns:
        The objects to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config.config import ConfigDict
    from mmengine.logging.history_buffer import HistoryBuffer

    # numpy arrays and scalars inside HistoryBuffer (message hub) and meta.
    numpy_core = getattr(np, '_core', None) or np.core
    dtype_classes = [type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)]
    return [
        HistoryBuffer, ConfigDict, np.ndarray, np.dtype,
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
# (c) Multi-process training on a CPU-only machine.
#
# Upstream: mmengine 0.10.7 ``_init_dist_pytorch`` calls
# ``torch.cuda.set_device`` unconditionally and the default dist backend is
# NCCL; ``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to DDP, which
# DDP rejects for CPU modules. Not fixed in any mmengine release as of
# 0.10.7. Without CUDA we use gloo and ``device_ids=None``; with CUDA the
# original code runs untouched.
# --------------------------------------------------------------------------
def enable_cpu_distributed() -> None:
    """Let ``--launcher pytorch`` and DDP run on machines without CUDA."""
    import mmengine.dist.utils as dist_utils
    from mmengine.model import MMDistributedDataParallel

    original_init = dist_utils._init_dist_pytorch
    if not getattr(original_init, '_mmae_fixed', False):

        @functools.wraps(original_init)
        def init_dist_pytorch(backend: str, init_backend: str = 'torch',
                              **kwargs) -> None:
            if torch.cuda.is_available():
                return original_init(backend, init_backend, **kwargs)
            torch.distributed.init_process_group(backend='gloo', **kwargs)

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
# target with 'wb' / 'w' and write into it, so a job killed while saving
# leaves a truncated ``epoch_N.pth`` (and ``last_checkpoint`` pointing at
# it): resume then fails. Not fixed in any mmengine release as of 0.10.7.
# Writing to a temporary file in the same folder and renaming it over the
# target makes every save all-or-nothing.
# --------------------------------------------------------------------------
def write_atomically(data: Union[bytes, str], filepath: str,
                     encoding: str = 'utf-8') -> None:
    """Write ``data`` to ``filepath`` so readers see the old or new file only.

    Args:
        data: Bytes, or text encoded with ``encoding``.
        filepath: Destination path; its folder is created if needed.
        encoding: Text encoding.
    """
    folder = os.path.dirname(os.path.abspath(filepath))
    os.makedirs(folder, exist_ok=True)
    payload = data.encode(encoding) if isinstance(data, str) else data
    fd, tmp_path = tempfile.mkstemp(
        dir=folder, prefix=f'.{os.path.basename(filepath)}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_path, filepath)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


def write_local_files_atomically() -> None:
    """Route mmengine's local ``put`` and ``put_text`` through a rename."""
    from mmengine.fileio.backends import LocalBackend

    def put(self, obj: bytes, filepath) -> None:
        write_atomically(obj, str(filepath))

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        write_atomically(obj, str(filepath), encoding)

    LocalBackend.put = put
    LocalBackend.put_text = put_text


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
    strip_collate_scope,
    enable_cpu_distributed,
    write_local_files_atomically,
]


def apply_all() -> None:
    """Apply every workaround once (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    for fix in FIXES:
        fix()
    _APPLIED = True
