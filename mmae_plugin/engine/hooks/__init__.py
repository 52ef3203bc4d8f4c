"""The plugin's MMEngine hooks, one per module.

Every hook registers in mmengine's root ``HOOKS`` registry: a config of any
OpenMMLab codebase (``default_scope`` mmpretrain, mmdet, or none) finds it,
since each codebase's registry falls back to the root; one registered in
mmpretrain's would be found only under ``default_scope = 'mmpretrain'``.
"""
from .attention_locality_hook import AttentionLocalityHook
from .checkpoint_hook import NonFiniteCheckpointError, SafeCheckpointHook
from .compile_hook import CompileHook
from .deferred_runtime_info_hook import DeferredRuntimeInfoHook
from .divergence_hook import DivergenceHook, TrainingDivergedError
from .glibc_malloc_hook import GlibcMallocHook
from .matrix_info_hook import MatrixInfoHook
from .online_probe_hook import OnlineProbeHook
from .regularizer_skip_hook import RegularizerSkipHook
from .reseed_hook import ReseedHook

__all__ = [
    'AttentionLocalityHook', 'NonFiniteCheckpointError', 'SafeCheckpointHook',
    'CompileHook', 'DeferredRuntimeInfoHook', 'DivergenceHook',
    'TrainingDivergedError', 'GlibcMallocHook', 'MatrixInfoHook',
    'OnlineProbeHook', 'RegularizerSkipHook', 'ReseedHook'
]
