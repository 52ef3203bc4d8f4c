"""Matrix-information statistics of the frozen test features, as a metric."""
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric
from mmpretrain.registry import METRICS

from mmae_plugin.utils.validation import check_real
from ..statistics import representation_statistics


@METRICS.register_module()
class RepresentationStatistics(BaseMetric):
    """Entropy, effective rank, RankMe and TCR of all test features.

    Reads ``frozen_feature`` from the predictions, which
    :class:`~mmae_plugin.models.KNNClassifier` sets; features of every rank
    are collected by mmengine before :meth:`compute_metrics`.

    Args:
        tcr_mu: mu of the logged TCR, ``logdet(I + mu/d zn^T zn)``.
        collect_device: ``'cpu'`` or ``'gpu'``.
        prefix: Metric-name prefix (``'repr'``).
    """

    default_prefix = 'repr'

    def __init__(self,
                 tcr_mu: float = 1.0,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        tcr_mu = check_real(tcr_mu, 'tcr_mu', minimum=0, strict=True)
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.tcr_mu = tcr_mu

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            if 'frozen_feature' not in sample:
                raise KeyError(
                    'RepresentationStatistics needs predictions with '
                    "'frozen_feature' (use the KNNClassifier model)")
            self.results.append(sample['frozen_feature'].cpu())

    def compute_metrics(self, results: List) -> Dict[str, float]:
        return representation_statistics(
            torch.stack(results), tcr_mu=self.tcr_mu)
