"""Resume refuses a launch it cannot continue unchanged.

:class:`~.resume_gate.ResumeGateMixin` writes ``meta['launch']`` (world
size, per-GPU batch, iterations per epoch, FSDP sharding) into every
checkpoint and on resume compares it with the current launch
(:func:`check_launch`): a difference, or a checkpoint without a launch
record, raises :class:`LaunchChangedError` naming both launches and what
would change, unless the config sets::

    resume_launch_change = 'rescale'  # or 'accept'

``'rescale'`` rescales the schedulers' and the loop's iteration counts to
the new iterations per epoch; ``'accept'`` continues unchanged (both
logged). FSDP local shards at another world size are always refused. Why:
docs/reliability.md#checkpoints-finite-whole-verified-and-the-runs-own
(the launch is recorded).
"""
from typing import Any, Dict, Optional, Tuple

from mmengine.dist import get_world_size

#: The config key of the override and its values.
OVERRIDE_KEY = 'resume_launch_change'
OVERRIDE_VALUES = ('refuse', 'rescale', 'accept')
#: Scheduler attributes counted in steps (iterations once converted).
_STEP_ATTRIBUTES = ('begin', 'end', 'T_max', 'last_step', '_global_step',
                    'step_size')


class LaunchChangedError(RuntimeError):
    """Resume at another world size, per-GPU batch or FSDP sharding."""


def _sharding(runner) -> Optional[str]:
    strategy = getattr(runner, 'strategy', None)
    state_dict_type = getattr(strategy, 'state_dict_type', None)
    if state_dict_type is None:
        return None
    return str(getattr(state_dict_type, 'name', state_dict_type))


def launch_record(runner) -> Dict[str, Any]:
    """The launch a checkpoint of this run is written with.

    Args:
        runner: The runner (its train dataloader built).

    Returns:
        ``world_size``, ``per_gpu_batch``, ``iters_per_epoch`` and
        ``sharding`` (FSDP's state dict type, or None).
    """
    loader = runner.train_dataloader
    return dict(
        world_size=get_world_size(),
        per_gpu_batch=getattr(loader, 'batch_size', None),
        iters_per_epoch=len(loader),
        sharding=_sharding(runner))


def launch_problem(launch: Any) -> Optional[str]:
    """What is malformed in a checkpoint's launch record, or None.

    Args:
        launch: ``meta['launch']`` as loaded.

    Returns:
        A sentence fragment, or None for a well-formed record.
    """
    if not isinstance(launch, dict):
        return f'it is {type(launch).__name__} {launch!r:.60}, not a dict'
    for key in ('world_size', 'iters_per_epoch'):
        value = launch.get(key)
        if type(value) is not int or value < 1:
            return f'{key} is {value!r:.60}, not a positive integer'
    batch = launch.get('per_gpu_batch')
    if batch is not None and (type(batch) is not int or batch < 1):
        return f'per_gpu_batch is {batch!r:.60}, not a positive integer'
    sharding = launch.get('sharding')
    if sharding is not None and not isinstance(sharding, str):
        return f'sharding is {sharding!r:.60}, not a name or None'
    return None


def describe(launch: Dict[str, Any]) -> str:
    """``'8 processes x 128 images (1024 per step, 1251 iterations per
    epoch)'``."""
    world, batch = launch['world_size'], launch['per_gpu_batch']
    total = world * batch if isinstance(batch, int) else '?'
    text = (f'{world} processes x {batch} images ({total} per step, '
            f'{launch["iters_per_epoch"]} iterations per epoch')
    if launch.get('sharding'):
        text += f', FSDP {launch["sharding"]}'
    return text + ')'


def launch_change_message(path: str, saved: Dict[str, Any],
                          now: Dict[str, Any]) -> str:
    """Why ``path`` is not resumed at this launch, and what to do."""
    local_shards = saved.get('sharding') == 'LOCAL_STATE_DICT' and \
        saved['world_size'] != now['world_size']
    remedy = ('FSDP local shards load only at the world size that wrote '
              'them: resume with the same number of processes.' if local_shards
              else f'Resume with the same launch, or set {OVERRIDE_KEY} = '
              "'rescale' in the config (--cfg-options "
              f'{OVERRIDE_KEY}=rescale) to rescale the schedule to the new '
              'iterations per epoch and accept the new regularised batch.')
    return (f'cannot resume {path}: it was written by a launch of '
            f'{describe(saved)}; this launch has {describe(now)}. Resumed '
            'as it is, the parameter schedules (counted in iterations) would '
            'no longer end at max_epochs and the regularised batch of a '
            "gather='global' regulariser would change. " + remedy)


def rescale_schedule(runner, ratio: float) -> None:
    """Scale the loop's and schedulers' iteration counts by ``ratio``.

    Args:
        runner: The resumed runner.
        ratio: New iterations per epoch / saved iterations per epoch.
    """
    loop = runner.train_loop
    loop._iter = round(loop._iter * ratio)
    schedulers = runner.param_schedulers or []
    if isinstance(schedulers, dict):
        schedulers = [s for group in schedulers.values() for s in group]
    for scheduler in schedulers:
        if getattr(scheduler, 'by_epoch', True):
            continue  # counted in epochs: unchanged by the launch
        for name in _STEP_ATTRIBUTES:
            value = getattr(scheduler, name, None)
            if isinstance(value, int) and value > 0:
                setattr(scheduler, name, max(1, round(value * ratio)))
        milestones = getattr(scheduler, 'milestones', None)
        if milestones is not None:
            scheduler.milestones = type(milestones)({
                round(step * ratio): count
                for step, count in milestones.items()
            })


def check_launch(path: str, saved: Any, now: Dict[str, Any],
                 choice: str) -> Tuple[Optional[float], Optional[str]]:
    """Whether a checkpoint written by launch ``saved`` continues at
    launch ``now``.

    Args:
        path: The checkpoint (for messages).
        saved: Its ``meta['launch']`` (None when it has none).
        now: :func:`launch_record` of this run.
        choice: The config's ``resume_launch_change``.

    Returns:
        ``(ratio, warning)``: the iterations-per-epoch ratio to rescale the
        schedule by (None: unchanged) and a sentence for the log (None:
        nothing to say).

    Raises:
        LaunchChangedError: The launch changed (or cannot be compared) and
            ``choice`` does not allow it.
        ValueError: ``choice`` is not one of :data:`OVERRIDE_VALUES`.
    """
    if choice not in OVERRIDE_VALUES:
        raise ValueError(f'{OVERRIDE_KEY}={choice!r}: expected one of '
                         f'{OVERRIDE_VALUES}')
    unknown = 'it has no launch record (written by mmengine\'s ' \
        'CheckpointHook or plugin 0.2)' if saved is None else None
    problem = launch_problem(saved) if saved is not None else None
    if problem:
        unknown = f'its launch record is malformed: {problem}'
    if unknown:
        if choice == 'refuse':
            raise LaunchChangedError(
                f'cannot resume {path}: {unknown}, so whether this launch '
                f'({describe(now)}) continues its schedule unchanged cannot '
                f"be checked. Set {OVERRIDE_KEY} = 'accept' (--cfg-options "
                f'{OVERRIDE_KEY}=accept) if it was written with this '
                'launch.')
        return None, (f'resuming {path} although {unknown} ({OVERRIDE_KEY}='
                      f"'{choice}'): continued unchanged with "
                      f'{describe(now)}')
    if saved == now:
        return None, None
    local_shards = saved.get('sharding') == 'LOCAL_STATE_DICT' and \
        saved['world_size'] != now['world_size']
    if choice == 'refuse' or local_shards:
        raise LaunchChangedError(launch_change_message(path, saved, now))
    if choice == 'accept':
        return None, (f'resuming {path} at another launch ({OVERRIDE_KEY}='
                      f"'accept'): written with {describe(saved)}, continued "
                      f'unchanged with {describe(now)}')
    ratio = now['iters_per_epoch'] / saved['iters_per_epoch']
    return ratio, (f'resuming {path} at another launch ({OVERRIDE_KEY}='
                   f"'rescale'): written with {describe(saved)}, continued "
                   f'with {describe(now)}; iteration counts of the loop and '
                   f'the schedules scaled by {ratio:.6g}')
