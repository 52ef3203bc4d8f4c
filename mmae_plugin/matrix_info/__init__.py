"""Matrix information theory of representations (pure PyTorch).

No mmengine or mmpretrain imports here: everything is a differentiable
function of tensors.
"""
from .coding_rate import check_features, total_coding_rate

__all__ = ['check_features', 'total_coding_rate']
