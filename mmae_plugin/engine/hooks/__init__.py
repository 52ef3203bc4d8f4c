"""Hooks registered in mmpretrain.registry.HOOKS."""
from .attention_locality_hook import AttentionLocalityHook  # noqa: F401
from .checkpoint_hook import (NonFiniteCheckpointError,  # noqa: F401
                              SafeCheckpointHook)
from .divergence_hook import DivergenceHook, TrainingDivergedError  # noqa: F401
from .glibc_malloc_hook import GlibcMallocHook  # noqa: F401
from .matrix_info_hook import MatrixInfoHook  # noqa: F401
from .regularizer_skip_hook import RegularizerSkipHook  # noqa: F401
from .reseed_hook import ReseedHook  # noqa: F401
