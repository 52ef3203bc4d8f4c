"""The plugin's runners: mmengine's, with verified, exact checkpoint resume.

Selected in a config with ``runner_type = 'MMAERunner'`` (or
``'MMAEFlexibleRunner'`` for FSDP / DeepSpeed strategies); mmpretrain's
``tools/train.py`` builds them from the ``RUNNERS`` registry. Every
behaviour comes from a mixin of its own module, so a user's runner can take
the same ones.
"""
from mmengine.registry import RUNNERS
from mmengine.runner import FlexibleRunner, Runner

from .collate_scope import CollateScopeMixin
from .cpu_distributed import (CpuDistributedFlexibleRunnerMixin,
                              CpuDistributedRunnerMixin)
from .exact_resume import ExactResumeMixin
from .resume_gate import ResumeGateMixin
from .work_dir_lock import WorkDirLockMixin


@RUNNERS.register_module()
class MMAERunner(WorkDirLockMixin, ExactResumeMixin, ResumeGateMixin,
                 CpuDistributedRunnerMixin, CollateScopeMixin, Runner):
    """mmengine's ``Runner`` training alone in its work folder, with
    verified, own-checkpoint resume that refuses a changed launch and
    continues inside an epoch, DDP on hosts without an accelerator and
    ``collate_fn`` without ``_scope_``."""


@RUNNERS.register_module()
class MMAEFlexibleRunner(WorkDirLockMixin, ExactResumeMixin, ResumeGateMixin,
                         CpuDistributedFlexibleRunnerMixin, CollateScopeMixin,
                         FlexibleRunner):
    """mmengine's ``FlexibleRunner`` training alone in its work folder,
    with verified, own-checkpoint resume that refuses a changed launch and
    continues inside an epoch, DDP / FSDP on hosts without an accelerator
    and ``collate_fn`` without ``_scope_``."""
