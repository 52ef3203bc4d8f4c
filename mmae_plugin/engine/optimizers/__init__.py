"""Optimizer-wrapper constructors registered in mmpretrain's registry."""
from .merged_groups_constructor import (
    MergedGroupsLearningRateDecayOptimWrapperConstructor,
    MergedGroupsOptimWrapperConstructor, merge_param_groups)

__all__ = [
    'MergedGroupsOptimWrapperConstructor',
    'MergedGroupsLearningRateDecayOptimWrapperConstructor',
    'merge_param_groups'
]
