"""Real runs for the checkpoint fault tests and their kill driver.

The tiny mmengine model, dataset and Runner are conftest's (one copy for
every checkpoint test); this module only fixes the fault tests' settings.
``checkpoint_kill_driver.py`` imports it in a subprocess, where conftest is
importable because this folder is the script's own.
"""
from conftest import ToyModel, make_toy_runner  # noqa: F401 (re-exported)


def toy_runner(work_dir, max_epochs, resume=False, max_keep_ckpts=1,
               load_from=None, custom_hooks=None, lr=0.01):
    """A real Runner that saves a checkpoint every epoch of one iteration.

    Args:
        work_dir: Work (and checkpoint) folder.
        max_epochs: Epochs to train.
        resume: mmengine's ``resume``.
        max_keep_ckpts: Passed to ``CheckpointHook``.
        load_from: mmengine's ``load_from``.
        custom_hooks: Extra hooks.
        lr: SGD learning rate.

    Returns:
        The Runner (not yet trained).
    """
    return make_toy_runner(
        work_dir, max_epochs, dataset_length=2, lr=lr,
        default_hooks=dict(checkpoint=dict(
            type='CheckpointHook', interval=1,
            max_keep_ckpts=max_keep_ckpts)),
        custom_hooks=custom_hooks, resume=resume, load_from=load_from)
