"""Matrix-information statistics of a set of frozen representations."""
import math
from typing import Dict

from torch import Tensor

from mmae_plugin.matrix_info import (matrix_entropy, normalized_gram, rankme,
                                     total_coding_rate)


def representation_statistics(features: Tensor,
                              tcr_mu: float = 1.0) -> Dict[str, float]:
    """Entropy, effective rank, RankMe and TCR of features (N, d).

    * ``entropy``: von Neumann entropy of ``zn^T zn / N`` (l2-normalised
      rows; trace 1), in nats, at most ``log d``;
    * ``erank``: the paper's effective rank, ``exp(entropy)``;
    * ``rankme``: RankMe of the raw features (Garrido et al., eps 1e-7);
    * ``tcr``: total coding rate in the M-MAE configs' form,
      ``logdet(I + mu/d zn^T zn)``, of all N rows.

    Args:
        features: (N, d) features, N >= 2.
        tcr_mu: mu of the TCR.

    Returns:
        Plain floats keyed as above.
    """
    features = features.double()
    entropy = float(matrix_entropy(normalized_gram(features, factored=True)))
    zn = features / features.norm(dim=1, keepdim=True)
    dim = features.shape[1]
    tcr = float(total_coding_rate(zn * math.sqrt(tcr_mu / dim), mu=1.0))
    return {
        'entropy': entropy,
        'erank': math.exp(entropy),
        'rankme': float(rankme(features)),
        'tcr': tcr,
    }
