"""Multi-process training on a machine without any accelerator.

mmengine 0.10.7's ``_init_dist_pytorch`` needs CUDA, and its DDP wrappers
pass ``device_ids=[LOCAL_RANK]``, which DDP rejects for CPU modules.

* :class:`CpuDistributedRunnerMixin` (before ``Runner``): ``setup_env``
  initialises the process group first (gloo for NCCL), so mmengine skips
  ``init_dist``; ``wrap_model`` gives the DDP wrapper ``device_ids=None``.
* :class:`CpuDistributedFlexibleRunnerMixin` (before ``FlexibleRunner``):
  ``build_strategy`` does the same for ``DDPStrategy`` and its subclasses.

Both act only with ``launcher='pytorch'`` and no CUDA, NPU, MLU or MUSA
device; otherwise upstream's code runs untouched. Without the plugin's
runner, the config choice that does the same:
docs/upstream_workarounds.md#runners-multi-process-training-without-an-accelerator
"""
import datetime
from typing import Any, Dict, Optional

import torch


def has_dist_accelerator() -> bool:
    """Whether mmengine's ``_init_dist_pytorch`` has a device to set.

    Returns:
        True if CUDA, or an NPU, MLU or MUSA device (as mmengine's own probes
        in ``mmengine.dist.utils`` see them), is available.
    """
    import mmengine.dist.utils as dist_utils
    return (torch.cuda.is_available() or dist_utils.is_npu_available()
            or dist_utils.is_mlu_available() or dist_utils.is_musa_available())


def needs_cpu_process_group(launcher: Optional[str]) -> bool:
    """Whether this process must initialise the group without a device.

    Args:
        launcher: The runner's launcher (``'none'``, ``'pytorch'``, ...).

    Returns:
        True for ``launcher='pytorch'`` on a host without an accelerator,
        when no process group exists yet.
    """
    return (launcher == 'pytorch' and torch.distributed.is_available()
            and not torch.distributed.is_initialized()
            and not has_dist_accelerator())


def init_cpu_process_group(dist_cfg: Optional[Dict[str, Any]]) -> None:
    """Initialise the process group as ``init_dist`` would, without a device.

    Does what mmengine's ``init_dist('pytorch', **dist_cfg)`` does on a CUDA
    host except ``torch.cuda.set_device``: the same timeout conversion and
    ``init_process_group`` keyword arguments; only ``nccl`` (mmengine's
    default) becomes ``gloo``. (``init_dist`` also sets the ``spawn`` start
    method if none is set; mmengine's ``set_multi_processing`` has always
    set one by then, so it is left to it.)

    Args:
        dist_cfg: ``env_cfg.dist_cfg`` (``backend``, ``timeout``, other
            ``init_process_group`` arguments), or None.
    """
    kwargs = dict(dist_cfg or {})
    backend = kwargs.pop('backend', 'nccl')
    if kwargs.get('timeout') is not None:
        kwargs['timeout'] = datetime.timedelta(seconds=kwargs['timeout'])
    torch.distributed.init_process_group(
        backend='gloo' if backend == 'nccl' else backend, **kwargs)


def cpu_ddp_wrapper_cfg(wrapper_cfg: Optional[Dict[str, Any]],
                        **defaults: Any) -> Optional[Dict[str, Any]]:
    """The DDP wrapper config with ``device_ids=None`` unless it names some.

    Args:
        wrapper_cfg: ``model_wrapper_cfg`` / ``model_wrapper``, or None.
        **defaults: What mmengine uses when no wrapper is configured.

    Returns:
        A new config whose ``device_ids`` is None if the given one had no
        ``device_ids`` and wraps in a ``DistributedDataParallel``; the given
        config itself otherwise.
    """
    if wrapper_cfg is None:
        return dict(
            type='MMDistributedDataParallel', device_ids=None, **defaults)
    if not isinstance(wrapper_cfg, dict) or 'device_ids' in wrapper_cfg:
        return wrapper_cfg
    from mmengine.registry import MODEL_WRAPPERS
    from torch.nn.parallel import DistributedDataParallel
    wrapper_type = wrapper_cfg.get('type', 'MMDistributedDataParallel')
    if isinstance(wrapper_type, str):
        wrapper_type = MODEL_WRAPPERS.get(wrapper_type)
    if not (isinstance(wrapper_type, type)
            and issubclass(wrapper_type, DistributedDataParallel)):
        return wrapper_cfg
    return dict(wrapper_cfg, device_ids=None)


class CpuDistributedRunnerMixin:
    """``Runner`` behaviour for ``--launcher pytorch`` without a device.

    Goes before mmengine's ``Runner`` in the bases (see module).
    """

    def setup_env(self, env_cfg: Dict) -> None:
        """Initialise gloo without a device, then set up as mmengine does.

        Args:
            env_cfg: The runner's ``env_cfg``.
        """
        if self.distributed and needs_cpu_process_group(self.launcher):
            # Before mmengine's setup_env, which then finds the group
            # initialised and skips init_dist (and its set_device).
            init_cpu_process_group(env_cfg.get('dist_cfg'))
        super().setup_env(env_cfg)

    def wrap_model(self, model_wrapper_cfg: Optional[Dict],
                   model: torch.nn.Module) -> Any:
        """Wrap as mmengine does; DDP of a CPU module gets no device ids.

        Args:
            model_wrapper_cfg: The config's ``model_wrapper_cfg``.
            model: The model to wrap.

        Returns:
            What mmengine's ``wrap_model`` returns.
        """
        from mmengine.model import is_model_wrapper
        if self.distributed and not is_model_wrapper(model) and \
                not has_dist_accelerator():
            model_wrapper_cfg = cpu_ddp_wrapper_cfg(
                model_wrapper_cfg,
                broadcast_buffers=False,
                find_unused_parameters=self.cfg.get('find_unused_parameters',
                                                    False))
        return super().wrap_model(model_wrapper_cfg, model)


class CpuDistributedFlexibleRunnerMixin:
    """``FlexibleRunner`` behaviour for DDP / FSDP strategies without a
    device. Goes before mmengine's ``FlexibleRunner`` (see module)."""

    def build_strategy(self,
                       strategy: Any = None,
                       launcher: str = 'none',
                       randomness: Optional[dict] = None,
                       env_cfg: dict = dict(dist_cfg=dict(backend='nccl')),
                       **kwargs: Any) -> Any:
        """Initialise gloo without a device, then build as mmengine does.

        Args:
            strategy: A strategy object or the config's ``strategy`` dict.
            launcher: The launcher.
            randomness: The ``randomness`` config.
            env_cfg: The ``env_cfg`` config.
            **kwargs: More ``FlexibleRunner.build_strategy`` arguments.

        Returns:
            The strategy mmengine builds.
        """
        strategy_type = ddp_strategy_type(strategy, launcher)
        if strategy_type is not None and needs_cpu_process_group(launcher):
            init_cpu_process_group((env_cfg or {}).get('dist_cfg'))
            from mmengine._strategy import FSDPStrategy
            if not issubclass(strategy_type, FSDPStrategy):
                strategy = dict(strategy or dict(type='DDPStrategy'))
                strategy['model_wrapper'] = cpu_ddp_wrapper_cfg(
                    strategy.get('model_wrapper'), broadcast_buffers=False)
        return super().build_strategy(
            strategy,
            launcher=launcher,
            randomness=randomness,
            env_cfg=env_cfg,
            **kwargs)


def ddp_strategy_type(strategy: Any, launcher: str) -> Optional[type]:
    """The strategy class mmengine will build, if it is DDP-like.

    Args:
        strategy: ``FlexibleRunner``'s ``strategy`` argument.
        launcher: The launcher (``'none'`` builds ``SingleDeviceStrategy``).

    Returns:
        ``DDPStrategy`` or a subclass (``FSDPStrategy``, the plugin's
        ``MMAEFSDPStrategy``), which initialise torch's process group
        through ``init_dist``; None for built strategies, DeepSpeed,
        ColossalAI and single-device runs.
    """
    from mmengine._strategy import DDPStrategy
    from mmengine.registry import STRATEGIES
    if launcher == 'none' or not (strategy is None
                                  or isinstance(strategy, dict)):
        return None
    strategy_type = (strategy or {}).get('type', 'DDPStrategy')
    if isinstance(strategy_type, str):
        strategy_type = STRATEGIES.get(strategy_type)
    if isinstance(strategy_type, type) and \
            issubclass(strategy_type, DDPStrategy):
        return strategy_type
    return None


__all__ = [
    'CpuDistributedRunnerMixin', 'CpuDistributedFlexibleRunnerMixin',
    'has_dist_accelerator', 'init_cpu_process_group', 'cpu_ddp_wrapper_cfg'
]
