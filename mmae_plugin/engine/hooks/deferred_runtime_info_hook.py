"""Log a step's values one step late, so the host never waits for it.

mmengine 0.10.7's ``RuntimeInfoHook.after_train_iter`` hands every value of
the step's ``log_vars`` to ``MessageHub.update_scalar``, which converts it
with ``.item()`` (``mmengine/logging/message_hub.py``, ``update_scalar`` ->
``_get_valid_value``). On a GPU the first ``.item()`` waits for the whole
step just queued (M-MAE logs four values: loss, loss_rec, loss_tcr,
reg_skipped), so the host never runs ahead of the device: the data
preprocessing and the Python of the next step are paid on the critical path.

:class:`DeferredRuntimeInfoHook` is that hook with ``after_train_iter``
changed: the step's values are detached and copied to pinned host memory
with ``non_blocking=True`` (on the CPU simply detached), and the values of
the *previous* step, whose copies finished while this step ran, are put
into the message hub, with the same keys, counts and order as upstream. A
step's values are settled (put in the hub at once) wherever anything reads
the hub: at the iterations at which a ``LoggerHook`` writes a line or an
epoch ends (so the log, ``scalars.json`` and the history averaged for each
line are those of upstream), before validation, before any checkpoint save
(the message hub is in the checkpoint; :class:`~.checkpoint_hook.
SafeCheckpointHook` settles before it checks the state) and at the end of
training. Between two log lines the host
reads nothing of the step it just queued.

Hooks that act on the logged values (:class:`~.divergence_hook.
DivergenceHook`, :class:`~.regularizer_skip_hook.RegularizerSkipHook`)
:meth:`~DeferredRuntimeInfoHook.subscribe`: they are called with each step
as it is settled (one step late, or at once at a settling iteration), and
may have device tensors of their own copied off the device with the step's
values. Select it in a config (mmengine's extension point)::

    default_hooks = dict(runtime_info=dict(type='DeferredRuntimeInfoHook'))
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Union

import torch
from mmengine.hooks import LoggerHook, RuntimeInfoHook
from mmengine.registry import HOOKS as MMENGINE_HOOKS

Number = Union[int, float]
#: Device tensors a subscriber wants copied off the device with a step's
#: values, made from the step's ``log_vars``.
Producer = Callable[[dict], Dict[str, torch.Tensor]]


@dataclass
class LoggedStep:
    """One training step's logged values, read off the device.

    Attributes:
        iteration: 1-based training iteration (as the log shows it).
        epoch: 1-based epoch.
        values: The step's ``log_vars`` as Python numbers, in their order.
        extras: The subscribers' tensors of the step, on the host.
    """

    iteration: int
    epoch: int
    values: Dict[str, Number]
    extras: Dict[str, torch.Tensor] = field(default_factory=dict)


Listener = Callable[[object, LoggedStep], None]


@dataclass
class _Pending:
    """A step whose values are being copied to the host."""

    iteration: int
    epoch: int
    values: Dict[str, Union[Number, torch.Tensor]]
    extras: Dict[str, torch.Tensor]
    ready: Optional[torch.cuda.Event]


def copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying ``tensor`` to the host; the host does not wait.

    Args:
        tensor: A tensor of the step.

    Returns:
        ``tensor`` detached if it is on the CPU; from a CUDA device, a
        pinned host tensor the copy is queued into (valid once the device
        has run the copy); from another device, a copy made at once.
    """
    tensor = tensor.detach()
    if tensor.device.type == 'cpu':
        return tensor
    if tensor.device.type != 'cuda':
        # No event to wait on here: copied as upstream reads it (blocking).
        return tensor.to('cpu')
    host = torch.empty(
        tensor.shape, dtype=tensor.dtype, device='cpu', pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def copies_done_event(
        tensors: List[torch.Tensor]) -> Optional[torch.cuda.Event]:
    """An event recorded after the copies just queued from ``tensors``.

    Args:
        tensors: The step's tensors that were copied.

    Returns:
        A recorded ``torch.cuda.Event`` if any tensor is on a CUDA device,
        else None (the copies are done).
    """
    for tensor in tensors:
        if tensor.device.type == 'cuda':
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))
            return event
    return None


def as_number(value: Union[Number, torch.Tensor]) -> Number:
    """A host value as the Python number ``MessageHub`` would store."""
    if torch.is_tensor(value):
        return value.item()  # a host tensor whose copy has completed
    return value


@MMENGINE_HOOKS.register_module()
class DeferredRuntimeInfoHook(RuntimeInfoHook):
    """``RuntimeInfoHook`` that puts a step's values in the message hub
    once their copy to the host is done, one step later (module docstring).
    """

    def __init__(self) -> None:
        self._pending: Optional[_Pending] = None
        self._listeners: List[Listener] = []
        self._producers: List[Producer] = []

    def subscribe(self,
                  listener: Listener,
                  producer: Optional[Producer] = None) -> None:
        """Call ``listener(runner, step)`` with every settled step.

        Args:
            listener: Called after the step's values are in the hub.
            producer: Makes device tensors from the step's ``log_vars``
                (after ``train_step``, on every rank: it may run a
                collective); they reach the listener as ``step.extras``.
        """
        if listener in self._listeners:  # subscribed by an earlier train()
            return
        self._listeners.append(listener)
        if producer is not None:
            self._producers.append(producer)

    def before_train(self, runner) -> None:
        """Upstream's, with nothing left from an earlier ``train()``."""
        self._pending = None
        super().before_train(runner)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        """Settle the previous step; start copying this one's values.

        Args:
            runner: The runner.
            batch_idx: Index of the batch in the epoch.
            data_batch: The batch (unused).
            outputs: The step's ``log_vars``.
        """
        self.settle(runner)
        if outputs is not None:
            self._pending = self._stage(runner, outputs)
        if self._hub_read_now(runner, batch_idx):
            self.settle(runner)

    def settle(self, runner) -> None:
        """Put the pending step's values in the hub and tell subscribers.

        Waits for the step's copies if they are not done yet. Safe to call
        at any time (nothing pending: nothing happens).

        Args:
            runner: The runner.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.ready is not None:
            pending.ready.synchronize()
        values = {k: as_number(v) for k, v in pending.values.items()}
        for key, value in values.items():
            runner.message_hub.update_scalar(f'train/{key}', value)
        step = LoggedStep(pending.iteration, pending.epoch, values,
                          pending.extras)
        for listener in self._listeners:
            listener(runner, step)

    def after_train_epoch(self, runner) -> None:
        """Settle (normally done at the epoch's last iteration)."""
        self.settle(runner)

    def before_val(self, runner) -> None:
        """Settle, then upstream's."""
        self.settle(runner)
        super().before_val(runner)

    def after_train(self, runner) -> None:
        """Settle the last step, then upstream's."""
        self.settle(runner)
        super().after_train(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Settle before any save, the message hub's state included.

        ``Runner.save_checkpoint`` has taken the hub's state before this
        hook; with a step pending it is taken again. (``SafeCheckpointHook``
        settles earlier, before it checks the state.)

        Args:
            runner: The runner.
            checkpoint: The checkpoint about to be saved.
        """
        if self._pending is not None:
            self.settle(runner)
            checkpoint['message_hub'] = runner.message_hub.state_dict()

    def _stage(self, runner, outputs: dict) -> _Pending:
        extras: Dict[str, torch.Tensor] = {}
        for producer in self._producers:
            extras.update(producer(outputs))
        on_device = [v for v in outputs.values() if torch.is_tensor(v)]
        on_device += list(extras.values())
        values = {
            key: copy_to_host(value) if torch.is_tensor(value) else value
            for key, value in outputs.items()
        }
        extras = {key: copy_to_host(value) for key, value in extras.items()}
        return _Pending(runner.iter + 1, runner.epoch + 1, values, extras,
                        copies_done_event(on_device))

    @staticmethod
    def _hub_read_now(runner, batch_idx: int) -> bool:
        """Whether a ``LoggerHook`` writes a line after this iteration or
        the epoch ends (the cases ``LoggerHook.after_train_iter`` logs)."""
        for hook in runner.hooks:
            if isinstance(hook, LoggerHook) and (
                    hook.every_n_inner_iters(batch_idx, hook.interval)
                    or hook.end_of_epoch(runner.train_dataloader, batch_idx)):
                return True
        return False


def deferred_runtime_info_hook(runner) -> Optional[DeferredRuntimeInfoHook]:
    """The runner's :class:`DeferredRuntimeInfoHook`, None if it has none.

    Args:
        runner: The runner.

    Returns:
        The hook, or None (upstream's ``RuntimeInfoHook`` logs at once).
    """
    for hook in runner.hooks:
        if isinstance(hook, DeferredRuntimeInfoHook):
            return hook
    return None


def settle_logged_values(runner) -> None:
    """Put every pending logged value in the message hub (before a save).

    Args:
        runner: The runner.
    """
    hook = deferred_runtime_info_hook(runner)
    if hook is not None:
        hook.settle(runner)
