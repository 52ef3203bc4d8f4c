"""Every frozen-feature metric of one checkpoint from one feature pass.

Builds the :class:`~mmae_plugin.models.KNNClassifier` of a kNN config, loads
a checkpoint into it, extracts the training and test features once and
computes kNN accuracy, the accuracy of a linear probe fitted on the cached
features, and the representation statistics of the test features, on the
accelerator when there is one (mmengine's ``get_device()``). For multi-GPU
kNN use ``tools/dist_test.sh`` with the kNN config instead.
"""
import copy
import sys
from typing import Dict, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.device import get_device
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner.amp import autocast
from mmengine.utils import ProgressBar
from mmpretrain.registry import MODELS
from torch import Tensor

from mmae_plugin.checkpoint.loading import verify_before_loading
from .knn import knn_class_scores
from .linear_probe import LinearProbe, fit_linear_probe
from .statistics import representation_statistics


@torch.no_grad()
def extract_features(model,
                     dataloader_cfg: dict,
                     amp: bool = False,
                     progress: bool = False,
                     label: str = 'images') -> Tuple[Tensor, Tensor]:
    """Features and labels of a whole dataset, in dataset order.

    Args:
        model: A model with ``data_preprocessor`` and ``extract_feat``.
        dataloader_cfg: Dataloader config (no shuffling).
        amp: Run the encoder under mmengine's ``autocast`` (float16 on
            GPUs, bfloat16 on CPUs), as ``tools/test.py --amp`` does; the
            features are returned in float32.
        progress: Show mmengine's progress bar, one step per image, after
            a line naming ``label`` (several bars follow one another).
        label: What the bar counts, e.g. ``'training images'``.

    Returns:
        ``(features (N, d), labels (N,))`` on the model's device (the data
        preprocessor moves each batch there).
    """
    model.eval()
    loader = Runner.build_dataloader(dataloader_cfg)
    bar = None
    if progress:
        print(f'features of {len(loader.dataset)} {label}:', flush=True)
        # The current stdout, not the one mmengine bound at import.
        bar = ProgressBar(len(loader.dataset), file=sys.stdout)
    feats, labels = [], []
    for batch in loader:
        data = model.data_preprocessor(batch, False)
        with autocast(enabled=amp):
            feats.append(model.extract_feat(data['inputs']).float())
        # Device tensors: no host sync per image.
        labels += [
            sample.gt_label.reshape(-1)[:1] for sample in data['data_samples']
        ]
        if bar is not None:
            bar.update(len(data['data_samples']))
    if bar is not None:
        bar.file.write('\n')
    return torch.cat(feats), torch.cat(labels).long()


def build_model(cfg: Config):
    """Build ``cfg.model`` with the config's top-level data preprocessor.

    mmpretrain configs give the preprocessor (mean, std) at the top level
    and mmengine's Runner moves it into the model; do the same here.
    """
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.setdefault('data_preprocessor', cfg.get('data_preprocessor'))
    return MODELS.build(model_cfg)


def accuracy(scores: Tensor, labels: Tensor, k: int = 1) -> float:
    """Top-k accuracy in percent."""
    return top_classes_accuracy(scores.topk(k, dim=1).indices, labels)


def top_classes_accuracy(top: Tensor, labels: Tensor) -> float:
    """Percent of rows whose ``top`` classes (N, k) include the label."""
    labels = labels.to(top.device)
    return 100.0 * (top == labels[:, None]).any(dim=1).double().mean().item()


def probe_accuracy(probe: LinearProbe, features: Tensor,
                   labels: Tensor) -> float:
    """Top-1 accuracy in percent of the float64 probe, in chunks (no
    (N, C) logits: 10 GB at ImageNet's training set)."""
    return top_classes_accuracy(probe.top_k_classes(features, 1), labels)


def float64_device(device: torch.device) -> torch.device:
    """Where the float64 probe and statistics run: ``device``, or the CPU
    for devices without float64 (Apple's MPS)."""
    return torch.device('cpu') if device.type == 'mps' else device


def probe_as_classifier(probe: LinearProbe,
                        device: torch.device) -> torch.nn.ModuleDict:
    """The probe as the float32 modules of the linear-probe configs.

    ``ClsBatchNormNeck`` and ``VisionTransformerClsHead`` from mmpretrain's
    registry, with the weights :func:`linear_probe_state_dict` saves: what
    ``tools/test.py`` runs on the saved checkpoint after the encoder.

    Args:
        probe: The fitted probe.
        device: Where the modules go.

    Returns:
        ``ModuleDict(neck=..., head=...)`` in eval mode.
    """
    dim, num_classes = probe.mean.numel(), probe.head.out_features
    classifier = torch.nn.ModuleDict({
        'neck':
        MODELS.build(dict(type='ClsBatchNormNeck', input_features=dim)),
        'head':
        MODELS.build(
            dict(
                type='VisionTransformerClsHead',
                num_classes=num_classes,
                in_channels=dim)),
    })
    classifier.load_state_dict(linear_probe_state_dict(probe, {}, 'cls'))
    return classifier.to(device).eval()


@torch.no_grad()
def saved_probe_logits(probe: LinearProbe,
                       features: Tensor,
                       amp: bool = False) -> Tensor:
    """Logits of the saved classifier, as ``tools/test.py`` computes them.

    The float64 probe and the float32 classifier it is saved as agree but
    for a borderline image; under ``--amp`` the classifier's matrix product
    runs in half precision, as in mmengine's test loop. These logits give
    the accuracy a user who evaluates the saved checkpoint gets.

    Args:
        probe: The fitted probe.
        features: Encoder features (N, d), extracted with the same ``amp``.
        amp: Run under mmengine's ``autocast`` (``tools/test.py --amp``).

    Returns:
        (N, C) float32 logits.
    """
    classifier = probe_as_classifier(probe, features.device)
    with autocast(enabled=amp):
        pooled = classifier['neck']((features.float(), ))
        return classifier['head'](pooled).float()


def evaluate_frozen_encoder(
    knn_config: Config,
    checkpoint: str,
    linear_weight_decay: float = 1e-4,
    amp: bool = False,
    progress: bool = False,
    device: Optional[str] = None
) -> Tuple[Dict[str, float], LinearProbe, dict]:
    """kNN, cached-feature linear probe and statistics of a checkpoint.

    Args:
        knn_config: A config whose model is a ``KNNClassifier``; its
            ``model.prototype`` is the training set and its
            ``test_dataloader`` the evaluation set.
        checkpoint: Pretraining or classifier checkpoint (``backbone.*``).
        linear_weight_decay: L2 coefficient of the linear probe.
        amp: Extract the features under mixed precision (see
            :func:`extract_features`); kNN, probe and statistics stay in
            float32 / float64, and ``linear/top1`` is that of the saved
            classifier under ``tools/test.py --amp``.
        progress: Show progress bars over the training and test images.
        device: Where the encoder, kNN, probe and statistics run; default
            mmengine's ``get_device()`` (``'cuda'`` when there is a GPU).

    Returns:
        ``(metrics, probe, encoder_state)``: metrics keyed ``knn/top1``,
        ``knn/top5``, ``linear/top1`` (the saved classifier's accuracy, see
        :func:`saved_probe_logits`), ``linear/probe_top1`` (the float64
        probe's), ``linear/train_top1`` and ``repr/<statistic>``; the fitted
        :class:`LinearProbe`; the encoder's weights on the CPU (see
        :func:`linear_probe_state_dict`).
    """
    verify_before_loading(checkpoint)
    device = torch.device(device or get_device())
    model = build_model(knn_config)
    load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    model.to(device)
    train_x, train_y = extract_features(
        model, knn_config.model.prototype, amp, progress,
        'training images (kNN neighbours, linear-probe fit)')
    test_x, test_y = extract_features(model, knn_config.test_dataloader, amp,
                                      progress, 'test images')

    scores = knn_class_scores(test_x, train_x, train_y, model.num_classes,
                              model.k, model.temperature)
    metrics = {
        'knn/top1': accuracy(scores, test_y, 1),
        'knn/top5': accuracy(scores, test_y, 5)
    }

    exact = float64_device(device)
    train_x, train_y = train_x.to(exact), train_y.to(exact)
    test_x, test_y = test_x.to(exact), test_y.to(exact)
    probe = fit_linear_probe(train_x, train_y, model.num_classes,
                             linear_weight_decay)
    metrics['linear/top1'] = accuracy(
        saved_probe_logits(probe, test_x.to(device), amp), test_y)
    metrics['linear/probe_top1'] = probe_accuracy(probe, test_x, test_y)
    metrics['linear/train_top1'] = probe_accuracy(probe, train_x, train_y)
    metrics.update({
        f'repr/{key}': value
        for key, value in representation_statistics(test_x).items()
    })
    encoder_state = {
        key: value.cpu()
        for key, value in model.image_encoder.state_dict().items()
    }
    return metrics, probe, encoder_state


def linear_probe_state_dict(probe: LinearProbe,
                            encoder_state: dict,
                            pooling: str = 'cls') -> Dict[str, Tensor]:
    """The cached-feature probe as weights of the linear-probe configs.

    ``ImageClassifier`` with ``ClsBatchNormNeck`` (affine-free BatchNorm,
    eps 1e-6) and ``VisionTransformerClsHead``: the BatchNorm's running
    statistics are the training features' mean and (biased) variance, which
    is exactly the standardisation the probe was fitted on.

    Args:
        probe: The fitted probe.
        encoder_state: The encoder's ``state_dict``.
        pooling: The features' pooling. ``'cls'``: the checkpoint is for
            ``configs/fashion_mnist/linear_fmnist.py`` (the BatchNorm is
            ``neck``); any other: for ``linear_fmnist_clsmean.py`` (with
            its ``TokenPoolingNeck`` set to the same pooling), whose neck is
            ``[TokenPoolingNeck, ClsBatchNormNeck]`` (the BatchNorm is
            ``neck.1``).

    Returns:
        A state dict for the linear-probe config.
    """
    batch_norm = 'neck.bn.' if pooling == 'cls' else 'neck.1.bn.'
    state = {f'backbone.{key}': value for key, value in encoder_state.items()}
    state.update({
        f'{batch_norm}running_mean': probe.mean.float(),
        f'{batch_norm}running_var': probe.var.float(),
        f'{batch_norm}num_batches_tracked': torch.tensor(0),
        'head.layers.head.weight': probe.head.weight.detach().float(),
        'head.layers.head.bias': probe.head.bias.detach().float(),
    })
    # A checkpoint on the CPU, whichever device the probe was fitted on.
    return {key: value.cpu() for key, value in state.items()}
