"""MMEngine runners of the plugin (``runner_type`` in a config)."""
from .checkpoint_resume import ForeignCheckpointError, VerifiedCheckpointMixin
from .collate_scope import CollateScopeMixin
from .cpu_distributed import (CpuDistributedFlexibleRunnerMixin,
                              CpuDistributedRunnerMixin)
from .exact_resume import (ExactResumeEpochBasedTrainLoop, ExactResumeMixin,
                           InexactResumeError)
from .launch_record import LaunchChangedError, LaunchRecordMixin
from .runners import MMAEFlexibleRunner, MMAERunner
from .work_dir_lock import (WorkDirLockedError, WorkDirLockError,
                            WorkDirLockMixin)

__all__ = [
    'VerifiedCheckpointMixin', 'ForeignCheckpointError', 'LaunchRecordMixin',
    'LaunchChangedError', 'CpuDistributedRunnerMixin',
    'CpuDistributedFlexibleRunnerMixin', 'CollateScopeMixin', 'MMAERunner',
    'MMAEFlexibleRunner', 'ExactResumeMixin', 'ExactResumeEpochBasedTrainLoop',
    'InexactResumeError', 'WorkDirLockMixin', 'WorkDirLockError',
    'WorkDirLockedError'
]
