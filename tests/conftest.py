"""Shared test settings: keep torch to the CPU cores we have."""
import os
import warnings

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def mmpretrain_default_scope():
    """Every test starts in mmpretrain's scope, as the tools do.

    A Runner built from a config without ``default_scope`` leaves mmengine's
    scope current for the rest of the process; without this, a test that
    builds mmpretrain models directly would depend on which tests ran first.
    """
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


@pytest.fixture(scope='session')
def repo_root() -> str:
    return REPO_ROOT
