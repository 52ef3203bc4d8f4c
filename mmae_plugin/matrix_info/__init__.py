"""Matrix information theory of representations (pure PyTorch).

No mmengine or mmpretrain imports here: everything is a differentiable
function of tensors, computed in float64 by default whatever the input dtype,
with natural logarithms. See ``docs/matrix_info.md``.
"""
from .coding_rate import total_coding_rate
from .divergence import (matrix_js_divergence, matrix_kl_divergence,
                         spectrum_js_divergence)
from .entropy import (hadamard_product, matrix_entropy, matrix_joint_entropy,
                      matrix_mutual_information)
from .kernels import FactoredPSD, normalized_covariance, normalized_gram
from .rank import effective_rank, rankme
from .validation import check_features

__all__ = [
    'check_features', 'total_coding_rate', 'matrix_entropy',
    'matrix_joint_entropy', 'matrix_mutual_information', 'hadamard_product',
    'matrix_kl_divergence', 'matrix_js_divergence', 'spectrum_js_divergence',
    'effective_rank', 'rankme', 'normalized_covariance', 'normalized_gram',
    'FactoredPSD'
]
