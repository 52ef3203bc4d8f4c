"""kNN classification of frozen features, on mmpretrain's image retriever."""
from typing import List, Optional

import torch
from mmpretrain.models import ImageToImageRetriever
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from torch import Tensor

from mmae_plugin.evaluation.knn import NeighbourBank, check_knn_args
from ..necks import check_pooling, pool_tokens


@MODELS.register_module()
class KNNClassifier(ImageToImageRetriever):
    """Weighted kNN classifier over the frozen features of a backbone.

    mmpretrain's :class:`ImageToImageRetriever` extracts the ``prototype``
    (training set) features before the first test batch; each test image's
    ``k`` most cosine-similar ones vote with weight ``exp(cos / temperature)``
    (:class:`~mmae_plugin.evaluation.knn.NeighbourBank`). Predictions are class
    scores for mmpretrain's ``Accuracy``; each sample also carries
    ``frozen_feature`` for
    :class:`~mmae_plugin.evaluation.RepresentationStatistics`. A pretraining or
    classifier checkpoint loads as it is (``backbone.*`` weights), so
    ``tools/test.py KNN_CONFIG PRETRAINED.pth`` evaluates an encoder. See
    docs/evaluation.md#knn-knnclassifier.

    Args:
        backbone: Config of the encoder, e.g. ``VisionTransformer`` with
            ``out_type='cls_token'`` (CLS feature), ``'featmap'`` (patch
            tokens, mean-pooled here) or ``'raw'`` (every pooling).
        prototype: Dataloader config of the labelled training images.
        num_classes: Number of classes.
        k: Neighbours that vote (20 as in DINO).
        temperature: Vote temperature T (0.07 as in InstDisc / DINO).
        pooling: ``'cls'``, ``'mean'`` (of the patch tokens) or
            ``'cls+mean'`` (both concatenated), checked against the
            backbone's ``out_type`` when the model is built (see
            :func:`~mmae_plugin.models.necks.pool_tokens`).
        data_preprocessor: Config of the preprocessor
            (``ClsDataPreprocessor`` by default).
        init_cfg: Initialisation config.
    """

    def __init__(self,
                 backbone: dict,
                 prototype: dict,
                 num_classes: int,
                 k: int = 20,
                 temperature: float = 0.07,
                 pooling: str = 'cls',
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        check_knn_args(k, temperature, num_classes)
        if not isinstance(prototype, dict):
            raise TypeError('prototype must be a dataloader config (dict), '
                            f'got {type(prototype).__name__}')
        super().__init__(
            image_encoder=backbone,
            prototype=prototype,
            topk=-1,
            data_preprocessor=data_preprocessor,
            init_cfg=init_cfg)
        self.num_classes = num_classes
        self.k = k
        self.temperature = float(temperature)
        check_pooling(pooling, getattr(self.image_encoder, 'out_type', 'raw'))
        self.pooling = pooling
        self._neighbour_bank: Optional[NeighbourBank] = None
        self._register_load_state_dict_pre_hook(_backbone_keys_to_encoder)

    def extract_feat(self, inputs: Tensor) -> Tensor:
        """Pooled features (B, C), or (B, 2C) for ``'cls+mean'``."""
        feats = self.image_encoder(inputs)
        if isinstance(feats, (tuple, list)):
            feats = feats[-1]
        return pool_tokens(feats, self.pooling,
                           getattr(self.image_encoder, 'num_extra_tokens', 1))

    def _get_prototype_vecs_from_dataloader(self, data_loader) -> Tensor:
        labels = torch.as_tensor(
            data_loader.dataset.get_gt_labels(), dtype=torch.long)
        self.register_buffer('prototype_labels', labels, persistent=False)
        return super()._get_prototype_vecs_from_dataloader(data_loader)

    def prepare_prototype(self) -> None:
        """Extract the training features and labels (all ranks)."""
        with torch.no_grad():
            super().prepare_prototype()
        self.prototype_labels = self.prototype_labels.to(
            self.prototype_vecs.device)
        self._neighbour_bank = None

    @property
    def neighbour_bank(self) -> NeighbourBank:
        """The prepared bank of the prototype features, built once (again
        only when the buffers were replaced, e.g. by ``.to(device)``)."""
        bank = self._neighbour_bank
        if (bank is None or bank.rows is not self.prototype_vecs
                or bank.labels is not self.prototype_labels):
            bank = NeighbourBank(self.prototype_vecs, self.prototype_labels)
            self._neighbour_bank = bank
        return bank

    @torch.no_grad()
    def predict(self,
                inputs: Tensor,
                data_samples: Optional[List[DataSample]] = None,
                **kwargs) -> List[DataSample]:
        """kNN class scores of a batch of images.

        Args:
            inputs: Preprocessed images (B, C, H, W).
            data_samples: Their data samples, if any.

        Returns:
            Data samples with ``pred_score``, ``pred_label`` and
            ``frozen_feature`` set.
        """
        if not self.prototype_inited:
            self.prepare_prototype()
        # float32 whatever autocast produced; the bank decides the
        # neighbours, votes and scores in float64 with autocast off
        # (tools/test.py --amp), see mmae_plugin.evaluation.knn.
        feats = self.extract_feat(inputs).float()
        scores = self.neighbour_bank.class_scores(feats, self.num_classes,
                                                  self.k, self.temperature)
        if data_samples is None:
            data_samples = [DataSample() for _ in range(feats.shape[0])]
        for sample, score, feat in zip(data_samples, scores, feats):
            sample.set_pred_score(score)
            sample.set_field(feat, 'frozen_feature')
        return data_samples


def _backbone_keys_to_encoder(state_dict, prefix, *args) -> None:
    """Load ``backbone.*`` weights of other models into ``image_encoder``."""
    if any(key.startswith(prefix + 'image_encoder.') for key in state_dict):
        return
    source = prefix + 'backbone.'
    for key in [key for key in state_dict if key.startswith(source)]:
        new_key = prefix + 'image_encoder.' + key[len(source):]
        state_dict[new_key] = state_dict.pop(key)
