"""The evaluation protocol of a comparison: metrics of one checkpoint.

The frozen evaluation: one pass of the encoder over the training images
(the kNN neighbours and the probes' training set) and the test images of a
``KNNClassifier`` config gives its features; a ``'cls+mean'`` config
(:func:`~mmae_plugin.models.necks.pool_tokens`) gives every pooling at
once (the CLS token is the first half, the mean patch token the second).
On each pooling's cached features: the plugin's weighted kNN
(:func:`~mmae_plugin.evaluation.knn.knn_class_scores`: float32 search,
neighbours and scores those of float64), the full-label linear probe,
low-shot probes and the representation statistics of
:mod:`mmae_plugin.evaluation.statistics` (whatever keys it defines,
prefixed ``repr/``). Besides, any
``tools/test.py`` config can be run on the checkpoint
(:func:`test_config_metrics`).
"""
import os
import os.path as osp
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from mmae_plugin.evaluation.frozen import accuracy, extract_features
from mmae_plugin.evaluation.knn import knn_class_scores
from mmae_plugin.evaluation.linear_probe import fit_linear_probe
from mmae_plugin.evaluation.lowshot import fit_lowshot_probe, lowshot_indices
from mmae_plugin.evaluation.statistics import representation_statistics
from .spec import Protocol, resolve_config


def knn_scores(test_x: Tensor, train_x: Tensor, train_y: Tensor,
               num_classes: int, k: int, temperature: float) -> Tensor:
    """The plugin's kNN: the bank prepared once, the queries searched in
    bounded chunks, neighbours and scores those of float64."""
    return knn_class_scores(test_x, train_x, train_y, num_classes, k,
                            temperature)


def split_poolings(features: Tensor, pooling: str,
                   wanted: Sequence[str]) -> Dict[str, Tensor]:
    """The ``wanted`` poolings of features pooled as ``pooling``.

    ``pool_tokens(..., 'cls+mean')`` concatenates ``[cls, patch mean]``, so
    a ``'cls+mean'`` config gives all three poolings; any other gives only
    its own.

    Args:
        features: (N, C) features of the evaluation config.
        pooling: The config's pooling (``model.pooling``).
        wanted: The poolings asked for.

    Returns:
        Pooling -> (N, d) features, in the order of ``wanted``.
    """
    if pooling != 'cls+mean':
        if list(wanted) != [pooling]:
            raise ValueError(f'the evaluation config pools {pooling!r}; it '
                             f'cannot give {list(wanted)} (use a cls+mean '
                             'config for several poolings)')
        return {pooling: features}
    if features.dim() != 2 or features.shape[1] % 2:
        raise ValueError('expected (N, 2C) cls+mean features, got shape '
                         f'{tuple(features.shape)}')
    half = features.shape[1] // 2
    parts = {
        'cls': features[:, :half],
        'mean': features[:, half:],
        'cls+mean': features
    }
    return {name: parts[name] for name in wanted}


def feature_metrics(train_x: Tensor,
                    train_y: Tensor,
                    test_x: Tensor,
                    test_y: Tensor,
                    num_classes: int,
                    seed: int,
                    shots: Sequence[int] = (10, 100),
                    k: int = 20,
                    temperature: float = 0.07,
                    weight_decay: float = 1e-4) -> Dict[str, float]:
    """kNN, linear, low-shot and statistics of one pooling's features.

    Args:
        train_x: Training features (N, d).
        train_y: Training labels (N,).
        test_x: Test features (M, d).
        test_y: Test labels (M,).
        num_classes: Number of classes.
        seed: Fixes the low-shot label subsets (see
            :func:`~mmae_plugin.evaluation.lowshot.lowshot_indices`).
        shots: Labels per class of the low-shot probes.
        k: kNN neighbours.
        temperature: kNN vote temperature.
        weight_decay: L2 coefficient of every probe.

    Returns:
        ``knn_top1``, ``knn_top5``, ``linear_top1``, ``linear_train_top1``,
        ``lowshot<k>_top1`` per shot, and ``repr/<statistic>``.
    """
    train_x, test_x = train_x.double(), test_x.double()
    scores = knn_scores(test_x, train_x, train_y, num_classes, k, temperature)
    metrics = {
        'knn_top1': accuracy(scores, test_y, 1),
        'knn_top5': accuracy(scores, test_y, 5)
    }
    probe = fit_linear_probe(train_x, train_y, num_classes, weight_decay)
    metrics['linear_top1'] = accuracy(probe.logits(test_x), test_y)
    metrics['linear_train_top1'] = accuracy(probe.logits(train_x), train_y)
    labels = train_y.cpu().numpy()
    for shot in shots:
        rows = lowshot_indices(labels, shot, seed)
        low = fit_lowshot_probe(train_x, train_y, rows, num_classes,
                                weight_decay)
        metrics[f'lowshot{shot}_top1'] = accuracy(low.logits(test_x), test_y)
    metrics.update({
        f'repr/{key}': value
        for key, value in representation_statistics(test_x).items()
    })
    return metrics


def evaluate_checkpoint(
        eval_config: str,
        checkpoint: str,
        seed: int,
        poolings: Sequence[str] = ('cls', 'cls+mean'),
        shots: Sequence[int] = (10, 100),
        bank_images: Optional[int] = None,
        test_images: Optional[int] = None,
        weight_decay: float = 1e-4,
        features_out: Optional[str] = None) -> Dict[str, float]:
    """Frozen-feature metrics of a checkpoint's encoder on each pooling.

    Args:
        eval_config: A ``KNNClassifier`` config
            (``configs/fashion_mnist/knn_fmnist_clsmean.py`` pools
            ``cls+mean`` and so gives every pooling).
        checkpoint: Checkpoint with ``backbone.*`` weights (pretraining,
            supervised classifier or random init).
        seed: The run's seed (fixes the low-shot subsets).
        poolings: The poolings reported (see :func:`split_poolings`).
        shots: Labels per class of the low-shot probes.
        bank_images: Use the first N training images (``None``: all).
        test_images: Classify the first M test images (``None``: all).
        weight_decay: L2 coefficient of every probe.
        features_out: If given, save the test features (float32) and
            labels there, so statistics can be recomputed later without
            the encoder.

    Returns:
        ``<pooling>/<metric>`` per pooling (see :func:`feature_metrics`),
        plus ``train_images`` and ``test_images``.
    """
    model, train_x, train_y, test_x, test_y = checkpoint_features(
        eval_config, checkpoint, bank_images, test_images)
    pooling = getattr(model, 'pooling', 'cls')
    if features_out is not None:
        save_features(features_out, test_x, test_y, pooling)
    metrics = {
        'train_images': int(train_x.shape[0]),
        'test_images': int(test_x.shape[0])
    }
    train = split_poolings(train_x, pooling, poolings)
    test = split_poolings(test_x, pooling, poolings)
    for name in poolings:
        values = feature_metrics(train[name], train_y, test[name], test_y,
                                 model.num_classes, seed, shots, model.k,
                                 model.temperature, weight_decay)
        metrics.update(
            {f'{name}/{key}': value
             for key, value in values.items()})
    return metrics


def checkpoint_features(eval_config: str,
                        checkpoint: str,
                        bank_images: Optional[int] = None,
                        test_images: Optional[int] = None,
                        return_config: bool = False):
    """The frozen features of a checkpoint's encoder (float32, no autocast:
    the numbers carry no AMP noise).

    Args:
        eval_config: A ``KNNClassifier`` config: its ``model.prototype``
            dataloader gives the training images, its ``test_dataloader``
            the test images.
        checkpoint: Checkpoint with ``backbone.*`` weights.
        bank_images: Use the first N training images (``None``: all).
        test_images: Use the first M test images (``None``: all).
        return_config: Also return the merged config.

    Returns:
        ``(model, train_x, train_y, test_x, test_y)`` (and the config),
        features in dataset order; the labels are each image's first.
    """
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint

    from mmae_plugin.checkpoint.loading import verify_before_loading
    from mmae_plugin.evaluation.frozen import build_model

    init_default_scope('mmpretrain')
    cfg = Config.fromfile(eval_config)
    options = {
        'model.prototype.num_workers': 0,
        'test_dataloader.num_workers': 0,
        'test_dataloader.persistent_workers': False
    }
    if bank_images is not None:
        options['model.prototype.dataset.indices'] = bank_images
    if test_images is not None:
        options['test_dataloader.dataset.indices'] = test_images
    cfg.merge_from_dict(options)
    model = build_model(cfg)
    verify_before_loading(checkpoint)
    load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    train_x, train_y = extract_features(model, cfg.model.prototype)
    test_x, test_y = extract_features(model, cfg.test_dataloader)
    found = (model, train_x, train_y, test_x, test_y)
    return found + (cfg, ) if return_config else found


def evaluate_mosaic_checkpoint(
        eval_config: str,
        checkpoint: str,
        seed: int,
        poolings: Sequence[str] = ('cls', 'mean'),
        shots: Sequence[int] = (10, ),
        weight_decay: float = 1e-4,
        bank_images: Optional[int] = None,
        test_images: Optional[int] = None) -> Dict[str, float]:
    """Mosaic readings of a checkpoint's encoder on each pooling.

    Args:
        eval_config: A ``KNNClassifier`` config over
            ``FashionMNISTMosaic`` data
            (``configs/fashion_mnist_mosaic/features_mosaic.py``).
        checkpoint: Checkpoint with ``backbone.*`` weights.
        seed: The run's seed (fixes the low-shot draws).
        poolings: The poolings reported (see :func:`split_poolings`).
        shots: Labels per class of the low-shot probes.
        weight_decay: L2 coefficient of every probe.
        bank_images: Use the first N training mosaics (``None``: all).
        test_images: Use the first M test mosaics (``None``: all).

    Returns:
        ``<pooling>/<metric>`` per pooling (see
        :func:`~mmae_plugin.evaluation.mosaic.mosaic_metrics`), plus
        ``train_images`` and ``test_images``.
    """
    from mmpretrain.registry import DATASETS

    from mmae_plugin.evaluation.mosaic import mosaic_metrics
    model, train_x, _, test_x, _, cfg = checkpoint_features(
        eval_config, checkpoint, bank_images, test_images, True)
    train_cells = torch.as_tensor(
        DATASETS.build(cfg.model.prototype.dataset).get_gt_labels())
    test_cells = torch.as_tensor(
        DATASETS.build(cfg.test_dataloader.dataset).get_gt_labels())
    metrics = {
        'train_images': int(train_x.shape[0]),
        'test_images': int(test_x.shape[0])
    }
    pooling = getattr(model, 'pooling', 'cls')
    train = split_poolings(train_x, pooling, poolings)
    test = split_poolings(test_x, pooling, poolings)
    for name in poolings:
        values = mosaic_metrics(
            train[name],
            train_cells,
            test[name],
            test_cells,
            seed,
            num_classes=model.num_classes,
            shots=shots,
            weight_decay=weight_decay)
        metrics.update(
            {f'{name}/{key}': value
             for key, value in values.items()})
    return metrics


def save_features(path: str, features: Tensor, labels: Tensor,
                  pooling: str) -> None:
    """Save test features (float32, CPU), their labels and pooling."""
    from mmae_plugin.checkpoint.atomic_write import open_atomically
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open_atomically(path) as f:
        torch.save({
            pooling: features.float().cpu(),
            'labels': labels.cpu()
        }, f)


def test_config_metrics(test_config: str, checkpoint: str,
                        work_dir: str) -> Dict[str, float]:
    """What ``tools/test.py TEST_CONFIG CHECKPOINT`` reports.

    Args:
        test_config: Any config with a test dataloader and evaluator.
        checkpoint: Loaded as ``load_from`` (mmengine's non-strict load).
        work_dir: The test run's work dir (its logs).

    Returns:
        The test loop's metrics (numbers only).
    """
    from mmengine.config import Config

    from mmae_plugin.engine.runners.build import build_runner

    cfg = Config.fromfile(test_config)
    cfg.work_dir = work_dir
    cfg.load_from = checkpoint
    cfg.resume = False
    metrics = build_runner(cfg).test()
    return {
        key: float(value)
        for key, value in metrics.items() if isinstance(value, (int, float))
    }


def random_init_state(eval_config: str, seed: int) -> Dict[str, Tensor]:
    """``backbone.*`` weights of the evaluation encoder, randomly initialised.

    The architecture's own initialisation (mmpretrain's
    ``VisionTransformer.init_weights``) after seeding every generator with
    ``seed``: a comparison's random-init control.
    """
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import set_random_seed

    from mmae_plugin.evaluation.frozen import build_model

    init_default_scope('mmpretrain')
    set_random_seed(seed)
    model = build_model(Config.fromfile(eval_config))
    model.init_weights()
    return {
        f'backbone.{key}': value.detach().cpu().clone()
        for key, value in model.image_encoder.state_dict().items()
    }


def check_evaluation_settings(protocol: Protocol) -> None:
    """Refuse, before any job is submitted, a protocol the evaluation of a
    trained checkpoint would refuse.

    Checks what fails only after training otherwise: the poolings against
    the evaluation config's pooling (:func:`split_poolings`) and every
    ``--shots`` against the rows per class of the kNN bank (the first
    ``bank_images`` training images; :func:`~mmae_plugin.evaluation.lowshot.
    lowshot_indices`). Reads the bank's labels, not its images.

    Args:
        protocol: The comparison's protocol (its config paths as given on
            the command line).

    Raises:
        ValueError: Naming the setting, its value and what is allowed.
    """
    if protocol.eval_config is None:
        return
    import copy

    import numpy as np
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import DATASETS

    import mmae_plugin.registration  # noqa: F401  (the plugin's datasets)
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(resolve_config(protocol.eval_config))
    pooling = cfg.model.get('pooling', 'cls')
    if pooling != 'cls+mean' and list(protocol.poolings) != [pooling]:
        raise ValueError(
            f'--poolings {" ".join(protocol.poolings)}: the evaluation '
            f'config {protocol.eval_config} pools {pooling!r} and gives '
            f'only --poolings {pooling} (a cls+mean config gives every '
            'pooling)')
    if not protocol.shots:
        return
    bank = copy.deepcopy(cfg.model.prototype.dataset)
    if protocol.bank_images is not None:
        bank['indices'] = protocol.bank_images
    classes, counts = np.unique(
        DATASETS.build(bank).get_gt_labels(), return_counts=True)
    fewest = int(counts.min())
    too_many = [shot for shot in protocol.shots if shot > fewest]
    if too_many:
        scarce = int(classes[counts.argmin()])
        images = ('all' if protocol.bank_images is None else
                  f'the first {protocol.bank_images}')
        raise ValueError(
            f'--shots {" ".join(map(str, protocol.shots))}: class {scarce} '
            f'has only {fewest} rows in the kNN bank ({images} training '
            f'images, --bank-images), so at most {fewest} labels per class '
            f'are possible; lower --shots or raise --bank-images')
