"""Compile the model's loss with ``torch.compile``, selected by a config.

Unlike mmengine's ``compile`` key (which compiles ``train_step``, split
into several graphs), this hook compiles only the model's ``loss`` (or
``forward``), on the model inside any wrapper, after one eager training
iteration (so the regulariser's gather agrees its layout first), and puts
the eager method back after training. M-MAE's loss is then one graph. When
it pays and how to turn it on: docs/gpu_clusters.md#compiling-the-loss.
"""
import inspect
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmae_plugin.utils.validation import check_choice

#: The model methods the hook can compile.
TARGETS = ('loss', 'forward')


def check_compile_kwargs(kwargs: dict) -> dict:
    """Return ``kwargs`` if ``torch.compile`` accepts them, else raise.

    Args:
        kwargs: Keyword arguments for ``torch.compile`` (``backend``,
            ``mode``, ``fullgraph``, ``dynamic``, ``options``...).

    Returns:
        ``kwargs``.
    """
    try:
        inspect.signature(torch.compile).bind(None, **kwargs)
    except TypeError as error:
        raise TypeError(f'CompileHook: torch.compile does not take '
                        f'{sorted(kwargs)}: {error}') from None
    return kwargs


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP / FSDP wrapper, or ``model`` itself."""
    return model.module if is_model_wrapper(model) else model


@HOOKS.register_module()
class CompileHook(Hook):
    """Compile the model's ``loss`` (or ``forward``) after one iteration.

    Select it as a default hook, by config or command line::

        default_hooks = dict(compile=dict(type='CompileHook'))
        --cfg-options default_hooks.compile.type=CompileHook

    Args:
        target: ``'loss'`` (default: the forward pass and the losses, what
            ``train_step`` runs between the preprocessor and ``backward``)
            or ``'forward'`` (also validation's ``predict``).
        **compile_kwargs: Passed to ``torch.compile`` (``mode``,
            ``backend``, ``fullgraph=True`` to fail on a graph break...);
            checked when the hook is built.
    """

    # Last after the first iteration: after every hook that changed the
    # model.
    priority = 'LOWEST'

    def __init__(self, target: str = 'loss', **compile_kwargs) -> None:
        self.target = check_choice(target, 'target', TARGETS)
        self.compile_kwargs = check_compile_kwargs(compile_kwargs)
        self._model: Optional[torch.nn.Module] = None

    def before_train(self, runner) -> None:
        """Run the first iteration eagerly."""
        self._model = None

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """Bind the compiled method on the (unwrapped) model, once."""
        if self._model is not None:
            return
        model = unwrapped(runner.model)
        compiled = torch.compile(
            getattr(model, self.target), **self.compile_kwargs)
        setattr(model, self.target, compiled)
        self._model = model

    def after_train(self, runner) -> None:
        """Put the model's eager method back."""
        if self._model is not None:
            delattr(self._model, self.target)
            self._model = None
