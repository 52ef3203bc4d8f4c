"""MMEngine runners of the plugin (``runner_type`` in a config)."""
from .collate_scope import CollateScopeMixin
from .cpu_distributed import (CpuDistributedFlexibleRunnerMixin,
                              CpuDistributedRunnerMixin)
from .exact_resume import (ExactResumeEpochBasedTrainLoop, ExactResumeMixin,
                           InexactResumeError)
from .launch_record import LaunchChangedError
from .resume_gate import ForeignCheckpointError, ResumeGateMixin
from .runners import MMAEFlexibleRunner, MMAERunner
from .work_dir_lock import (WorkDirLockedError, WorkDirLockError,
                            WorkDirLockMixin)

__all__ = [
    'ResumeGateMixin', 'ForeignCheckpointError', 'LaunchChangedError',
    'CpuDistributedRunnerMixin', 'CpuDistributedFlexibleRunnerMixin',
    'CollateScopeMixin', 'MMAERunner', 'MMAEFlexibleRunner',
    'ExactResumeMixin', 'ExactResumeEpochBasedTrainLoop', 'InexactResumeError',
    'WorkDirLockMixin', 'WorkDirLockError', 'WorkDirLockedError'
]
