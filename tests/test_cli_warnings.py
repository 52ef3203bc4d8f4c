"""The plugin's tools print none of the known harmless upstream warnings.

``tools/train.py`` used to start every run with mmcv-lite's
``MultiScaleDeformableAttention`` warning and setuptools' ``pkg_resources``
warning (mmengine's lookup of the configs' ``mmpretrain::`` bases);
``mmae_plugin/compat/cli_warnings.py`` ignores exactly those two in the
plugin's tools, and nothing else (docs/upstream_workarounds.md, "Warnings").
A plain ``Config.fromfile`` of the same config, outside the tools, is the
control: there the warnings are upstream's and stay visible.
"""
import importlib.util
import os
import setuptools
import subprocess
import sys

import pytest
import torch
from mmengine.utils import digit_version

from mmae_plugin.compat.cli_warnings import MSDA_TEXT

CONFIG = 'configs/fashion_mnist/mmae_fmnist.py'
PKG_RESOURCES_TEXT = 'pkg_resources is deprecated as an API'
#: The warnings this environment raises (setuptools warns from 80.9 on and
#: has no pkg_resources from 82 on; mmcv-lite has no compiled ops).
RAISED = [
    text for text, raised in (
        (PKG_RESOURCES_TEXT, digit_version('80.9.0') <= digit_version(
            setuptools.__version__) < digit_version('82.0.0')),
        (MSDA_TEXT, importlib.util.find_spec('mmcv._ext') is None),
    ) if raised
]


def run(repo_root, argv):
    """``python argv`` with Python's default warning filters, no GPU."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    env.pop('PYTHONWARNINGS', None)
    proc = subprocess.run([sys.executable, *argv],
                          cwd=repo_root,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_train_prints_no_known_upstream_warning(repo_root, tmp_path):
    proc = run(repo_root, [
        'tools/train.py', CONFIG, '--work-dir',
        str(tmp_path), '--cfg-options', 'train_cfg.max_epochs=1',
        'train_dataloader.dataset.indices=16',
        'train_dataloader.batch_size=16', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False'
    ])
    assert 'Epoch(train) [1][1/1]' in proc.stdout, proc.stdout[-2000:]
    assert 'pkg_resources' not in proc.stderr, proc.stderr
    assert 'MultiScaleDeformableAttention' not in proc.stderr, proc.stderr
    # Other warnings stay: mmpretrain's train.py asks for pinned memory,
    # which torch says it cannot give without an accelerator.
    if not torch.accelerator.is_available():
        assert "'pin_memory' argument is set as true" in proc.stderr


def test_outside_the_tools_upstream_warnings_stay(repo_root):
    """The control: the same config loaded by mmengine alone (the plugin
    imported through its ``custom_imports``) shows upstream's warnings."""
    if not RAISED:
        pytest.skip('neither warning is raised here (full mmcv, setuptools '
                    'without the warning)')
    proc = run(repo_root, [
        '-c', 'from mmengine.config import Config; '
        f'Config.fromfile({CONFIG!r})'
    ])
    for text in RAISED:
        assert text in proc.stderr, proc.stderr
