"""Evaluate a checkpoint with MMEngine's Runner (mmpretrain's arguments)."""
import argparse

import mmengine
from _cli import add_common_args, load_config, parse_with_local_rank
from mmengine.config import Config
from mmengine.evaluator import DumpResults
from mmengine.runner import Runner

import mmae_plugin  # noqa: F401  (registers components, applies fixes)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Evaluate a model with MMEngine (mmpretrain-compatible)')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    add_common_args(parser)
    parser.add_argument('--out', help='the file to output results.')
    parser.add_argument(
        '--out-item',
        choices=['metrics', 'pred'],
        help='To output whether metrics or predictions. '
        'Defaults to output predictions.')
    parser.add_argument(
        '--no-pin-memory',
        action='store_true',
        help='whether to disable the pin_memory option in dataloaders.')
    return parse_with_local_rank(parser)


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Fold the evaluation switches into the config."""
    cfg.load_from = args.checkpoint
    if args.no_pin_memory:
        cfg.test_dataloader['pin_memory'] = False
    if args.out is None and args.out_item is not None:
        raise ValueError('--out-item needs --out')
    return cfg


def main() -> None:
    args = parse_args()
    cfg = merge_args(load_config(args), args)
    runner = Runner.from_cfg(cfg)
    if args.out and args.out_item in ('pred', None):
        runner.test_evaluator.metrics.append(
            DumpResults(out_file_path=args.out))
    metrics = runner.test()
    if args.out and args.out_item == 'metrics':
        mmengine.dump(metrics, args.out)


if __name__ == '__main__':
    main()
