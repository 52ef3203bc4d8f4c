"""MMEngine strategies of the plugin (``strategy.type`` in a config)."""
from .fsdp import MMAEFSDPStrategy
from .fsdp_optim_state_copy import gathered_states_copied

__all__ = ['MMAEFSDPStrategy', 'gathered_states_copied']
