"""mmcv's ``DropPath`` keeps a numpy drop probability as a Python float.

Upstream: mmcv 2.2.0 ``mmcv.cnn.bricks.drop.DropPath`` (the newest mmcv and
mmcv-lite release) stores ``drop_prob`` as given, and ``drop_path`` starts
with ``if drop_prob == 0. or not training``. mmpretrain 1.2.0's
``VisionTransformer`` (so ``MAEViT`` and every ViT recipe) passes each
layer's rate from ``np.linspace``: a ``numpy.float64``. TorchDynamo traces
numpy values as tensors, so that test becomes a data-dependent branch and
``torch.compile`` breaks the graph at both DropPaths of every encoder layer,
even at rate 0: ``torch._dynamo.explain`` of the loss of MAE and M-MAE
(the Fashion-MNIST and the ViT-B recipes alike) found 9 graphs, 8 breaks.

What this changes: ``DropPath.__init__`` runs mmcv's, then replaces a numpy
scalar ``drop_prob`` by the Python float of the same value
(``numpy.float64`` is a subclass of ``float``; every use of the value,
``1 - drop_prob``, ``x.div(keep_prob)``, gives the same result bit for
bit). Any other value is kept as given. Dynamo then reads the rate as a
constant and the whole loss is one graph
(``tests/test_compile_whole_loss.py``). Every ``DropPath`` built after the
plugin is imported is reached, whether built from a config
(``build_dropout``) or by class (``from mmcv.cnn.bricks import
DropPath``); modules built before keep their numpy value. A value assigned
to ``drop_prob`` later is not converted.

Opt-out: ``MMAE_NO_DROP_PATH_FLOAT=1`` (read once, at import) leaves mmcv's
``__init__`` in place: nothing changes in eager training, but a compiled
loss of a ViT recipe breaks its graph at every encoder DropPath.
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
