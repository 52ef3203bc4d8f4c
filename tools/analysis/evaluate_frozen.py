"""A checkpoint's frozen encoder evaluated: kNN, linear probe, statistics.

One pass of feature extraction over the training and test sets of a kNN
config (``configs/fashion_mnist/knn_fmnist.py``), then

* weighted kNN top-1 / top-5 (the config's k and temperature),
* a linear probe (BatchNorm without affine + linear, the linear-probe
  configs' classifier) fitted to convergence on the cached training
  features,
* effective rank, RankMe, matrix entropy and TCR of the test features,

written as JSON. ``--save-linear`` stores the probe as a checkpoint of
``configs/fashion_mnist/linear_fmnist.py`` (CLS features) or
``linear_fmnist_clsmean.py`` (``knn_fmnist_clsmean.py``'s CLS + mean
features), so ``tools/test.py`` evaluates it.
For multi-process kNN use ``tools/dist_test.sh`` with the kNN config.

Example::

    python tools/analysis/evaluate_frozen.py \\
        configs/fashion_mnist/knn_fmnist.py \\
        work_dirs/mmae_fmnist/epoch_5.pth --out metrics.json
"""
import argparse
import json
import os
import os.path as osp

import torch

# Before mmengine, so that importing it registers nothing yet: mmcv-lite's
# MultiScaleDeformableAttention warning (import of mmpretrain.models) and
# the pkg_resources warning of mmengine's lookup of mmpretrain:: bases are
# harmless (mmae_plugin/compat/cli_warnings.py).
from mmae_plugin.checkpoint.atomic_write import open_atomically
from mmae_plugin.compat.cli_warnings import quiet_known_upstream_warnings

with quiet_known_upstream_warnings():
    from mmengine.config import Config, DictAction
    from mmengine.registry import init_default_scope

    import mmae_plugin.registration  # noqa: F401  (components, fixes)
    from mmae_plugin.evaluation import (evaluate_frozen_encoder,
                                        linear_probe_state_dict)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='kNN, cached linear probe and representation statistics '
        'of a frozen encoder')
    parser.add_argument('config', help='kNN config (model: KNNClassifier)')
    parser.add_argument(
        'checkpoint',
        help='pretraining or classifier '
        'checkpoint (its backbone.* weights are used)')
    parser.add_argument('--out', help='write the metrics to this JSON file')
    parser.add_argument(
        '--save-linear',
        metavar='PATH',
        help='save the fitted probe as a linear-probe '
        'config checkpoint')
    parser.add_argument(
        '--weight-decay',
        type=float,
        default=1e-4,
        help='l2 coefficient of the linear probe')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='extract the features with automatic mixed '
        'precision (bfloat16 on CPUs), as tools/test.py '
        '--amp does')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the config (key=value)')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with quiet_known_upstream_warnings():
        cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    metrics, probe, encoder = evaluate_frozen_encoder(
        cfg,
        args.checkpoint,
        linear_weight_decay=args.weight_decay,
        amp=args.amp,
        progress=True)
    for key, value in metrics.items():
        print(f'{key}: {value:.4f}')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(metrics, f, indent=1)
    if args.save_linear:
        state = linear_probe_state_dict(probe, encoder,
                                        cfg.model.get('pooling', 'cls'))
        with open_atomically(args.save_linear) as f:
            torch.save({'state_dict': state}, f)


if __name__ == '__main__':
    main()
