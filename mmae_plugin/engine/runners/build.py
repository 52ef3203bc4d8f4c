"""Build the runner a config asks for, as mmpretrain's ``tools/train.py``
does."""
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner


def build_runner(cfg: Config):
    """The config's ``runner_type`` from mmengine's ``RUNNERS`` (the
    plugin's ``MMAERunner`` in every shipped config), or mmengine's
    ``Runner`` when it names none.

    ``Runner.from_cfg`` ignores ``runner_type``: a run built that way
    resumes and saves without the plugin's runner (its verified resume,
    work folder lock and exact mid-epoch resume).

    Args:
        cfg: The full config (``work_dir`` set).

    Returns:
        The runner, not yet trained.
    """
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
