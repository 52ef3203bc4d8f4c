"""Shared test settings: keep torch to the CPU cores we have."""
import os
import warnings

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def repo_root() -> str:
    return REPO_ROOT
