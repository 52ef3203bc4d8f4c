"""Real runs for the checkpoint fault tests and their kill driver.

The tiny mmengine model, dataset and Runner are conftest's (one copy for
every checkpoint test); this module only fixes the fault tests' settings.
``checkpoint_kill_driver.py`` imports it in a subprocess, where conftest is
importable because this folder is the script's own.
"""
from conftest import ToyModel, make_toy_runner  # noqa: F401 (re-exported)
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmae_plugin.engine.runners import MMAERunner


def toy_runner(work_dir,
               max_epochs,
               resume=False,
               max_keep_ckpts=1,
               load_from=None,
               custom_hooks=None,
               lr=0.01,
               upstream=False,
               out_dir=None,
               **kwargs):
    """The plugin's runner and checkpoint hook, a save every iteration.

    Args:
        work_dir: Work (and checkpoint) folder.
        max_epochs: Epochs to train.
        resume: mmengine's ``resume``.
        max_keep_ckpts: Passed to ``SafeCheckpointHook``.
        load_from: mmengine's ``load_from``.
        custom_hooks: Extra hooks.
        lr: SGD learning rate.
        upstream: mmengine's own ``Runner`` and ``CheckpointHook`` instead
            (what the plugin's are compared with).
        out_dir: The checkpoint hook's ``out_dir``.
        **kwargs: More runner arguments (``cfg``, ``log_level``...).

    Returns:
        The Runner (not yet trained).
    """
    return make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=Runner if upstream else MMAERunner,
        dataset_length=2,
        lr=lr,
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook' if upstream else 'SafeCheckpointHook',
                interval=1,
                max_keep_ckpts=max_keep_ckpts,
                out_dir=out_dir)),
        custom_hooks=custom_hooks,
        resume=resume,
        load_from=load_from,
        **kwargs)


class InfiniteUpdate(Hook):
    """From epoch ``epoch`` (1-based) on, an SGD lr of Inf: the next update
    makes the parameters Inf (NaN where a gradient is 0), after a finite
    loss."""

    def __init__(self, epoch: int = 2) -> None:
        self.epoch = epoch

    def before_train_epoch(self, runner) -> None:
        if runner.epoch + 1 >= self.epoch:
            for group in runner.optim_wrapper.optimizer.param_groups:
                group['lr'] = float('inf')
