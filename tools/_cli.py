"""Command-line pieces shared by tools/train.py and tools/test.py.

The scripts keep mmpretrain's arguments; this module holds the parts they
have in common so that both parse and apply them the same way.
"""
import argparse
import os
import os.path as osp

from mmengine.config import Config, DictAction


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--work-dir``, ``--cfg-options``, ``--launcher`` and ``--local_rank``."""
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override some settings in the used config, the key-value pair '
        'in xxx=yyy format will be merged into config file.')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_with_local_rank(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, exporting ``LOCAL_RANK`` for launchers that pass it as a flag."""
    args = parser.parse_args()
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def load_config(args: argparse.Namespace) -> Config:
    """The config with ``--cfg-options``, launcher and work dir applied.

    The work dir is ``--work-dir``, else the config's own, else
    ``./work_dirs/<config name>`` as in mmpretrain.
    """
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg
