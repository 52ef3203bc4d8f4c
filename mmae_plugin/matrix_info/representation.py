"""The named statistics of a batch of representations: one definition each.

``MatrixInfoHook`` and ``RepresentationStatistics`` both take their
numbers from here, so a key has one value on the same features wherever it
is logged. A key names its matrix:

* ``entropy_gram`` / ``erank_gram``: von Neumann entropy (nats) and its
  ``exp`` (effective rank, Definition 6) of the uncentred Gram kernel of
  the l2-normalised rows; ``entropy_cov`` / ``erank_cov``: the same of the
  centred correlation matrix; ``_alpha<a>``: Renyi order ``a != 1``;
* ``rankme_raw``: RankMe (eps 1e-7) of the raw features;
* ``tcr_<form>[_centered]_mu<mu>``: :func:`~.coding_rate.coding_rate`;
* two branches: ``entropy_1_<kernel>``, ``entropy_2_<kernel>``,
  ``mutual_info_<kernel>``, ``joint_entropy_<kernel>``,
  ``matrix_js_<kernel>``, ``spectrum_js_<kernel>``.

A statistic of a zero kernel is NaN with ``undefined='nan'`` (what the
hook and the metric log), else :class:`~.spectrum.ZeroMatrixError`. What
each kernel measures: docs/matrix_info.md. Pure PyTorch.
"""
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from ..utils.validation import check_choice
from .coding_rate import check_coding_rate_args, coding_rate, coding_rate_key
from .divergence import matrix_js_divergence, spectrum_js_divergence
from .entropy import (matrix_entropy, matrix_joint_entropy,
                      matrix_mutual_information)
from .kernels import PSDInput, normalized_covariance, normalized_gram
from .rank import rankme
from .spectrum import ZeroMatrixError
from .validation import check_alpha

#: Kernel names (as ``MatrixInfoHook(kernel=...)`` takes them) -> builders.
KERNELS = {'covariance': normalized_covariance, 'gram': normalized_gram}
#: The suffix each kernel gives a key.
KERNEL_SUFFIXES = {'covariance': 'cov', 'gram': 'gram'}
#: Two-branch quantities whose value depends on the Renyi order.
ORDER_DEPENDENT = ('entropy', 'entropy_1', 'entropy_2', 'mutual_info',
                   'joint_entropy')
#: RankMe's eps (the RankMe paper's value).
RANKME_EPS = 1e-7
RANKME_KEY = 'rankme_raw'
#: The coding rate reported when none is asked for: the published M-MAE
#: objective at mu 1.
DEFAULT_TCR = dict(form='reference', mu=1.0, centering=False)
#: What a statistic of a zero kernel becomes: an error, or NaN.
UNDEFINED = ('raise', 'nan')


def check_kernel(kernel: str) -> str:
    """Return ``kernel`` if it is one of :data:`KERNELS`, else raise."""
    return check_choice(kernel, 'kernel', tuple(KERNELS))


def statistic_key(name: str, kernel: str, alpha: float = 1.0) -> str:
    """The logged name of a kernel statistic, e.g. ``'erank_cov'``.

    Args:
        name: Base name (``'entropy'``, ``'erank'``, ``'mutual_info'``...).
        kernel: ``'covariance'`` or ``'gram'``.
        alpha: Renyi order; appended as ``_alpha<a>`` for an
            order-dependent quantity when it is not 1.

    Returns:
        The key.
    """
    key = f'{name}_{KERNEL_SUFFIXES[check_kernel(kernel)]}'
    if name in ORDER_DEPENDENT and check_alpha(alpha) != 1.0:
        key += f'_alpha{alpha:g}'
    return key


def kernel_matrix(z: Tensor, kernel: str) -> PSDInput:
    """The unit-diagonal kernel of features ``z`` (B, d), factored."""
    return KERNELS[check_kernel(kernel)](z, factored=True)


def _undefined(names: Sequence[str], kernel: str, alpha: float, undefined: str,
               error: ZeroMatrixError) -> Dict[str, Tensor]:
    """NaN for every named statistic of a zero kernel, or the error."""
    if check_choice(undefined, 'undefined', UNDEFINED) == 'raise':
        raise error
    nan = torch.tensor(float('nan'), dtype=torch.float64)
    return {statistic_key(name, kernel, alpha): nan for name in names}


def kernel_statistics(z: Tensor,
                      kernel: str,
                      alpha: float = 1.0,
                      undefined: str = 'raise') -> Dict[str, Tensor]:
    """Entropy and effective rank of one kernel of ``z``.

    Args:
        z: Features (B, d) (B >= 2 for the covariance kernel).
        kernel: ``'covariance'`` or ``'gram'``.
        alpha: Renyi order of the logged entropy.
        undefined: ``'raise'`` or ``'nan'``: what a zero kernel gives.

    Returns:
        ``entropy_<k>`` (order ``alpha``, see :func:`statistic_key`) and
        ``erank_<k>``, ``exp`` of the von Neumann entropy (any ``alpha``).
    """
    check_choice(undefined, 'undefined', UNDEFINED)
    matrix = kernel_matrix(z, kernel)
    try:
        entropy = matrix_entropy(matrix, alpha)
    except ZeroMatrixError as error:
        return _undefined(('entropy', 'erank'), kernel, alpha, undefined,
                          error)
    von_neumann = entropy if alpha == 1.0 else matrix_entropy(matrix, 1.0)
    return {
        statistic_key('entropy', kernel, alpha): entropy,
        statistic_key('erank', kernel): torch.exp(von_neumann)
    }


def one_branch_statistics(z: Tensor,
                          kernels: Sequence[str] = ('gram', 'covariance'),
                          alpha: float = 1.0,
                          tcr: Optional[dict] = None,
                          undefined: str = 'raise') -> Dict[str, Tensor]:
    """Every one-branch statistic of ``z`` under its key.

    Args:
        z: Features (B, d), rows are samples.
        kernels: Kernels whose entropy and effective rank are computed.
        alpha: Renyi order of the entropies.
        tcr: ``dict(form=, mu=, centering=)`` of the coding rate
            (:data:`DEFAULT_TCR` if None).
        undefined: ``'raise'`` or ``'nan'``: what a zero kernel gives.

    Returns:
        Scalar float64 tensors keyed as in the module docstring.
    """
    tcr = dict(DEFAULT_TCR if tcr is None else tcr)
    form, mu, centering = check_coding_rate_args(**tcr)
    values: Dict[str, Tensor] = {}
    for kernel in kernels:
        values.update(kernel_statistics(z, kernel, alpha, undefined))
    values[RANKME_KEY] = rankme(z, RANKME_EPS)
    values[coding_rate_key(form, mu,
                           centering)] = coding_rate(z, form, mu, centering)
    return values


TWO_BRANCH_NAMES = ('entropy_1', 'entropy_2', 'mutual_info', 'joint_entropy',
                    'matrix_js', 'spectrum_js')


def two_branch_statistics(z1: Tensor,
                          z2: Tensor,
                          kernel: str,
                          alpha: float = 1.0,
                          undefined: str = 'raise') -> Dict[str, Tensor]:
    """Per-branch entropy, MI, joint entropy, matrix and spectrum JS.

    Args:
        z1: Features of branch 1 (B, d).
        z2: Features of branch 2 (B, d), same samples in the same order.
        kernel: ``'covariance'`` (paper figures 1-3) or ``'gram'``.
        alpha: Renyi order of entropies and mutual information.
        undefined: ``'raise'`` or ``'nan'``: what a zero kernel gives (NaN
            for all six: each involves both kernels or their product).

    Returns:
        Scalar float64 tensors keyed as in the module docstring.
    """
    if z1.shape != z2.shape:
        raise ValueError(f'the two branches must have the same shape, got '
                         f'{tuple(z1.shape)} and {tuple(z2.shape)}')
    check_choice(undefined, 'undefined', UNDEFINED)
    k1, k2 = kernel_matrix(z1, kernel), kernel_matrix(z2, kernel)
    try:
        values = dict(
            entropy_1=matrix_entropy(k1, alpha),
            entropy_2=matrix_entropy(k2, alpha),
            mutual_info=matrix_mutual_information(k1, k2, alpha),
            joint_entropy=matrix_joint_entropy(k1, k2, alpha),
            matrix_js=matrix_js_divergence(k1, k2),
            spectrum_js=spectrum_js_divergence(k1, k2))
    except ZeroMatrixError as error:
        return _undefined(TWO_BRANCH_NAMES, kernel, alpha, undefined, error)
    return {
        statistic_key(name, kernel, alpha): value
        for name, value in values.items()
    }
