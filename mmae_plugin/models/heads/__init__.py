from .cell_cls_head import CellClsHead
from .spectral_contrastive_head import SpectralContrastiveHead

__all__ = ['CellClsHead', 'SpectralContrastiveHead']
