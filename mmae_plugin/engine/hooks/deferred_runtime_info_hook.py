"""Log a step's values one step late, so the host never waits for it.

:class:`DeferredRuntimeInfoHook` is mmengine's ``RuntimeInfoHook`` whose
``after_train_iter`` puts the step's values in one float64 device tensor
(:class:`ValueTable`), copies it to pinned host memory without blocking,
and puts the *previous* step's values in the message hub (same keys,
numbers and order as upstream). A step is settled at once wherever the hub
is read: a ``LoggerHook`` line, an epoch's end, validation, a checkpoint
save, the end of training. Hooks acting on the values (``DivergenceHook``,
``RegularizerSkipHook``) :meth:`~DeferredRuntimeInfoHook.subscribe`, and
may ask for every rank's values (one all-reduce before the copy). Select
it in a config (mmengine's extension point)::

    default_hooks = dict(runtime_info=dict(type='DeferredRuntimeInfoHook'))

Why: docs/gpu_clusters.md#no-host-sync-in-the-training-step.
"""
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Union

import torch
from mmengine.dist import all_reduce, get_rank, get_world_size
from mmengine.hooks import LoggerHook, RuntimeInfoHook
from mmengine.registry import HOOKS

Number = Union[int, float]


@dataclass
class LoggedStep:
    """One training step's logged values, read off the device.

    Attributes:
        iteration: 1-based training iteration (as the log shows it).
        epoch: 1-based epoch.
        values: The step's ``log_vars`` as Python numbers, in their order.
        every_rank: The step's scalar floating-point values of every rank,
            ``{key: [rank 0's, rank 1's, ...]}``, when a subscriber asked
            for them; else empty.
    """

    iteration: int
    epoch: int
    values: Dict[str, Number]
    every_rank: Dict[str, List[float]] = field(default_factory=dict)


Listener = Callable[[object, LoggedStep], None]


@dataclass
class ValueTable:
    """A step's scalar floating-point log values in one float64 tensor.

    float64 holds every float32, bfloat16 and float16 value exactly, so a
    value read from it is the Python float ``.item()`` gives.

    Attributes:
        keys: The columns, in ``log_vars`` order.
        data: ``(rows, len(keys))`` float64: one row, or one per rank.
        rank: The row holding this rank's values.
    """

    keys: List[str]
    data: torch.Tensor
    rank: int = 0

    def own_values(self) -> Dict[str, float]:
        """This rank's values (``data`` on the host)."""
        return dict(zip(self.keys, self.data[self.rank].tolist()))

    def columns(self) -> Dict[str, List[float]]:
        """Every rank's values by key (``data`` on the host)."""
        return dict(zip(self.keys, self.data.t().tolist()))


def in_table(value) -> bool:
    """Whether a logged value goes into the :class:`ValueTable`."""
    return torch.is_tensor(value) and value.is_floating_point() \
        and value.numel() == 1


def value_table(outputs: dict, every_rank: bool) -> Optional[ValueTable]:
    """The step's scalar floating-point values as one device tensor.

    No host read. With ``every_rank``, a (world size, keys) table in which
    each rank fills its own row and leaves ``-0.0`` in the others, summed
    over ranks by one all-reduce: exact, since ``x + (-0.0)`` is ``x`` for
    every float, signed zeros and NaN included.

    Args:
        outputs: The step's ``log_vars`` (the same keys on every rank when
            ``every_rank``).
        every_rank: Gather every rank's values (one collective).

    Returns:
        The table, or None when no value goes into it.
    """
    keys = [key for key, value in outputs.items() if in_table(value)]
    if not keys:
        return None
    row = torch.stack(
        [outputs[key].detach().reshape(()).double() for key in keys])
    if not every_rank:
        return ValueTable(keys, row.unsqueeze(0))
    table = row.new_full((get_world_size(), len(keys)), -0.0)
    table[get_rank()] = row
    all_reduce(table, op='sum')
    return ValueTable(keys, table, get_rank())


@dataclass
class _Pending:
    """A step whose values are being copied to the host.

    ``values`` holds every key of ``log_vars`` in order: the values the
    table holds as None, the others as they were logged (tensors copied).
    """

    iteration: int
    epoch: int
    values: Dict[str, Union[None, Number, torch.Tensor]]
    table: Optional[ValueTable]
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

    A blocking event: waiting on it puts the thread to sleep instead of
    spinning a CPU core.

    Args:
        tensors: The step's tensors that were copied.

    Returns:
        A recorded ``torch.cuda.Event(blocking=True)`` if any tensor is on
        a CUDA device, else None (the copies are done).
    """
    for tensor in tensors:
        if tensor.device.type == 'cuda':
            event = torch.cuda.Event(blocking=True)
            event.record(torch.cuda.current_stream(tensor.device))
            return event
    return None


def as_number(value: Union[Number, torch.Tensor]) -> Number:
    """A host value as the Python number ``MessageHub`` would store."""
    if torch.is_tensor(value):
        return value.item()  # a host tensor whose copy has completed
    return value


@HOOKS.register_module()
class DeferredRuntimeInfoHook(RuntimeInfoHook):
    """``RuntimeInfoHook`` that puts a step's values in the message hub
    once their copy to the host is done, one step later (module docstring).
    """

    def __init__(self) -> None:
        self._pending: Optional[_Pending] = None
        self._listeners: List[Listener] = []
        self._every_rank = False

    def subscribe(self, listener: Listener, every_rank: bool = False) -> None:
        """Call ``listener(runner, step)`` with every settled step.

        Args:
            listener: Called after the step's values are in the hub.
            every_rank: Give it every rank's values (``step.every_rank``):
                one all-reduce after each ``train_step``, on every rank.
        """
        if listener in self._listeners:  # subscribed by an earlier train()
            return
        self._listeners.append(listener)
        self._every_rank = self._every_rank or every_rank

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
        table = pending.table
        tabled = table.own_values() if table is not None else {}
        values = {
            k: tabled[k] if v is None else as_number(v)
            for k, v in pending.values.items()
        }
        for key, value in values.items():
            runner.message_hub.update_scalar(f'train/{key}', value)
        every_rank = table.columns() if self._every_rank and table else {}
        step = LoggedStep(pending.iteration, pending.epoch, values, every_rank)
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
        """Start the step's copies: the table once, and any value the table
        does not hold (not a floating-point scalar) by itself."""
        table = value_table(outputs, self._every_rank)
        on_device = [table.data] if table is not None else []
        values = {}
        for key, value in outputs.items():
            if table is not None and key in table.keys:
                values[key] = None
            elif torch.is_tensor(value):
                on_device.append(value)
                values[key] = copy_to_host(value)
            else:
                values[key] = value
        if table is not None:
            table = replace(table, data=copy_to_host(table.data))
        return _Pending(runner.iter + 1, runner.epoch + 1, values, table,
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
