"""Matrix-information statistics of a set of frozen representations."""
from typing import Dict, Optional

from torch import Tensor

from mmae_plugin.matrix_info.representation import one_branch_statistics


def representation_statistics(
        features: Tensor,
        tcr_mu: float = 1.0,
        tcr_form: str = 'reference',
        tcr_centering: bool = False,
        kernels: Optional[tuple] = None) -> Dict[str, float]:
    """Entropies, effective ranks, RankMe and TCR of features (N, d).

    The keys and definitions of :mod:`mmae_plugin.matrix_info.representation`
    (those ``MatrixInfoHook`` logs); with the defaults ``entropy_gram``,
    ``erank_gram``, ``entropy_cov``, ``erank_cov``, ``rankme_raw`` and
    ``tcr_reference_mu1``.

    Args:
        features: (N, d) features, N >= 2.
        tcr_mu: mu of the coding rate.
        tcr_form: ``'reference'`` or ``'paper'``.
        tcr_centering: Centre the unit rows before the coding rate.
        kernels: Kernels of the entropies and effective ranks (default
            both, ``('gram', 'covariance')``).

    Returns:
        Plain floats keyed as above; the entropy and effective rank of a
        zero kernel (constant features for ``cov``) are NaN: undefined.
    """
    values = one_branch_statistics(
        features,
        kernels=kernels or ('gram', 'covariance'),
        tcr=dict(form=tcr_form, mu=tcr_mu, centering=tcr_centering),
        undefined='nan')
    return {key: float(value) for key, value in values.items()}
