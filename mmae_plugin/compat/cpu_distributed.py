"""Multi-process training on a machine without any accelerator.

Upstream: mmengine 0.10.7 ``_init_dist_pytorch`` calls
``torch.cuda.set_device`` whenever no NPU/MLU/MUSA is found, which fails
without CUDA, and the default dist backend is NCCL, which needs CUDA;
``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to DDP, which DDP
rejects for CPU modules. Not fixed in any mmengine release as of 0.10.7.
Only when there is no CUDA, NPU, MLU or MUSA device (the probes upstream
dispatches on) and ``init_backend='torch'``: ``set_device`` is skipped,
NCCL becomes gloo and any other requested backend (gloo, mpi) is used as
requested. Every other case (an accelerator, deepspeed, colossalai) runs
upstream's code untouched.
"""
import functools

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
