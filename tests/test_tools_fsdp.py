"""mmpretrain's FlexibleRunner / FSDP recipe runs through tools/train.py."""
import os
import subprocess
import zipfile

import torch
from mmengine.config import Config
from mmengine.registry import FUNCTIONS
from mmpretrain.registry import MODELS

import mmae_plugin  # noqa: F401

FSDP_CONFIG = 'configs/mmae_vit-large_200e_fsdp.py'


def flatten(prefix, value):
    """``--cfg-options`` items that rebuild the dict ``value`` at ``prefix``."""
    if isinstance(value, dict):
        return [item for key, sub in value.items()
                for item in flatten(f'{prefix}.{key}', sub)]
    return [f'{prefix}={value}']


def test_vit_large_fsdp_config_builds_and_wraps_every_block(repo_root):
    cfg = Config.fromfile(os.path.join(repo_root, FSDP_CONFIG))
    assert cfg.runner_type == 'FlexibleRunner'
    assert cfg.strategy.type == 'FSDPStrategy'
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert (cfg.model.type, cfg.model.backbone.arch) == ('MMAE', 'l')
    with torch.device('meta'):  # shapes only: no 300M-parameter init
        model = MODELS.build(cfg.model)
    policy_cfg = dict(cfg.strategy.model_wrapper.auto_wrap_policy)
    policy = FUNCTIONS.get(policy_cfg.pop('type'))
    # The policy the FSDP wrapper will apply: its own unit for each module
    # holding at least min_num_params parameters that are not yet wrapped.
    wrapped = [
        name for name, module in model.named_modules() if name and policy(
            module, recurse=False,
            nonwrapped_numel=sum(p.numel() for p in module.parameters()),
            **policy_cfg)
    ]
    assert [f'backbone.layers.{i}' for i in range(24)] == [
        name for name in wrapped if name.startswith('backbone.layers.')
    ]


def test_fsdp_trains_on_two_cpu_processes_over_gloo(repo_root, tmp_path,
                                                    cpu_dist_env):
    strategy = Config.fromfile(os.path.join(repo_root, FSDP_CONFIG)).strategy
    # FSDP places each rank's shard on cuda:LOCAL_RANK unless told otherwise.
    strategy.model_wrapper.device_id = 'cpu'
    args = [
        'bash', 'tools/dist_train.sh', 'configs/fashion_mnist/mmae_fmnist.py',
        '2', '--work-dir', str(tmp_path), '--cfg-options',
        'runner_type=FlexibleRunner', *flatten('strategy', strategy.to_dict()),
        'train_dataloader.dataset.indices=64',
        'train_dataloader.batch_size=16', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False', 'train_cfg.max_epochs=1',
        'default_hooks.logger.interval=1'
    ]
    proc = subprocess.run(args, cwd=repo_root, env=cpu_dist_env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # 64 images / (2 ranks x 16) = 2 iterations, both logged with a loss.
    assert 'Epoch(train) [1][2/2]' in log and 'loss_tcr' in log
    # FSDP's local state dict: one file of ShardedTensors per rank.
    shards = sorted(os.listdir(tmp_path / 'epoch_1.pth'))
    assert shards == ['rank0.pth', 'rank1.pth']
    for shard in shards:
        with zipfile.ZipFile(tmp_path / 'epoch_1.pth' / shard) as archive:
            pickled = archive.read(next(
                n for n in archive.namelist() if n.endswith('data.pkl')))
        assert b'ShardedTensor' in pickled
