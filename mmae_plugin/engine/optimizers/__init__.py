"""Optimizer wrappers and their constructors, in mmpretrain's registries."""
from .merged_groups_constructor import (
    MergedGroupsLearningRateDecayOptimWrapperConstructor,
    MergedGroupsOptimWrapperConstructor, merge_param_groups)
from .mixed_precision_wrapper import MixedPrecisionOptimWrapper

__all__ = [
    'MergedGroupsOptimWrapperConstructor',
    'MergedGroupsLearningRateDecayOptimWrapperConstructor',
    'merge_param_groups', 'MixedPrecisionOptimWrapper'
]
