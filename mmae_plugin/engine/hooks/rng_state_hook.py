"""Save and restore every rank's random state with the checkpoint."""
import random
from typing import List

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmpretrain.registry import HOOKS


def capture_rng_state() -> dict:
    """Python, numpy and torch (CPU and CUDA) generator states of this rank."""
    state = dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Make resumed training draw the same random numbers as an unbroken run.

    mmengine 0.10.7 re-seeds on resume but does not restore generator
    states, so MAE's random masks (and augmentations drawn in the main
    process) after a resume differ from those of an uninterrupted run. This
    hook stores the states of all ranks in the checkpoint
    (``checkpoint['rng_states']``, one entry per rank) and gives each rank
    its own back on resume. With ``persistent_workers=True`` the dataloader
    workers' own generators are not covered.
    """

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        states: List[dict] = all_gather_object(capture_rng_state())
        checkpoint['rng_states'] = states

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        states = checkpoint.get('rng_states')
        if states is None:
            return
        if len(states) != get_world_size():
            runner.logger.warning(
                f'checkpoint holds random states of {len(states)} ranks but '
                f'{get_world_size()} are running; random states not restored')
            return
        restore_rng_state(states[get_rank()])
