"""Multi-process training on a machine without any accelerator.

Upstream: mmengine 0.10.7 ``_init_dist_pytorch`` calls
``torch.cuda.set_device`` whenever no NPU/MLU/MUSA is found, which fails
without CUDA, and the default dist backend is NCCL, which needs CUDA;
``Runner.wrap_model`` and ``DDPStrategy._wrap_model`` pass
``device_ids=[LOCAL_RANK]`` to DDP, which DDP rejects for CPU modules. Not
fixed in any mmengine release as of 0.10.7.

What changes, only when there is no CUDA, NPU, MLU or MUSA device (the
probes upstream dispatches on):

* with ``init_backend='torch'``: ``set_device`` is skipped, NCCL becomes
  gloo and any other requested backend (gloo, mpi) is used as requested;
* while ``Runner.wrap_model`` / ``DDPStrategy._wrap_model`` build
  ``MMDistributedDataParallel`` around a module whose parameters are all on
  the CPU, the ``device_ids=[LOCAL_RANK]`` that mmengine itself injects is
  dropped. ``device_ids`` (or ``output_device``) written in
  ``model_wrapper_cfg``, and any DDP built outside those two methods, reach
  torch as given, and torch refuses them for a CPU module with its own
  message naming both arguments.

Every other case (an accelerator, deepspeed, colossalai) runs upstream's
code untouched. On a CUDA host :func:`has_dist_accelerator` is True, so
neither wrapper changes anything: mmengine's ``set_device`` and NCCL run and
DDP gets ``device_ids=[LOCAL_RANK]`` as upstream passes it.
"""
import contextvars
import functools
import os
from typing import Any, List, Optional

import torch


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
    if not getattr(original_ddp_init, '_mmae_cpu_ddp', False):

        @functools.wraps(original_ddp_init)
        def ddp_init(self, module, detect_anomalous_params=False, **kwargs):
            injected = _MMENGINE_DEVICE_IDS.get()
            if injected is not None and kwargs.get('device_ids') == injected \
                    and _has_only_cpu_params(module):
                kwargs['device_ids'] = None
            original_ddp_init(self, module, detect_anomalous_params, **kwargs)

        ddp_init._mmae_cpu_ddp = True
        MMDistributedDataParallel.__init__ = ddp_init

    from mmengine._strategy import DDPStrategy
    from mmengine.runner import Runner
    _mark_injection(Runner, 'wrap_model',
                    lambda runner, args, kwargs: _config_arg(
                        args, kwargs, 'model_wrapper_cfg'))
    _mark_injection(DDPStrategy, '_wrap_model',
                    lambda strategy, args, kwargs: strategy.model_wrapper)


#: The ``device_ids`` mmengine injects in the wrapper being built, or None
#: outside mmengine's wrapping methods (and when the config names its own).
_MMENGINE_DEVICE_IDS: contextvars.ContextVar = contextvars.ContextVar(
    'mmengine_injected_device_ids', default=None)


def _config_arg(args: tuple, kwargs: dict, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[0] if args else None)


def injected_device_ids(wrapper_cfg: Any) -> Optional[List[int]]:
    """The ``device_ids`` mmengine adds to ``wrapper_cfg`` on a CPU host.

    Args:
        wrapper_cfg: ``model_wrapper_cfg`` (Runner) or ``model_wrapper``
            (DDPStrategy), None when not configured.

    Returns:
        ``[LOCAL_RANK]``, or None if the config sets ``device_ids`` itself,
        an accelerator exists or ``LOCAL_RANK`` is unset.
    """
    if has_dist_accelerator() or 'LOCAL_RANK' not in os.environ:
        return None
    if isinstance(wrapper_cfg, dict) and 'device_ids' in wrapper_cfg:
        return None
    return [int(os.environ['LOCAL_RANK'])]


def _mark_injection(owner: type, name: str, get_cfg) -> None:
    """Run ``owner.name`` with mmengine's injected device ids recorded."""
    original = getattr(owner, name)
    if getattr(original, '_mmae_cpu_ddp', False):
        return

    @functools.wraps(original)
    def wrap_model(self, *args, **kwargs):
        token = _MMENGINE_DEVICE_IDS.set(
            injected_device_ids(get_cfg(self, args, kwargs)))
        try:
            return original(self, *args, **kwargs)
        finally:
            _MMENGINE_DEVICE_IDS.reset(token)

    wrap_model._mmae_cpu_ddp = True
    setattr(owner, name, wrap_model)


def _has_only_cpu_params(module: torch.nn.Module) -> bool:
    devices = {p.device.type for p in module.parameters()}
    return devices <= {'cpu'}
