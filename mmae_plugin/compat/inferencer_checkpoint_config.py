"""mmengine's inferencers never execute the config text of a checkpoint.

Upstream: mmengine 0.10.7's ``BaseInferencer._init_model``
(``SomeInferencer(model=None, weights=PATH)``) executes the config text
stored in the checkpoint, so a checkpoint of plain strings ran code.

What changes: built with ``weights`` and no config, it raises a
``ValueError`` naming the checkpoint and what to pass as ``model=``, before
reading it; with a config, upstream's method runs unchanged.

Opt-out: ``MMAE_UNSAFE_INFERENCER_CONFIG=1`` (read once, at import); a
checkpoint opened for inference can then run code. Why even a parsed config
is code: the ``inferencer_checkpoint_config`` section of
docs/upstream_workarounds.md.
"""
import functools
from typing import Any, Optional

from ._opt_out import opted_out

#: ``MMAE_UNSAFE_INFERENCER_CONFIG=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_UNSAFE_INFERENCER_CONFIG'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, 'an mmengine inferencer built with weights= and no '
    'config executes the config text stored in the checkpoint: the '
    'checkpoint can run code')

_MESSAGE = (
    'weights={weights!r} given without a config: mmengine 0.10.7 would '
    'build the model from the config text stored in the checkpoint '
    "(message_hub['runtime_info']['cfg'] or meta['cfg']) by executing it, "
    'and a checkpoint never runs code with mmae_plugin. Pass the config the '
    'checkpoint was trained with as model=, e.g. '
    "{cls}(model='path/to/config.py', weights={weights!r}); to recover that "
    'text for review, read it with torch.load(path, weights_only=True)'
    "['meta']['cfg'] and save it to a .py file (MMAE_UNSAFE_INFERENCER_CONFIG"
    "=1 restores upstream's behaviour, executing it)")


def refuse_config_from_checkpoint(original: Any) -> Any:
    """Wrap ``BaseInferencer._init_model`` to refuse a missing config.

    Args:
        original: mmengine's ``BaseInferencer._init_model``.

    Returns:
        The wrapped method.
    """

    @functools.wraps(original)
    def init_model(self,
                   cfg: Any,
                   weights: Optional[str],
                   device: str = 'cpu') -> Any:
        # Same test as upstream's ``if not cfg:`` branch, checked before the
        # checkpoint is read so a refused call reads nothing.
        if not cfg and weights is not None:
            raise ValueError(
                _MESSAGE.format(weights=weights, cls=type(self).__name__))
        return original(self, cfg, weights, device)

    init_model._mmae_fixed = True
    return init_model


def never_execute_checkpoint_config_in_inferencers() -> None:
    """Make mmengine's ``BaseInferencer`` refuse to run a checkpoint's cfg."""
    if OPTED_OUT:
        return
    from mmengine.infer import BaseInferencer

    if not getattr(BaseInferencer._init_model, '_mmae_fixed', False):
        BaseInferencer._init_model = refuse_config_from_checkpoint(
            BaseInferencer._init_model)
