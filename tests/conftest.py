"""Shared test settings: the CPU cores we have, and no GPU unless asked.

The suite is a CPU suite: its references are float64 closed forms and
bit-exact CPU reruns, and its 2-process runs use gloo. On a GPU host the
tests would otherwise take the CUDA path (NCCL, ``set_device(LOCAL_RANK)``,
TF32 convolutions, non-deterministic kernels), so the GPUs are hidden from
this process and every process it starts (``CUDA_VISIBLE_DEVICES=''``,
set before anything initialises CUDA). Tests marked ``cuda`` need a GPU:
they run only with ``MMAE_TEST_CUDA=1`` (``MMAE_TEST_CUDA=1 pytest -m
cuda``, as dev/gpu_check.sh does), which keeps the GPUs visible and
skips the CPU tests instead.
"""
import os
import re
import socket
import subprocess
import sys
import uuid
import warnings
from typing import Any, Callable, Dict, Type

#: ``MMAE_TEST_CUDA=1``: run the tests marked ``cuda`` on the visible GPUs.
CUDA_MODE = os.environ.get('MMAE_TEST_CUDA', '0') == '1'
if not CUDA_MODE:
    os.environ['CUDA_VISIBLE_DEVICES'] = ''

import pytest  # noqa: E402
import torch  # noqa: E402

# At most 2 threads, never more than the process already chose (the kill
# driver, which imports the toy run below, picks 1 for its forked children),
# and the cores shared among pytest-xdist's workers (tools/run_tests.sh).
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
_CORE_SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
torch.set_num_threads(max(1, min(2, _CORE_SHARE, torch.get_num_threads())))
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: ``MMAE_TEST_LONG=1``: also run the tests marked ``long``.
LONG_MODE = os.environ.get('MMAE_TEST_LONG', '0') == '1'

#: mmengine's Runner and strategies default to ``work_dir='work_dirs'``,
#: relative to the working directory, and log to ``<work_dir>/<timestamp>/``:
#: one built by a test without a work dir writes into the repository.
STRAY_LOG_DIR = re.compile(r'^\d{8}_\d{6}$')


def stray_log_dirs() -> set:
    """Timestamp-named folders directly in the repository's work_dirs."""
    folder = os.path.join(REPO_ROOT, 'work_dirs')
    if not os.path.isdir(folder):
        return set()
    return {name for name in os.listdir(folder) if STRAY_LOG_DIR.match(name)}


def pytest_sessionstart(session) -> None:
    session.config.stray_log_dirs_before = stray_log_dirs()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a test left mmengine log folders in the repository
    (the xdist controller checks, after its workers have finished)."""
    if hasattr(session.config, 'workerinput'):
        return
    new = sorted(stray_log_dirs() - session.config.stray_log_dirs_before)
    if new:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin('terminalreporter')
        reporter.ensure_newline()
        reporter.write_line(
            f'FAILED: tests wrote {len(new)} mmengine log folder(s) into '
            f'{os.path.join(REPO_ROOT, "work_dirs")}: {", ".join(new)}. A '
            f'Runner or strategy was built without work_dir (mmengine\'s '
            f'default is work_dirs/ in the working directory); give it the '
            f"test's tmp_path.",
            red=True)


def pytest_collection_modifyitems(config, items) -> None:
    """Skip ``cuda`` tests in the CPU suite and CPU tests in CUDA mode;
    skip ``long`` tests unless ``MMAE_TEST_LONG=1``."""
    if not LONG_MODE:
        skip_long = pytest.mark.skip(
            reason='heavy end-to-end variant: run with MMAE_TEST_LONG=1')
        for item in items:
            if 'long' in item.keywords:
                item.add_marker(skip_long)
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
    return dict(
        os.environ,
        CUDA_VISIBLE_DEVICES='',
        PYTHON=sys.executable,
        PORT=port,
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=port,
        **extra)


def run_local_ranks(script: str,
                    *args: str,
                    env: Dict[str, str],
                    nproc: int = 2,
                    timeout: int = 300) -> subprocess.CompletedProcess:
    """``script`` on ``nproc`` processes of this host under
    ``torch.distributed.run``, one OpenMP thread each.

    Args:
        script: The Python file each rank runs (relative to the
            repository root, or absolute).
        *args: Its arguments.
        env: From :func:`make_cpu_dist_env` (its ``MASTER_PORT``).
        nproc: The number of processes.
        timeout: Seconds before the launch is killed.

    Returns:
        The finished launch, its output captured as text.
    """
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node',
        str(nproc), '--master_port', env['MASTER_PORT'], script, *args
    ]
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=dict(env, OMP_NUM_THREADS='1'),
        capture_output=True,
        text=True,
        timeout=timeout)


@pytest.fixture(scope='module')
def tiny_clip(tmp_path_factory) -> str:
    """A random tiny CLIP checkpoint for the CLIP-target algorithms
    (``save_tiny_clip`` of test_hook_all_ssl_algorithms.py)."""
    from test_hook_all_ssl_algorithms import save_tiny_clip
    return save_tiny_clip(
        str(tmp_path_factory.mktemp('clip') / 'tiny_clip.pth'))


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


# --------------------------------------------------------------------------
# a tiny real mmengine training run, shared by the checkpoint tests
# --------------------------------------------------------------------------
from mmengine.model import BaseModel  # noqa: E402
from mmengine.runner import Runner  # noqa: E402


def _stacked(values: Any) -> torch.Tensor:
    """A batch as one tensor: mmengine's default collate gives a list."""
    return torch.stack(values) if isinstance(values, list) else values


class ToyModel(BaseModel):
    """A linear regression: 2 inputs, 1 output, mean squared error.

    ``table`` (saved, unused by the forward pass) is a 256-byte tensor
    record, big enough for the fault tests to corrupt 64 bytes inside it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.register_buffer('table', torch.arange(64, dtype=torch.float32))

    def forward(self, inputs, labels=None, mode: str = 'tensor'):
        out = self.linear(_stacked(inputs))
        if mode == 'loss':
            error = out.squeeze(1) - _stacked(labels)
            return dict(loss=(error**2).mean())
        return out


class ToyDataset(torch.utils.data.Dataset):
    """Samples ``x = [i, 1]`` with target ``i + 1`` (an exact line).

    Args:
        length: Number of samples; 2 makes one epoch one iteration at batch
            size 2.
    """

    def __init__(self, length: int = 4) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        x = torch.tensor([float(index), 1.0])
        return dict(inputs=x, labels=x.sum())


def make_toy_runner(work_dir: Any,
                    max_epochs: int = 1,
                    *,
                    runner_class: Type = Runner,
                    dataset_length: int = 4,
                    lr: float = 0.01,
                    momentum: float = 0.0,
                    batch_size: int = 2,
                    **kwargs: Any) -> Runner:
    """A real Runner training :class:`ToyModel` with SGD, batch size 2.

    Args:
        work_dir: Work (and checkpoint) folder.
        max_epochs: Epochs to train.
        runner_class: ``Runner`` or ``FlexibleRunner``.
        dataset_length: Samples per epoch (:class:`ToyDataset`).
        lr: SGD learning rate.
        momentum: SGD momentum.
        batch_size: Samples per iteration (per process).
        **kwargs: More Runner arguments (hooks, ``load_from``, ``resume``,
            ...); ``log_level`` defaults to ``'WARNING'`` and
            ``experiment_name`` to a fresh unique name.

    Returns:
        The Runner (not yet trained).
    """
    kwargs.setdefault('log_level', 'WARNING')
    kwargs.setdefault('experiment_name', f'toy_{uuid.uuid4().hex[:12]}')
    return runner_class(
        model=ToyModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=ToyDataset(dataset_length),
            batch_size=batch_size,
            sampler=dict(type='DefaultSampler', shuffle=False),
            num_workers=0),
        optim_wrapper=dict(
            optimizer=dict(type='SGD', lr=lr, momentum=momentum)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        **kwargs)


def state_of(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """A copy of ``model``'s state dict (unaffected by further training)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


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
        ['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs',
         str(mount_point)],
        capture_output=True,
        text=True)
    if mounted.returncode != 0:
        pytest.skip(f'cannot mount a tmpfs here: {mounted.stderr.strip()}')
    try:
        yield mount_point
    finally:
        subprocess.run(['umount', '-l', str(mount_point)], check=False)
