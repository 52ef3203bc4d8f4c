from .gather import GATHER_MODES, check_gather_mode, gather_features

__all__ = ['GATHER_MODES', 'check_gather_mode', 'gather_features']
