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
from .collate_scope import CollateScopeMixin
from .cpu_distributed import (CpuDistributedFlexibleRunnerMixin,
                              CpuDistributedRunnerMixin)
from .launch_record import LaunchRecordMixin


@RUNNERS.register_module()
class MMAERunner(VerifiedCheckpointMixin, LaunchRecordMixin,
                 CpuDistributedRunnerMixin, CollateScopeMixin, Runner):
    """mmengine's ``Runner`` with verified, own-checkpoint resume that
    refuses a changed launch, DDP on hosts without an accelerator and
    ``collate_fn`` without ``_scope_``."""


@RUNNERS.register_module()
class MMAEFlexibleRunner(VerifiedCheckpointMixin, LaunchRecordMixin,
                         CpuDistributedFlexibleRunnerMixin, CollateScopeMixin,
                         FlexibleRunner):
    """mmengine's ``FlexibleRunner`` with verified, own-checkpoint resume
    that refuses a changed launch, DDP / FSDP on hosts without an
    accelerator and ``collate_fn`` without ``_scope_``."""
