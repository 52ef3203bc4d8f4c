"""What :class:`~.MatrixInfoHook` computes from the tapped embeddings.

The definitions are those of :mod:`mmae_plugin.matrix_info.representation`
(one key, one value, whichever tool computes it); here they are applied to
the gathered rows in float64, without autograd or autocast, on a bounded
number of CPU threads.
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from mmae_plugin.matrix_info.coding_rate import check_coding_rate_args
from mmae_plugin.matrix_info.representation import (one_branch_statistics,
                                                    two_branch_statistics)
# One definition of the padded all-gather, shared with the regularisers.
from mmae_plugin.models.utils.gather import gather_rows
from mmae_plugin.utils.validation import check_choice

TCR_CHOICES = ('objective', 'reference', 'paper')
#: Largest Renyi order the hook accepts. The toolbox computes every order
#: stably in log space; beyond 50 the entropy is within ``log(d) / 49`` of
#: its limit, the min-entropy ``-log p_max``, so larger orders add nothing.
MAX_ALPHA = 50.0
#: What ``tcr='objective'`` logs for a model without a ``TCRLoss``: the
#: published M-MAE objective (reference form, ViT-B's mu).
FALLBACK_TCR = dict(form='reference', mu=1.0, centering=False)


def checked_tcr(tcr: str, mu: Optional[float],
                centering: Optional[bool]) -> Optional[dict]:
    """The coding-rate settings, or None to take them from the model.

    Args:
        tcr: One of :data:`TCR_CHOICES`.
        mu: Coding-rate parameter (None: 1); must be None for
            ``'objective'``.
        centering: Batch-centre first (None: False); must be None for
            ``'objective'``.

    Returns:
        ``dict(form=, mu=, centering=)``, or None for ``'objective'``.
    """
    check_choice(tcr, 'tcr', TCR_CHOICES)
    if tcr == 'objective':
        if mu is not None or centering is not None:
            raise ValueError(
                f"with tcr='objective' mu and centering come from the "
                f"model's TCRLoss; got mu={mu!r}, centering="
                f"{centering!r}. Use tcr='reference' or tcr='paper' to "
                f'set them')
        return None
    form, mu, centering = check_coding_rate_args(
        tcr, 1.0 if mu is None else mu,
        False if centering is None else centering)
    return dict(form=form, mu=mu, centering=centering)


def objective_tcr(model: nn.Module) -> Optional[dict]:
    """Form, mu and centering of the model's ``TCRLoss``, if it has one.

    Args:
        model: The unwrapped algorithm.

    Returns:
        ``dict(form=, mu=, centering=)`` or ``None``.
    """
    from mmae_plugin.models.losses import TCRLoss
    regularizer = getattr(model, 'regularizer', None)
    if isinstance(regularizer, TCRLoss):
        return dict(
            form=regularizer.form,
            mu=regularizer.mu,
            centering=regularizer.centering)
    return None


def one_branch_quantities(z: Tensor, kernel: str, alpha: float,
                          tcr: dict) -> Dict[str, Tensor]:
    """Entropy, effective rank, RankMe and TCR of one batch of embeddings.

    Args:
        z: Embeddings (B, C).
        kernel: ``'covariance'`` or ``'gram'`` (matrix of the entropy and of
            the effective rank).
        alpha: Renyi order of the entropy.
        tcr: ``dict(form=, mu=, centering=)`` of the coding rate.

    Returns:
        The keys of :func:`~mmae_plugin.matrix_info.representation.
        one_branch_statistics` for ``kernel`` (``entropy_<k>``, ``erank_<k>``,
        ``rankme_raw``, ``tcr_...``); NaN entropy and effective rank for a
        zero kernel (a fully collapsed batch).
    """
    return one_branch_statistics(
        z, kernels=(kernel, ), alpha=alpha, tcr=tcr, undefined='nan')


def two_branch_quantities(z1: Tensor, z2: Tensor, kernel: str,
                          alpha: float) -> Dict[str, Tensor]:
    """Per-branch entropy, MI, joint entropy, matrix and spectrum JS.

    Args:
        z1: Embeddings of branch 1 (B, C).
        z2: Embeddings of branch 2 (B, C), same samples in the same order.
        kernel: ``'covariance'`` (paper figures 1-3) or ``'gram'``.
        alpha: Renyi order of entropies and mutual information.

    Returns:
        Scalars keyed ``<name>_<k>``, NaN when a kernel is the zero matrix
        (see
        :func:`~mmae_plugin.matrix_info.representation.
        two_branch_statistics`).
    """
    return two_branch_statistics(z1, z2, kernel, alpha, undefined='nan')


def measure_embeddings(embeddings: List[Tensor],
                       kernel: str,
                       alpha: float,
                       tcr: dict,
                       cpu_threads: Optional[int] = 1,
                       gather: bool = True) -> Dict[str, Tensor]:
    """Gather one or two branches over ranks and compute their quantities.

    Args:
        embeddings: Local (N, C) embeddings of one or two branches.
        kernel: ``'covariance'`` or ``'gram'``.
        alpha: Renyi order.
        tcr: ``dict(form=, mu=, centering=)`` (one branch only).
        cpu_threads: Torch threads while computing on CPU tensors (restored
            afterwards); None keeps the current setting.
        gather: Gather the rows of every rank first (training batches);
            False for inputs every rank has whole (the held-out set).

    Returns:
        Scalars by name (float64 tensors).
    """
    device_type = embeddings[0].device.type
    with torch.no_grad(), torch.autocast(
            device_type=device_type, enabled=False):
        gathered = [
            gather_rows(z.contiguous()) if gather else z for z in embeddings
        ]
        saved_threads = torch.get_num_threads()
        if device_type == 'cpu' and cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        try:
            if len(gathered) == 1:
                return one_branch_quantities(gathered[0], kernel, alpha, tcr)
            return two_branch_quantities(gathered[0], gathered[1], kernel,
                                         alpha)
        finally:
            torch.set_num_threads(saved_threads)


def average_values(per_batch: List[Dict[str, Tensor]]) -> Dict[str, float]:
    """Mean over batches of each quantity (NaN if any batch had NaN).

    Args:
        per_batch: The quantities of each batch, same keys.

    Returns:
        ``{name: mean}`` as Python floats.
    """
    return {
        name: float(
            sum(float(values[name]) for values in per_batch) / len(per_batch))
        for name in per_batch[0]
    }
