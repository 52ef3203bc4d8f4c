"""The plugin's runners: mmengine's, with verified checkpoint resume.

Selected in a config with ``runner_type = 'MMAERunner'`` (or
``'MMAEFlexibleRunner'`` for FSDP / DeepSpeed strategies); mmpretrain's
``tools/train.py`` builds them from the ``RUNNERS`` registry. Every
behaviour comes from a mixin of its own module, so a user's runner can take
the same ones.
"""
from mmengine.registry import RUNNERS
from mmengine.runner import FlexibleRunner, Runner

from .checkpoint_resume import VerifiedCheckpointMixin


@RUNNERS.register_module()
class MMAERunner(VerifiedCheckpointMixin, Runner):
    """mmengine's ``Runner`` with verified, own-checkpoint resume."""


@RUNNERS.register_module()
class MMAEFlexibleRunner(VerifiedCheckpointMixin, FlexibleRunner):
    """mmengine's ``FlexibleRunner`` with verified, own-checkpoint resume."""
