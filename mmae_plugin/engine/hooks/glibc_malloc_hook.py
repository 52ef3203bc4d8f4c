"""Keep freed host memory in the process: fixed glibc malloc thresholds.

Fixed ``mallopt`` thresholds keep activation-sized tensors in the heap and
freed memory in the process, instead of fresh zero-filled ``mmap`` pages
every iteration (what jemalloc or tcmalloc with ``LD_PRELOAD`` would do);
nothing changes on other C libraries. Measurements (the runner's lost
10-20 % of CPU throughput): docs/performance.md.
"""
import ctypes
import os
from typing import Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from mmae_plugin.utils.validation import check_int

# mallopt parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: glibc refuses a larger M_MMAP_THRESHOLD on 64-bit systems
#: (``HEAP_MAX_SIZE / 2`` = 4 MiB * sizeof(long)).
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
#: mallopt takes a C ``int``.
MAX_MALLOPT_VALUE = 2**31 - 1
MiB = 1024 * 1024
#: glibc's documented starting values of the three (mallopt(3)).
GLIBC_DEFAULT = 128 * 1024
#: The hook's thresholds: tensors below 32 MiB from the heap, up to 1 GiB
#: of freed memory kept, the heap grown 64 MiB at a time.
MMAP_THRESHOLD = 32 * MiB
TRIM_THRESHOLD = 1024 * MiB
TOP_PAD = 64 * MiB


def running_glibc() -> Optional[ctypes.CDLL]:
    """The process's C library when it is glibc, else ``None``."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, 'gnu_get_libc_version') or not hasattr(
            libc, 'mallopt'):
        return None
    return libc


def check_malloc_thresholds(mmap_threshold: int, trim_threshold: int,
                            top_pad: int) -> None:
    """Refuse values glibc's ``mallopt`` would reject or misread."""
    check_int(mmap_threshold, 'mmap_threshold', minimum=0)
    if mmap_threshold > MAX_MMAP_THRESHOLD:
        raise ValueError(
            f'mmap_threshold must be in [0, {MAX_MMAP_THRESHOLD}] bytes '
            f'(32 MiB, the most glibc accepts on 64-bit), got '
            f'{mmap_threshold}')
    for value, name in ((trim_threshold, 'trim_threshold'), (top_pad,
                                                             'top_pad')):
        check_int(value, name, minimum=0)
        if value > MAX_MALLOPT_VALUE:
            raise ValueError(f'{name} must be in [0, {MAX_MALLOPT_VALUE}] '
                             f'bytes (a C int), got {value}')


def set_glibc_malloc_thresholds(mmap_threshold: int = MMAP_THRESHOLD,
                                trim_threshold: int = TRIM_THRESHOLD,
                                top_pad: int = TOP_PAD) -> bool:
    """Fix glibc's malloc thresholds for this process and its forks.

    Args:
        mmap_threshold: Allocations of at least this many bytes get their
            own ``mmap``; smaller ones come from the heap and are reused.
        trim_threshold: Free memory at the top of the heap is returned to
            the kernel only beyond this many bytes.
        top_pad: Extra bytes requested whenever the heap grows.

    Returns:
        True when set; False when the process does not run on glibc.
    """
    check_malloc_thresholds(mmap_threshold, trim_threshold, top_pad)
    libc = running_glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    for parameter, value, name in ((M_MMAP_THRESHOLD, mmap_threshold,
                                    'mmap_threshold'),
                                   (M_TRIM_THRESHOLD, trim_threshold,
                                    'trim_threshold'), (M_TOP_PAD, top_pad,
                                                        'top_pad')):
        if libc.mallopt(parameter, value) != 1:
            raise RuntimeError(f'glibc mallopt refused {name}={value}')
    return True


def resident_bytes() -> Optional[int]:
    """The process's resident memory (Linux ``/proc``), else ``None``."""
    try:
        with open('/proc/self/statm') as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf('SC_PAGE_SIZE')


def release_kept_memory() -> bool:
    """Back to glibc's starting values and return free memory to the
    kernel (``malloc_trim``), e.g. when a run ends in a longer-lived
    process (a test session, a notebook).

    glibc's adaptation of the thresholds stays off: it cannot be turned
    back on in a running process.

    Returns:
        True when done; False when the process does not run on glibc.
    """
    if not set_glibc_malloc_thresholds(GLIBC_DEFAULT, GLIBC_DEFAULT,
                                       GLIBC_DEFAULT):
        return False
    libc = running_glibc()
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim(0)
    return True


@HOOKS.register_module()
class GlibcMallocHook(Hook):
    """Fix glibc's malloc thresholds before the run (CPU training speed).

    Applied in ``before_run`` of every rank, before the dataloader workers
    fork (they inherit it). Numerics are untouched: only where freed host
    memory goes changes. Memory held by the process can stay up to
    ``trim_threshold`` above what the iteration uses at its peak; in
    ``after_run`` glibc's starting values come back and the kept memory is
    returned to the kernel.

    Args:
        mmap_threshold: Bytes from which an allocation gets its own
            ``mmap`` (at most 32 MiB, glibc's limit).
        trim_threshold: Free bytes kept at the top of the heap.
        top_pad: Extra bytes requested whenever the heap grows.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 mmap_threshold: int = MMAP_THRESHOLD,
                 trim_threshold: int = TRIM_THRESHOLD,
                 top_pad: int = TOP_PAD) -> None:
        check_malloc_thresholds(mmap_threshold, trim_threshold, top_pad)
        self.mmap_threshold = mmap_threshold
        self.trim_threshold = trim_threshold
        self.top_pad = top_pad

    def before_run(self, runner) -> None:
        """Set the thresholds, or log that this C library is not glibc."""
        applied = set_glibc_malloc_thresholds(self.mmap_threshold,
                                              self.trim_threshold,
                                              self.top_pad)
        if applied:
            print_log(
                f'GlibcMallocHook: glibc malloc mmap_threshold='
                f'{self.mmap_threshold}, trim_threshold='
                f'{self.trim_threshold}, top_pad={self.top_pad} bytes',
                logger='current')
        else:
            print_log(
                'GlibcMallocHook: the C library is not glibc; '
                'allocator left as it is',
                logger='current')

    def after_run(self, runner) -> None:
        """Return what the run kept to the kernel, and log how much."""
        before = resident_bytes()
        if not release_kept_memory():
            return
        after = resident_bytes()
        returned = '' if before is None or after is None else \
            f'; {max(0, before - after) / MiB:.0f} MiB returned to the kernel'
        print_log(
            "GlibcMallocHook: glibc's starting thresholds restored" + returned,
            logger='current')
