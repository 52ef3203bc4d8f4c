"""Real runs and real faults for the checkpoint tests.

A tiny mmengine model trained by the real ``Runner``; a 1 MiB tmpfs for a
genuinely full disk; nothing here stands in for mmengine.
"""
import os
import subprocess
import uuid

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner


class ToyModel(BaseModel):
    """A linear regression: 2 inputs, 1 output, mean squared error.

    ``table`` (saved, unused) is a tensor record big enough to corrupt
    64 bytes inside it.
    """

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.register_buffer('table', torch.arange(64, dtype=torch.float32))

    def forward(self, inputs, labels=None, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        if mode == 'loss':
            error = out.squeeze(1) - torch.stack(labels)
            return dict(loss=(error**2).mean())
        return out


class ToyDataset(torch.utils.data.Dataset):
    """Two samples, so one epoch is one iteration at batch size 2."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return dict(inputs=torch.tensor([float(index), 1.0]),
                    labels=torch.tensor(float(index)))


def toy_runner(work_dir, max_epochs, resume=False, max_keep_ckpts=1,
               load_from=None, custom_hooks=None, lr=0.01):
    """A real Runner that saves a checkpoint every epoch.

    Args:
        work_dir: Work (and checkpoint) folder.
        max_epochs: Epochs to train.
        resume: mmengine's ``resume``.
        max_keep_ckpts: Passed to ``CheckpointHook``.
        load_from: mmengine's ``load_from``.
        custom_hooks: Extra hooks.
        lr: SGD learning rate.

    Returns:
        The Runner (not yet trained).
    """
    return Runner(
        model=ToyModel(), work_dir=str(work_dir),
        experiment_name=f'toy_{uuid.uuid4().hex[:12]}',
        train_dataloader=dict(dataset=ToyDataset(), batch_size=2,
                              sampler=dict(type='DefaultSampler',
                                           shuffle=False), num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=lr)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(
            type='CheckpointHook', interval=1,
            max_keep_ckpts=max_keep_ckpts)),
        custom_hooks=custom_hooks, resume=resume, load_from=load_from,
        log_level='WARNING')


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: writes beyond it fail with ENOSPC, as on a full disk.

    Yields:
        The mounted folder (unmounted afterwards).
    """
    if os.geteuid() != 0:
        pytest.skip('mounting a tmpfs needs root')
    mount_point = tmp_path / 'small_disk'
    mount_point.mkdir()
    mounted = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(mount_point)],
        capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here: {mounted.stderr.strip()}')
    try:
        yield mount_point
    finally:
        subprocess.run(['umount', '-l', str(mount_point)], check=False)
