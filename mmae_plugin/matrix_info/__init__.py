"""Matrix information theory of representations (pure PyTorch).

No mmengine or mmpretrain imports here: everything is a differentiable
function of tensors, computed in float64 by default whatever the input dtype,
with natural logarithms. See ``docs/matrix_info.md``. The named statistics
the plugin logs (``erank_gram``, ``erank_cov``, ``rankme_raw``,
``tcr_reference_mu1``...) are defined once, in :mod:`.representation`; the
token poolings once, in :mod:`.pooling`.
"""
from .coding_rate import (TCR_FORMS, coding_rate, coding_rate_key,
                          total_coding_rate)
from .divergence import (matrix_js_divergence, matrix_kl_divergence,
                         spectrum_js_divergence)
from .entropy import (hadamard_product, matrix_entropy, matrix_joint_entropy,
                      matrix_mutual_information)
from .kernels import FactoredPSD, normalized_covariance, normalized_gram
from .pooling import POOLINGS, pool_token_sequence
from .rank import effective_rank, rankme
from .representation import (KERNELS, one_branch_statistics, statistic_key,
                             two_branch_statistics)
from .validation import check_features

__all__ = [
    'check_features', 'total_coding_rate', 'matrix_entropy',
    'matrix_joint_entropy', 'matrix_mutual_information', 'hadamard_product',
    'matrix_kl_divergence', 'matrix_js_divergence', 'spectrum_js_divergence',
    'effective_rank', 'rankme', 'normalized_covariance', 'normalized_gram',
    'FactoredPSD', 'TCR_FORMS', 'coding_rate', 'coding_rate_key', 'POOLINGS',
    'pool_token_sequence', 'KERNELS', 'one_branch_statistics', 'statistic_key',
    'two_branch_statistics'
]
