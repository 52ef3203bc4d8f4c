"""Checkpoints under ``torch.load(weights_only=True)``.

Upstream: torch >= 2.6 loads with ``weights_only=True`` by default and
mmengine 0.10.7 calls ``torch.load`` without the argument, so resume,
``load_from``, ``Pretrained`` init and ``get_model`` fail ("Unsupported
global: ...HistoryBuffer").

What this changes: the exact classes an mmengine checkpoint stores are
allow-listed, and ``HistoryBuffer`` resolves to
:class:`CheckpointHistoryBuffer`, which never lets a checkpoint define a
statistic.

Opt-out: ``MMAE_NO_CHECKPOINT_ALLOWLIST=1`` (read once, at import); mmengine
checkpoints then fail to load under torch >= 2.6. Why, versions and the
statistics policy:
docs/upstream_workarounds.md#checkpoint_allowlist-checkpoints-under-weights_only
"""
import codecs
import functools
import pickle
from typing import Any, Callable, Dict, List

import torch
from mmengine.logging.history_buffer import HistoryBuffer
from torch.torch_version import TorchVersion

from ._opt_out import opted_out

#: ``MMAE_NO_CHECKPOINT_ALLOWLIST=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_NO_CHECKPOINT_ALLOWLIST'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, 'mmengine checkpoints fail to load under torch >= 2.6 '
    "weights_only (\"Unsupported global: ...HistoryBuffer\"); do not answer "
    'that with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, which lets a checkpoint '
    'run code')

#: torch >= 2.6 takes ``(object, 'module.name')`` in ``add_safe_globals``.
NAMED_SAFE_GLOBALS = TorchVersion(torch.__version__) >= (2, 6)

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

    Checkpoints pickle statistics as ``getattr(HistoryBuffer, 'min')`` (and
    FSDP's ``getattr(ShardedTensor, 'ProcessGroupState')``); allow-listing the
    real ``getattr`` would reach any attribute of any allowed object, so
    ``getattr`` resolves to this function, whose names are fixed
    (:data:`BUILTIN_STATISTICS` and statistics registered by code), never read
    from state a checkpoint can change.

    Args:
        owner: The object the pickle asks an attribute of.
        name: The attribute name.

    Returns:
        The statistics method, or the stand-in of a registered one.
    """
    if type(name) is str:
        if (owner is HistoryBuffer or owner in _HISTORY_BUFFER_ALIASES) \
                and name in BUILTIN_STATISTICS:
            return HistoryBuffer.__dict__[name]
        nested = _NESTED_CLASSES.get((owner, name))
        if nested is not None:
            return nested
        if type(owner) is RegisteredStatisticOwner:
            found = _REGISTERED_STATISTICS.get(f'{owner.path}.{name}')
            if found is not None:
                return found
        if isinstance(owner, type):
            # The owner's path resolved to the real class, which the user
            # allow-listed (see prefer_real_entries_to_stand_ins); the
            # statistic still resolves to its stand-in, never the function.
            found = _REGISTERED_STATISTICS.get(
                f'{owner.__module__}.{owner.__qualname__}.{name}')
            if found is not None:
                return found
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only the '
        f'HistoryBuffer statistics {BUILTIN_STATISTICS}, statistics '
        'registered by code in this process and ShardedTensor.'
        'ProcessGroupState are allowed under weights_only')


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


#: What a checkpoint's HistoryBuffer path may resolve to (see
#: :func:`named_safe_global`).
_HISTORY_BUFFER_ALIASES = [CheckpointHistoryBuffer]


def named_safe_global(obj: Any, path: str) -> Any:
    """An ``add_safe_globals`` entry that allows ``obj`` under ``path``.

    Args:
        obj: A class or function.
        path: The ``module.name`` a checkpoint spells it with.

    Returns:
        ``(obj, path)`` on torch >= 2.6; on older torch, which keys entries
        by their own ``__module__`` and ``__name__``, a subclass of ``obj``
        (classes) or a function calling it, named ``path``.
    """
    if NAMED_SAFE_GLOBALS:
        return (obj, path)
    module, name = path.rsplit('.', 1)
    if isinstance(obj, type):
        alias = type(name, (obj, ), {
            '__module__': module,
            '__qualname__': name
        })
        if issubclass(obj, CheckpointHistoryBuffer):
            _HISTORY_BUFFER_ALIASES.append(alias)
        return alias

    def alias(*args: Any) -> Any:
        return obj(*args)

    alias.__module__, alias.__name__, alias.__qualname__ = module, name, name
    return alias


def check_checkpoint_statistics(statistics: Any) -> None:
    """Refuse a checkpoint whose statistics differ from this process's.

    A checkpoint may name only the built-in four and statistics this process
    registered by code (through their :class:`RegisteredStatistic`
    stand-ins); a registered one missing from
    ``HistoryBuffer._statistics_methods`` is restored, as upstream does.
    The policy:
    docs/reliability.md#what-a-checkpoint-may-name-historybuffer-statistics

    Args:
        statistics: The ``statistics_methods`` a checkpoint's HistoryBuffer
            carries, name -> function (or :class:`RegisteredStatistic`).

    Raises:
        pickle.UnpicklingError: If a name is not registered here with the
            very same function, and is not a statistic this process
            registered by code under that name.
    """
    if not isinstance(statistics, dict):
        raise pickle.UnpicklingError(
            f'HistoryBuffer statistics_methods must be a dict, got '
            f'{type(statistics)}')
    HistoryBuffer()  # the built-in four are registered on the first instance
    registered = HistoryBuffer._statistics_methods
    restore = {}
    for name, method in statistics.items():
        if type(method) is RegisteredStatistic:
            method = method.method if method.name == name else None
            if type(name) is str and method is not None \
                    and name not in registered:
                restore[name] = method
                continue
        if type(name) is not str or registered.get(name) is not method:
            raise pickle.UnpicklingError(
                f'checkpoint HistoryBuffer statistic {name!r} is {method!r}, '
                f'but this process has {registered.get(name)!r}; a checkpoint '
                'cannot define or redefine statistics (register yours with '
                'HistoryBuffer.register_statistics before loading)')
    # Only once every name has passed, so a refused checkpoint changes
    # nothing.
    registered.update(restore)


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
    safe = [(RegisteredStatistic(method.__name__,
                                 method), f'{module}.{qualname}')]
    for depth in range(1, len(parts)):
        owner = '.'.join([module] + parts[:depth])
        safe.append((RegisteredStatisticOwner(owner), owner))
    if not NAMED_SAFE_GLOBALS:
        return  # an object cannot be allow-listed under a path before 2.6
    for stand_in, path in safe:
        _REGISTERED_STATISTICS[path] = stand_in
    torch.serialization.add_safe_globals(safe)


STAND_IN_TYPES = (RegisteredStatistic, RegisteredStatisticOwner)


def entry_path(entry: Any) -> str:
    """The path an ``add_safe_globals`` entry allows its object under.

    Args:
        entry: An object, or an ``(object, 'module.name')`` tuple.

    Returns:
        ``'module.name'``.
    """
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


def prefer_real_entries_to_stand_ins() -> None:
    """Resolve a path both a stand-in and a user entry claim to the latter.

    torch (2.6 to at least 2.14) keeps the user allow-list in a ``set``, so
    when a :class:`RegisteredStatisticOwner` and a user-allow-listed class
    claim one path the winner depended on the hash seed (and the user's
    objects could fail to load). The wrapped ``_get_user_allowed_globals``
    gives every such path to the user's entry; other paths are untouched.
    """
    import torch._weights_only_unpickler as unpickler
    original = unpickler._get_user_allowed_globals
    if getattr(original, '_mmae_fixed', False):
        return

    @functools.wraps(original)
    def get_user_allowed_globals() -> Dict[str, Any]:
        allowed = original()
        stand_in_paths = {
            path
            for path, found in allowed.items() if type(found) in STAND_IN_TYPES
        }
        if stand_in_paths:
            for entry in list(unpickler._marked_safe_globals_set):
                found = entry[0] if isinstance(entry, tuple) else entry
                if type(found) not in STAND_IN_TYPES \
                        and entry_path(entry) in stand_in_paths:
                    allowed[entry_path(entry)] = found
        return allowed

    get_user_allowed_globals._mmae_fixed = True
    unpickler._get_user_allowed_globals = get_user_allowed_globals


def remember_registered_statistics() -> None:
    """Allow-list statistics registered by code, now and later, by path.

    Upstream: mmengine 0.10.7 pickles registered statistics by path, so a
    checkpoint of a process that registered one was refused with
    "Unsupported global: <module>.my_stat". Statistics registered before
    ``mmae_plugin`` was imported count as registered by code: before the
    plugin, no checkpoint holding a HistoryBuffer loads under weights_only.
    """
    if OPTED_OUT:
        return
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
    prefer_real_entries_to_stand_ins()
    HistoryBuffer()  # registers the built-in four
    for name, method in list(HistoryBuffer._statistics_methods.items()):
        if name not in BUILTIN_STATISTICS:
            allow_registered_statistic(method)


def sharded_tensor_safe_globals() -> List[Any]:
    """Classes FSDP's local state dict (``ShardedTensor``) pickles.

    mmengine's ``FSDPStrategy`` saves ``ShardedTensor`` objects (the ViT-L FSDP
    recipe's default), whose metadata dataclasses torch's ``weights_only``
    allow-list lacks ("Unsupported global: ...ShardedTensor");
    ``ShardedTensor.ProcessGroupState`` is resolved by
    :func:`history_buffer_statistic` from :data:`_NESTED_CLASSES`.

    Returns:
        The entries, or ``[]`` where torch was built without distributed.
    """
    if not torch.distributed.is_available():
        return []
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (
        MEM_FORMAT_ENCODING, ShardedTensorMetadata, TensorProperties)
    from torch.distributed._shard.sharded_tensor.shard import Shard
    from torch.distributed._shard.sharding_spec.api import \
        EnumerableShardingSpec
    from torch.distributed._shard.sharding_spec.chunk_sharding_spec import \
        ChunkShardingSpec
    from torch.distributed.remote_device import _remote_device
    _NESTED_CLASSES[(ShardedTensor, 'ProcessGroupState')] = \
        ShardedTensor.ProcessGroupState
    return [
        ShardedTensor, ShardedTensor.ProcessGroupState, Shard, ShardMetadata,
        ShardedTensorMetadata, TensorProperties, MEM_FORMAT_ENCODING,
        EnumerableShardingSpec, ChunkShardingSpec, _remote_device
    ]


#: ``(owner, name)`` -> class, for the nested classes a checkpoint reaches
#: with ``getattr``; filled only by this module, never from loaded data.
_NESTED_CLASSES: Dict[tuple, type] = {}


def checkpoint_safe_globals() -> List[Any]:
    """Classes and functions an mmengine/mmpretrain checkpoint pickles.

    Returns:
        The objects to pass to :func:`torch.serialization.add_safe_globals`.
    """
    import numpy as np
    from mmengine.config.config import ConfigDict
    # numpy arrays and scalars inside HistoryBuffer (message hub) and meta;
    # numpy 1.26's numpy._core.multiarray re-exports numpy.core's.
    from numpy._core import multiarray
    dtype_classes = [
        type(np.dtype(t)) for t in (np.float64, np.float32, np.float16,
                                    np.int64, np.int32, np.uint8, np.bool_)
    ]
    return [
        named_safe_global(
            CheckpointHistoryBuffer,
            f'{HistoryBuffer.__module__}.{HistoryBuffer.__qualname__}'),
        ConfigDict,
        np.ndarray,
        np.dtype,
        *dtype_classes,
        *[
            named_safe_global(function, f'{module}.{function.__name__}')
            for function in (multiarray._reconstruct, multiarray.scalar)
            for module in ('numpy.core.multiarray', 'numpy._core.multiarray')
        ],
        # Protocol 2 pickles bytes (numpy's array data) as
        # _codecs.encode(str, 'latin1'); torch >= 2.5 allows it by default.
        codecs.encode,
        # pickle protocol 2 spells the builtin module ``__builtin__``.
        named_safe_global(history_buffer_statistic, '__builtin__.getattr'),
        named_safe_global(history_buffer_statistic, 'builtins.getattr'),
        *sharded_tensor_safe_globals(),
    ]


def allow_mmengine_checkpoints() -> None:
    """Allow-list mmengine's checkpoint contents for ``weights_only`` loads."""
    if OPTED_OUT:
        return
    torch.serialization.add_safe_globals(checkpoint_safe_globals())
