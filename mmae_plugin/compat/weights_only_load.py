"""Checkpoints from URLs unpickled in full.

Upstream: mmengine 0.10.7 ``load_from_http`` (every URL scheme, so
``load_from``, ``--resume``, ``Pretrained`` init and ``get_model``) calls
``torch.hub.load_state_dict_from_url`` with ``weights_only=False``, and its
local ``torch.load`` relies on torch's default, which
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns off. Here both pass
``weights_only=True`` explicitly.

Opt-out: ``MMAE_UNSAFE_PICKLE_LOAD=1`` (read once, at import); such
checkpoints can then run code. See
docs/upstream_workarounds.md#weights_only_load-checkpoints-from-urls-unpickled-in-full
"""
import functools
import types
from typing import Any

import torch

from ._opt_out import opted_out

#: ``MMAE_UNSAFE_PICKLE_LOAD=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_UNSAFE_PICKLE_LOAD'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, 'checkpoints loaded through mmengine from URLs (and '
    'local ones under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1) are unpickled in '
    'full and can run code')


class TorchWithWeightsOnlyLoad(types.ModuleType):
    """``torch`` as seen by ``mmengine.runner.checkpoint``: loads are safe.

    Every attribute is torch's own except :meth:`load`, which always passes
    ``weights_only=True``.
    """

    def __init__(self) -> None:
        super().__init__(torch.__name__, torch.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def load(f: Any, *args, **kwargs) -> Any:
        """``torch.load`` with ``weights_only=True`` whatever is asked."""
        kwargs['weights_only'] = True
        return torch.load(f, *args, **kwargs)


def load_checkpoints_weights_only() -> None:
    """Make every mmengine checkpoint scheme load with weights_only=True."""
    if OPTED_OUT:
        return
    import mmengine.runner.checkpoint as checkpoint_module
    import mmengine.utils.dl_utils as dl_utils
    import mmengine.utils.dl_utils.hub as hub

    if not isinstance(checkpoint_module.torch, TorchWithWeightsOnlyLoad):
        checkpoint_module.torch = TorchWithWeightsOnlyLoad()

    original = hub.load_url
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def load_url(url: str, *args, **kwargs) -> Any:
        kwargs['weights_only'] = True
        return original(url, *args, **kwargs)

    load_url._mmae_fixed = True
    for module in (hub, dl_utils, checkpoint_module):
        module.load_url = load_url
