"""Shared test settings: the CPU cores we have, and no GPU unless asked.

The suite is a CPU suite: its references are float64 closed forms and
bit-exact CPU reruns, and its 2-process runs use gloo. On a GPU host the
tests would otherwise take the CUDA path (NCCL, ``set_device(LOCAL_RANK)``,
TF32 convolutions, non-deterministic kernels), so the GPUs are hidden from
this process and every process it starts (``CUDA_VISIBLE_DEVICES=''``,
set before anything initialises CUDA). Tests marked ``cuda`` need a GPU:
they run only with ``MMAE_TEST_CUDA=1`` (``MMAE_TEST_CUDA=1 pytest -m
cuda``, as tools/gpu_check.sh does), which keeps the GPUs visible and
skips the CPU tests instead.
"""
import os
import socket
import sys
import warnings
from typing import Callable, Dict

#: ``MMAE_TEST_CUDA=1``: run the tests marked ``cuda`` on the visible GPUs.
CUDA_MODE = os.environ.get('MMAE_TEST_CUDA', '0') == '1'
if not CUDA_MODE:
    os.environ['CUDA_VISIBLE_DEVICES'] = ''

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items) -> None:
    """Skip ``cuda`` tests in the CPU suite and CPU tests in CUDA mode."""
    if CUDA_MODE:
        reason = ('CPU test: MMAE_TEST_CUDA=1 runs only the tests marked '
                  'cuda; run the CPU suite without it')
        if torch.cuda.is_available():
            skip_cuda = None
        else:
            skip_cuda = pytest.mark.skip(
                reason='MMAE_TEST_CUDA=1 but torch sees no CUDA device')
    else:
        reason = None
        skip_cuda = pytest.mark.skip(
            reason='needs a CUDA GPU: run MMAE_TEST_CUDA=1 pytest -m cuda')
    for item in items:
        if 'cuda' in item.keywords:
            if skip_cuda is not None:
                item.add_marker(skip_cuda)
        elif reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pick_free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def make_cpu_dist_env(**extra: str) -> Dict[str, str]:
    """Environment for a multi-process CPU (gloo) run of the tools.

    Whatever the host has, the processes see no GPU, so mmengine and the
    plugin pick gloo and the CPU (never NCCL or ``cuda:LOCAL_RANK``).

    Args:
        **extra: More variables (strings), e.g. ``OMP_NUM_THREADS='1'``.

    Returns:
        A copy of ``os.environ`` with ``CUDA_VISIBLE_DEVICES=''``, a fresh
        port as ``PORT`` (tools/dist_train.sh) and ``MASTER_PORT`` (with
        ``MASTER_ADDR=127.0.0.1``), and ``PYTHON`` set to this interpreter.
    """
    port = str(pick_free_port())
    return dict(os.environ, CUDA_VISIBLE_DEVICES='', PYTHON=sys.executable,
                PORT=port, MASTER_ADDR='127.0.0.1', MASTER_PORT=port,
                **extra)


@pytest.fixture
def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    return pick_free_port()


@pytest.fixture(scope='session')
def cpu_dist_env_factory() -> Callable[..., Dict[str, str]]:
    """:func:`make_cpu_dist_env`: a new env (and port) per call, any scope."""
    return make_cpu_dist_env


@pytest.fixture
def cpu_dist_env() -> Dict[str, str]:
    """One :func:`make_cpu_dist_env` environment (subprocess ``env=``)."""
    return make_cpu_dist_env()


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
