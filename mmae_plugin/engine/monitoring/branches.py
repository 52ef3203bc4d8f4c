"""The default branches of :class:`~.MatrixInfoHook`, per algorithm.

One small function per algorithm family returns its branch specifications
(see :func:`~.taps.checked_branch`); :func:`branch_table` maps
each algorithm class of mmpretrain 1.2 (and the plugin's) to its function.
Why each algorithm is tapped where it is: docs/matrix_info.md.
"""
import functools
from typing import Callable, Dict, List, Optional

from torch import nn

BranchFn = Callable[[nn.Module, Optional[str]], List[dict]]


def simclr_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """SimCLR: one ``neck`` call on both views, interleaved row by row."""
    return [
        dict(module='neck', call=0, rows='even'),
        dict(module='neck', call=0, rows='odd')
    ]


def per_view_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """Barlow Twins, SimSiam, SpectralContrastive: ``neck`` on each view."""
    return [dict(module='neck', call=0), dict(module='neck', call=1)]


def byol_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """BYOL: online projection of view 1, target projection of view 2."""
    return [dict(module='neck', call=0), dict(module='target_net', call=1)]


def mocov3_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MoCo v3: query projection of view 1, momentum key of view 2."""
    return [
        dict(module='neck', call=0),
        dict(module='momentum_encoder', call=1)
    ]


def moco_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MoCo v2, DenseCL: query projection and (batch-shuffled) key."""
    return [
        dict(module='neck', call=0),
        dict(module='encoder_k.module.1', call=0, rows='shuffled')
    ]


def swav_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """SwAV: the projections of the two high-resolution crops."""
    crops = sum(model.head.loss_module.num_crops)
    return [
        dict(module='neck', call=0, block=(0, crops)),
        dict(module='neck', call=0, block=(1, crops))
    ]


def encoder_branch(model: nn.Module, pool: Optional[str], default: str,
                   **spec) -> List[dict]:
    """One ``backbone`` branch pooled by ``pool``.

    Args:
        model: The algorithm; its backbone's ``num_extra_tokens`` (1 if
            unset) is the branch's ``extra_tokens`` unless ``spec`` has it.
        pool: The hook's ``pool``; None: ``default``, or ``'mean'`` for an
            encoder without a CLS token.
        default: The algorithm's pooling.
        **spec: More branch keys (``module``, ``index``, ...).

    Returns:
        The one branch.
    """
    spec.setdefault('extra_tokens',
                    getattr(model.backbone, 'num_extra_tokens', 1))
    if not spec['extra_tokens']:
        default = 'mean'
    return [{'module': 'backbone', 'pool': pool or default, **spec}]


def mae_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MAE and subclasses: the regulariser's input, else the encoder."""
    if pool is None and isinstance(
            getattr(model, 'regularizer', None), nn.Module):
        return [dict(module='regularizer', call=0, tap='input')]
    return encoder_branch(model, pool, getattr(model, 'feature', 'cls'))


def mff_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MFF: the last encoder block, not the fused multi-level output."""
    last = f'backbone.layers.{len(model.backbone.layers) - 1}'
    return encoder_branch(model, pool, 'cls', module=last)


def cls_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MILAN, EVA: the masked encoder pass, CLS token (linear probe)."""
    return encoder_branch(model, pool, 'cls')


def mean_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MaskFeat, CAE: the encoder pass, mean of its patch tokens."""
    return encoder_branch(model, pool, 'mean')


def last_output_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """BEiT v1/v2, SimMIM, SparK: the encoder's last output, averaged."""
    return encoder_branch(model, pool, 'mean', index=(-1, ))


def mixmim_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """MixMIM: mean of each image's own tokens in the mixed batch."""
    return encoder_branch(
        model, pool, 'mean', index=(0, ), token_mask=1, extra_tokens=0)


def itpn_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """iTPN: the main-stage tokens of the HiViT encoder (no CLS)."""
    pixel = model.backbone.reconstruction_type == 'pixel'
    return encoder_branch(
        model, pool, 'mean', index=(0, -1) if pixel else (-1, ))


@functools.lru_cache(maxsize=None)
def branch_table() -> Dict[type, BranchFn]:
    """Default-branch function of each algorithm class (lazily imported).

    Another algorithm can be added in place:
    ``branch_table()[MyAlgorithm] = function(model, pool) -> branches``.
    """
    from mmpretrain import models as m

    from mmae_plugin.models.algorithms import SpectralContrastive
    return {
        m.SimCLR: simclr_branches,
        m.BarlowTwins: per_view_branches,
        m.SimSiam: per_view_branches,
        SpectralContrastive: per_view_branches,
        m.BYOL: byol_branches,
        m.MoCoV3: mocov3_branches,
        m.MoCo: moco_branches,
        m.DenseCL: moco_branches,
        m.SwAV: swav_branches,
        m.MAE: mae_branches,
        m.MFF: mff_branches,
        m.MILAN: cls_branches,
        m.EVA: cls_branches,
        m.MaskFeat: mean_branches,
        m.CAE: mean_branches,
        m.BEiT: last_output_branches,
        m.SimMIM: last_output_branches,
        m.SparK: last_output_branches,
        m.MixMIM: mixmim_branches,
        m.iTPN: itpn_branches,
    }


def default_branches(model: nn.Module, pool: Optional[str]) -> List[dict]:
    """Where the embeddings of the model's algorithm come from.

    The function of the nearest class in the model's MRO that
    :func:`branch_table` lists builds them (docs/matrix_info.md gives each
    algorithm's branches and why): two branches, the tensors the loss pairs,
    for Siamese methods; one branch of pooled encoder features for masked
    modelling and distillation methods.

    Args:
        model: The unwrapped algorithm.
        pool: Pooling of token outputs, one of
            :data:`~mmae_plugin.matrix_info.pooling.POOLINGS`, or ``None``
            to follow the algorithm (its linear probe's feature; for
            ``MAE`` the regulariser's input, else ``MMAE.feature``).

    Returns:
        List of one or two branch specifications.
    """
    table = branch_table()
    for cls in type(model).__mro__:
        if cls in table:
            return table[cls](model, pool)
    raise TypeError(
        f'MatrixInfoHook has no default branches for '
        f'{type(model).__name__}; pass branches=[dict(module=..., call=...), '
        f'...] naming the submodule(s) whose outputs are the embeddings')
