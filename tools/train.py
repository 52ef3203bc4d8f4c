"""Train a model with MMEngine's Runner (mmpretrain's arguments).

Importing ``mmae_plugin`` first applies the upstream workarounds (checkpoint
allow-list, CPU distributed training) before the runner exists.
"""
import argparse

from _cli import add_common_args, load_config, parse_with_local_rank
from mmengine.config import Config
from mmengine.runner import Runner

import mmae_plugin  # noqa: F401  (registers components, applies fixes)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    add_common_args(parser)
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='If specify checkpoint path, resume from it, while if not '
        'specify, try to auto resume from the latest checkpoint '
        'in the work directory.')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='enable automatic-mixed-precision training')
    parser.add_argument(
        '--no-validate',
        action='store_true',
        help='whether not to evaluate the checkpoint during training')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='whether to auto scale the learning rate according to the '
        'actual batch size and the original batch size.')
    parser.add_argument(
        '--no-pin-memory',
        action='store_true',
        help='whether to disable the pin_memory option in dataloaders.')
    parser.add_argument(
        '--no-persistent-workers',
        action='store_true',
        help='whether to disable the persistent_workers option in '
        'dataloaders.')
    return parse_with_local_rank(parser)


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Fold the training switches into the config."""
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    if args.no_validate:
        cfg.val_cfg = None
        cfg.val_dataloader = None
        cfg.val_evaluator = None
    if args.auto_scale_lr:
        cfg.auto_scale_lr.enable = True

    def set_loader_flag(key: str, value: bool) -> None:
        for split in ('train', 'val', 'test'):
            loader = cfg.get(f'{split}_dataloader')
            if loader is not None:
                loader[key] = value

    if args.no_pin_memory:
        set_loader_flag('pin_memory', False)
    if args.no_persistent_workers:
        set_loader_flag('persistent_workers', False)
    return cfg


def main() -> None:
    args = parse_args()
    cfg = merge_args(load_config(args), args)
    runner = Runner.from_cfg(cfg)
    runner.train()


if __name__ == '__main__':
    main()
