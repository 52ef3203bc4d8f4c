"""MMEngine runners of the plugin (``runner_type`` in a config)."""
from .checkpoint_resume import VerifiedCheckpointMixin
from .runners import MMAEFlexibleRunner, MMAERunner

__all__ = ['VerifiedCheckpointMixin', 'MMAERunner', 'MMAEFlexibleRunner']
