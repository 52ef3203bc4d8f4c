"""Checkpoints under ``torch.load(weights_only=True)``.

Upstream: torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``;
mmengine 0.10.7 (``mmengine.runner.checkpoint``) calls ``torch.load``
without the argument, so resume, ``load_from``, ``Pretrained`` init and
``mmpretrain.get_model`` fail with "Unsupported global: mmengine.logging.
history_buffer.HistoryBuffer". Not fixed in any mmengine release as of
0.10.7. Switching the check off (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD) would let
a checkpoint run arbitrary code; instead the exact classes an mmengine
checkpoint stores are allow-listed and the protection stays on.

The allow-list must not be changeable by the data it loads. Upstream's
``HistoryBuffer.__setstate__`` copies the checkpoint's ``statistics_methods``
into the class-level ``HistoryBuffer._statistics_methods`` (so a checkpoint
could redefine ``mean`` as ``min`` for the whole process), so under
``weights_only`` the class path of ``HistoryBuffer`` resolves to
:class:`CheckpointHistoryBuffer`, whose ``__setstate__`` only checks the
checkpoint's statistics against this process's and turns the object into a
plain ``HistoryBuffer``. Ordinary pickling (``copy.deepcopy``, full
``pickle``) keeps upstream's ``__setstate__``.
"""
import functools
import pickle
from typing import Any, Callable, Dict, List

import torch
from mmengine.logging.history_buffer import HistoryBuffer


#: The statistics ``HistoryBuffer`` defines itself; the only names the
#: restricted ``getattr`` below resolves, whatever a checkpoint contains.
BUILTIN_STATISTICS = ('min', 'max', 'current', 'mean')


class RegisteredStatistic:
    """Inert stand-in a checkpoint gets for a statistic registered by code.

    A statistic registered with ``HistoryBuffer.register_statistics`` is
    pickled by its import path (``my_module.my_stat``). Allow-listing the
    function itself would let a checkpoint call it with arguments of its
    choosing; the path resolves to this object instead, which cannot be
    called or instantiated, and which :class:`CheckpointHistoryBuffer`
    compares with the statistic this process registered.

    Args:
        name: The statistic's name in ``HistoryBuffer._statistics_methods``.
        method: The function registered under that name.
    """

    __slots__ = ('name', 'method')

    def __init__(self, name: str, method: Callable) -> None:
        self.name, self.method = name, method

    def __repr__(self) -> str:
        return f'RegisteredStatistic({self.name!r})'


class RegisteredStatisticOwner:
    """Inert stand-in for the class a registered statistic is defined in.

    Pickle protocol 2 (``torch.save``'s default) stores ``Owner.my_stat`` as
    ``getattr(Owner, 'my_stat')``; this object lets the restricted
    ``getattr`` resolve exactly the registered paths below ``Owner``.

    Args:
        path: Import path of the owner (``my_module.Owner``).
    """

    __slots__ = ('path', )

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f'RegisteredStatisticOwner({self.path!r})'


# Import path -> stand-in, for statistics registered by code in this process
# (never by a checkpoint: CheckpointHistoryBuffer registers nothing).
_REGISTERED_STATISTICS: Dict[str, Any] = {}


def history_buffer_statistic(owner: Any, name: str) -> Any:
    """Stand-in for ``getattr`` that only fetches HistoryBuffer statistics.

    mmengine's ``HistoryBuffer`` pickles its statistics methods as
    ``getattr(HistoryBuffer, 'min')``. Allow-listing the real ``getattr``
    would let a checkpoint reach any attribute of any allowed object, so
    ``getattr`` in a checkpoint resolves to this function instead. The names
    it resolves are fixed (:data:`BUILTIN_STATISTICS`, plus statistics that
    code registered in this process under a class), never read from state a
    checkpoint can change.

    Args:
        owner: The object the pickle asks an attribute of.
        name: The attribute name.

    Returns:
        The statistics method, or the stand-in of a registered one.
    """
    if type(name) is str:
        if (owner is HistoryBuffer or owner is CheckpointHistoryBuffer) \
                and name in BUILTIN_STATISTICS:
            return HistoryBuffer.__dict__[name]
        if type(owner) is RegisteredStatisticOwner:
            found = _REGISTERED_STATISTICS.get(f'{owner.path}.{name}')
            if found is not None:
                return found
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only the '
        f'HistoryBuffer statistics {BUILTIN_STATISTICS} and statistics '
        'registered by code in this process are allowed under weights_only')


class CheckpointHistoryBuffer(HistoryBuffer):
    """What a checkpoint's ``HistoryBuffer`` is rebuilt as under weights_only.

    ``torch.load(weights_only=True)`` calls ``__setstate__`` of the class the
    pickle names; mapping ``HistoryBuffer``'s path to this subclass replaces
    upstream's ``__setstate__`` for checkpoint loads only. The object becomes
    a plain ``HistoryBuffer`` once its state is set.
    """

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(
                f'HistoryBuffer state must be a dict, got {type(state)}')
        state = dict(state)
        check_checkpoint_statistics(state.pop('statistics_methods', {}))
        unknown = set(state) - set(vars(HistoryBuffer()))
        if unknown:
            raise pickle.UnpicklingError(
                f'HistoryBuffer state has unknown attribute(s) '
                f'{sorted(map(repr, unknown))}')
        # Inserts only the four built-ins if missing, as HistoryBuffer() does.
        self._set_default_statistics()
        self.__dict__.update(state)
        self.__class__ = HistoryBuffer


def check_checkpoint_statistics(statistics: Any) -> None:
    """Refuse a checkpoint whose statistics differ from this process's.

    Args:
        statistics: The ``statistics_methods`` a checkpoint's HistoryBuffer
            carries, name -> function (or :class:`RegisteredStatistic`).

    Raises:
        pickle.UnpicklingError: If a name is not registered here with the
            very same function.
    """
    if not isinstance(statistics, dict):
        raise pickle.UnpicklingError(
            f'HistoryBuffer statistics_methods must be a dict, got '
            f'{type(statistics)}')
    HistoryBuffer()  # the built-in four are registered on the first instance
    registered = HistoryBuffer._statistics_methods
    for name, method in statistics.items():
        if type(method) is RegisteredStatistic:
            method = method.method if method.name == name else None
        if type(name) is not str or registered.get(name) is not method:
            raise pickle.UnpicklingError(
                f'checkpoint HistoryBuffer statistic {name!r} is {method!r}, '
                f'but this process has {registered.get(name)!r}; a checkpoint '
                'cannot define or redefine statistics (register yours with '
                'HistoryBuffer.register_statistics before loading)')


def allow_registered_statistic(method: Callable) -> None:
    """Let checkpoints name a statistic that code registered in this process.

    Args:
        method: The function passed to ``HistoryBuffer.register_statistics``.
    """
    module = getattr(method, '__module__', None)
    qualname = getattr(method, '__qualname__', '')
    if not module or not qualname or '<locals>' in qualname:
        return  # pickle cannot store it by path, so no checkpoint names it
    parts = qualname.split('.')
    safe = [(RegisteredStatistic(method.__name__, method),
             f'{module}.{qualname}')]
    for depth in range(1, len(parts)):
        owner = '.'.join([module] + parts[:depth])
        safe.append((RegisteredStatisticOwner(owner), owner))
    for stand_in, path in safe:
        _REGISTERED_STATISTICS[path] = stand_in
    torch.serialization.add_safe_globals(safe)


def remember_registered_statistics() -> None:
    """Allow-list statistics registered by code, now and later, by path.

    Upstream: mmengine 0.10.7 pickles registered statistics by path, so a
    checkpoint of a process that registered one was refused with
    "Unsupported global: <module>.my_stat". Statistics registered before
    ``mmae_plugin`` was imported count as registered by code: before the
    plugin, no checkpoint holding a HistoryBuffer loads under weights_only.
    """
    original = HistoryBuffer.register_statistics.__func__
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def register_statistics(cls, method: Callable) -> Callable:
        method = original(cls, method)
        allow_registered_statistic(method)
        return method

    register_statistics._mmae_fixed = True
    HistoryBuffer.register_statistics = classmethod(register_statistics)
    HistoryBuffer()  # registers the built-in four
    for name, method in list(HistoryBuffer._statistics_methods.items()):
        if name not in BUILTIN_STATISTICS:
            allow_registered_statistic(method)


def checkpoint_safe_globals() -> List[Any]:
    """Classes and functions an mmengine/mmpretrain checkpoint pickles.

    Returns:
        The objects to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config.config import ConfigDict

    # numpy arrays and scalars inside HistoryBuffer (message hub) and meta.
    numpy_core = getattr(np, '_core', None) or np.core
    dtype_classes = [type(np.dtype(t)) for t in (
        np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8,
        np.bool_)]
    return [
        (CheckpointHistoryBuffer,
         f'{HistoryBuffer.__module__}.{HistoryBuffer.__qualname__}'),
        ConfigDict, np.ndarray, np.dtype,
        numpy_core.multiarray._reconstruct, numpy_core.multiarray.scalar,
        *dtype_classes,
        # pickle protocol 2 spells the builtin module ``__builtin__``.
        (history_buffer_statistic, '__builtin__.getattr'),
        (history_buffer_statistic, 'builtins.getattr'),
    ]


def allow_mmengine_checkpoints() -> None:
    """Allow-list mmengine's checkpoint contents for ``weights_only`` loads."""
    torch.serialization.add_safe_globals(checkpoint_safe_globals())
