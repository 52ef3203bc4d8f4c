"""The toy run of the launch-record tests (shared with their 2-process
driver, ``launch_change_driver.py``)."""
from conftest import make_toy_runner

from mmae_plugin.engine.runners import MMAERunner


def toy_launch(work_dir, max_epochs, batch_size=2, **kwargs):
    """16 samples, an iteration-based linear warm-up over 2 epochs.

    Args:
        work_dir: Work folder.
        max_epochs: Epochs to train.
        batch_size: Per-process batch.
        **kwargs: More runner arguments (``resume``, ``launcher``, ``cfg``).

    Returns:
        The plugin's runner (not yet trained).
    """
    return make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=MMAERunner,
        dataset_length=16,
        batch_size=batch_size,
        param_scheduler=dict(
            type='LinearLR',
            start_factor=0.1,
            by_epoch=True,
            begin=0,
            end=2,
            convert_to_iter_based=True),
        default_hooks=dict(
            checkpoint=dict(type='SafeCheckpointHook', interval=1)),
        **kwargs)
