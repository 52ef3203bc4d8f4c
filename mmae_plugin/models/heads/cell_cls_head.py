"""One linear classifier per cell of a mosaic, on a shared feature."""
from typing import List, Optional, Tuple

import torch
from mmpretrain.models.heads import ClsHead
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from torch import Tensor, nn

from mmae_plugin.utils.validation import check_int


@MODELS.register_module()
class CellClsHead(ClsHead):
    """Classify every cell of a mosaic from one pooled feature.

    A linear layer maps the backbone's last output (a ViT's CLS token) to
    ``num_cells x num_classes`` scores; the loss is each cell's classification
    loss against the row-major ``gt_label`` of
    :class:`~mmae_plugin.datasets.FashionMNISTMosaic`, averaged over cells
    (the supervised control of docs/mosaic.md). Example::

        head=dict(type='CellClsHead', num_cells=4, num_classes=10,
                  in_channels=128, loss=dict(type='CrossEntropyLoss'))

    Args:
        num_cells: Cells per image (>= 1).
        num_classes: Classes per cell (>= 2).
        in_channels: Width of the feature.
        **kwargs: ``ClsHead``'s ``loss``, ``init_cfg``.
    """

    def __init__(self, num_cells: int, num_classes: int, in_channels: int,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_cells = check_int(num_cells, 'num_cells', minimum=1)
        self.num_classes = check_int(num_classes, 'num_classes', minimum=2)
        check_int(in_channels, 'in_channels', minimum=1)
        self.fc = nn.Linear(in_channels, num_cells * num_classes)

    def forward(self, feats: Tuple[Tensor]) -> Tensor:
        """Scores (B, num_cells, num_classes)."""
        scores = self.fc(self.pre_logits(feats))
        return scores.view(-1, self.num_cells, self.num_classes)

    def _get_loss(self, cls_score: Tensor, data_samples: List[DataSample],
                  **kwargs) -> dict:
        target = torch.stack([sample.gt_label for sample in data_samples])
        if target.shape != cls_score.shape[:2]:
            raise ValueError(
                f'CellClsHead: gt_label of shape {tuple(target.shape[1:])} '
                f'per sample, expected ({self.num_cells},): one class per '
                'cell')
        flat = cls_score.reshape(-1, self.num_classes)
        loss = self.loss_module(
            flat, target.reshape(-1), avg_factor=flat.size(0), **kwargs)
        return dict(loss=loss)

    def _get_predictions(
            self, cls_score: Tensor,
            data_samples: Optional[List[DataSample]]) -> List[DataSample]:
        """``pred_score`` (num_cells, num_classes) softmax and
        ``pred_label`` (num_cells,) per sample."""
        scores = cls_score.softmax(dim=-1).detach()
        samples = data_samples or [None] * len(scores)
        out = []
        for sample, score in zip(samples, scores):
            sample = sample if sample is not None else DataSample()
            sample.set_field(score, 'pred_score', dtype=Tensor)
            sample.set_field(score.argmax(dim=-1), 'pred_label', dtype=Tensor)
            out.append(sample)
        return out
