"""mmcv's ``DropPath`` keeps a numpy drop probability as a Python float.

Upstream: mmcv 2.2.0's ``drop_path`` tests ``drop_prob == 0.``, and
mmpretrain 1.2.0's ViTs pass ``numpy.float64`` rates, which TorchDynamo
traces as tensors: ``torch.compile`` breaks the graph at every encoder
DropPath (the loss of MAE / M-MAE: 9 graphs, 8 breaks).

What this changes: ``DropPath.__init__`` runs mmcv's, then replaces a numpy
scalar ``drop_prob`` by the Python float of the same value (same results
bit for bit); the loss is then one graph. ``DropPath`` modules built before
the plugin is imported, and rates assigned later, are not converted.

Opt-out: ``MMAE_NO_DROP_PATH_FLOAT=1`` (read once, at import); eager
training is unchanged, a compiled ViT loss breaks its graph again.
Details: docs/upstream_workarounds.md#drop_path_float-droppath-and-torchcompile
"""
from typing import Callable, Dict

import numpy as np

from ._opt_out import opted_out

#: ``MMAE_NO_DROP_PATH_FLOAT=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_NO_DROP_PATH_FLOAT'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, 'torch.compile breaks the graph at every DropPath of '
    "mmpretrain's ViTs (their numpy drop rates are traced as tensors); "
    'eager training is unchanged')

# mmcv's own __init__, recorded when the fix is applied.
_UPSTREAM: Dict[str, Callable] = {}


def python_number(value):
    """``value`` as a Python number if it is a numpy scalar, else itself.

    Args:
        value: A drop probability as a config or mmpretrain passes it.

    Returns:
        ``value.item()`` for a numpy scalar (the same value), else
        ``value`` unchanged.
    """
    return value.item() if isinstance(value, np.generic) else value


def upstream_init() -> Callable:
    """mmcv's own ``DropPath.__init__``, whether or not the fix is applied.

    Returns:
        The function mmcv defines.
    """
    from mmcv.cnn.bricks.drop import DropPath
    return _UPSTREAM.get('__init__', DropPath.__init__)


def fix_drop_path_float() -> None:
    """Make ``DropPath.__init__`` store a numpy rate as a Python float."""
    if OPTED_OUT:
        return
    import functools

    from mmcv.cnn.bricks.drop import DropPath
    original = DropPath.__init__
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self.drop_prob = python_number(self.drop_prob)

    __init__._mmae_fixed = True
    _UPSTREAM['__init__'] = original
    DropPath.__init__ = __init__
