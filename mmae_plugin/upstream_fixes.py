"""Every workaround for an upstream incompatibility, in one place.

mmengine 0.10.7 and mmpretrain 1.2.0 predate several PyTorch and setuptools
changes. Each fix below names the upstream problem and what release removes
the need for it, so that it can be deleted on that day. All fixes are applied
once, by :func:`apply_all`, when ``mmae_plugin`` is imported (configs do that
with ``custom_imports``). They only change behaviour in the situations they
describe; on a GPU cluster with NCCL nothing changes.
"""
import collections
import functools
import os
from typing import Any, Callable, List

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
def checkpoint_safe_globals() -> List[Any]:
    """Classes and functions an mmengine/mmpretrain checkpoint pickles.

    Returns:
        The objects to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config.config import ConfigDict
    from mmengine.logging.history_buffer import HistoryBuffer

    # numpy arrays inside HistoryBuffer (message hub) and in ``meta``.
    numpy_reconstruct = getattr(np, '_core', np.core).multiarray._reconstruct
    numpy_scalar = getattr(np, '_core', np.core).multiarray.scalar
    dtype_classes = [type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)]
    return [
        HistoryBuffer, ConfigDict, collections.OrderedDict,
        np.ndarray, np.dtype, numpy_reconstruct, numpy_scalar, *dtype_classes
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
    allow_mmengine_checkpoints,
    strip_collate_scope,
    enable_cpu_distributed,
]


def apply_all() -> None:
    """Apply every workaround once (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    if os.environ.get('MMAE_SKIP_PKG_RESOURCES_CHECK') != '1':
        require_pkg_resources()
    for fix in FIXES:
        fix()
    _APPLIED = True
