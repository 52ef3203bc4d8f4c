"""GlibcMallocHook: glibc's malloc policy observed through ``mallinfo2``.

The policy is process-wide and cannot be undone, so every observation runs
in a fresh Python process. The probe allocates a 16 MiB tensor and reads
glibc's own counters: with glibc's defaults the block is a private
``mmap`` (``hblkhd``) returned to the kernel on free; under the hook's
thresholds it comes from the heap and stays there free for reuse
(``fordblks``).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from mmpretrain.registry import HOOKS

from mmae_plugin.engine.hooks.glibc_malloc_hook import (MAX_MMAP_THRESHOLD,
                                                        running_glibc)

needs_glibc = pytest.mark.skipif(
    running_glibc() is None or not hasattr(running_glibc(), 'mallinfo2'),
    reason='needs glibc >= 2.33 (mallinfo2)')

PROBE = textwrap.dedent('''
    import ctypes, json, sys
    import torch

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',
            'fsmblks', 'uordblks', 'fordblks', 'keepcost')]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2

    def probe():
        before = libc.mallinfo2()
        block = torch.empty(4 << 20)  # 16 MiB
        during = libc.mallinfo2()
        del block
        after = libc.mallinfo2()
        return dict(mmapped=during.hblkhd - before.hblkhd,
                    kept_free=after.fordblks - before.fordblks,
                    trimmed=during.arena - after.arena)
''')
MiB = 1 << 20


def run_probe(setup: str, cwd: str = None) -> dict:
    """Run ``setup`` then the probe in a fresh interpreter; the result has
    the process's output under ``log``."""
    code = PROBE + textwrap.dedent(setup) + \
        '\nprint("PROBE " + json.dumps(probe()))\n'
    proc = subprocess.run([sys.executable, '-c', code],
                          capture_output=True,
                          text=True,
                          cwd=cwd,
                          timeout=300,
                          env={
                              **os.environ, 'CUDA_VISIBLE_DEVICES': ''
                          })
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('PROBE ')]
    return dict(
        json.loads(line[-1][len('PROBE '):]), log=proc.stdout + proc.stderr)


@needs_glibc
def test_glibc_defaults_map_and_unmap_a_16_mib_tensor():
    """The control: what the hook exists to change."""
    result = run_probe('')
    assert result['mmapped'] >= 16 * MiB
    assert result['kept_free'] < 16 * MiB
    assert 'GlibcMallocHook' not in result['log']


@needs_glibc
def test_hook_keeps_the_tensor_in_the_heap_and_the_freed_memory():
    result = run_probe('''
        from mmpretrain.registry import HOOKS
        import mmae_plugin.registration  # noqa: F401
        HOOKS.build(dict(type='GlibcMallocHook')).before_run(None)
    ''')
    assert result['mmapped'] == 0
    assert result['kept_free'] >= 16 * MiB


@needs_glibc
def test_a_threshold_below_the_tensor_still_maps_it():
    """The configured threshold is the one glibc uses."""
    result = run_probe('''
        from mmae_plugin.engine.hooks.glibc_malloc_hook import (
            set_glibc_malloc_thresholds)
        assert set_glibc_malloc_thresholds(mmap_threshold=8 << 20)
    ''')
    assert result['mmapped'] >= 16 * MiB


@needs_glibc
def test_quickstart_runner_applies_the_policy(repo_root, tmp_path):
    """The Fashion-MNIST runtime ships the hook: a real Runner sets it for
    the run and gives glibc's starting values back after it."""
    result = run_probe(
        f'''
        from mmengine.config import Config
        from mmengine.hooks import Hook
        from mmengine.runner import Runner

        class ProbeAfterTraining(Hook):
            def after_train(self, runner):
                print('IN_RUN ' + json.dumps(probe()))

        cfg = Config.fromfile('configs/fashion_mnist/mmae_fmnist.py')
        cfg.work_dir = {str(tmp_path)!r}
        cfg.train_cfg.max_epochs = 1
        cfg.default_hooks.checkpoint = None
        cfg.train_dataloader.batch_size = 4
        cfg.train_dataloader.num_workers = 0
        cfg.train_dataloader.persistent_workers = False
        cfg.train_dataloader.dataset.indices = 8
        runner = Runner.from_cfg(cfg)
        runner.register_hook(ProbeAfterTraining(), priority='LOWEST')
        runner.train()
    ''',
        cwd=repo_root)
    assert 'GlibcMallocHook: glibc malloc mmap_threshold=33554432, ' \
        'trim_threshold=1073741824, top_pad=67108864 bytes' in result['log']
    in_run = json.loads(result['log'].split('IN_RUN ')[1].splitlines()[0])
    # During the run the heap has room: the block comes from free memory
    # and goes back there, and nothing is returned to the kernel.
    assert in_run['mmapped'] == 0
    assert in_run['trimmed'] == 0
    # After the run: where the probe's block comes from depends on the free
    # chunks the run left in the heap; the restore is tested below.
    assert "GlibcMallocHook: glibc's starting thresholds restored; " in \
        result['log']


@needs_glibc
def test_after_run_gives_back_glibcs_starting_threshold():
    """A process that outlives the run (tests, notebooks) gets glibc's
    starting policy back: a 16 MiB tensor is mapped again, as in the
    control (under the hook's thresholds it is not)."""
    result = run_probe('''
        from mmpretrain.registry import HOOKS
        import mmae_plugin.registration  # noqa: F401
        hook = HOOKS.build(dict(type='GlibcMallocHook'))
        hook.before_run(None)
        hook.after_run(None)
    ''')
    assert result['mmapped'] >= 16 * MiB


@needs_glibc
def test_after_run_returns_the_kept_memory_to_the_kernel():
    """256 MiB freed under the hook stay in the process until ``after_run``
    gives them back, whatever the heap's layout: a free chunk below a live
    one stays in the heap (glibc's counters keep it) but its pages go back
    (``malloc_trim``), which is what resident memory shows."""
    result = run_probe('''
        from mmpretrain.registry import HOOKS
        import mmae_plugin.registration  # noqa: F401
        from mmae_plugin.engine.hooks.glibc_malloc_hook import resident_bytes
        hook = HOOKS.build(dict(type='GlibcMallocHook'))
        hook.before_run(None)
        kept = [torch.ones(2 << 20) for _ in range(32)]  # 256 MiB
        del kept
        assert libc.mallinfo2().fordblks >= 200 << 20
        before = resident_bytes()
        hook.after_run(None)
        print('RETURNED', before - resident_bytes())
    ''')
    returned = int(result['log'].split('RETURNED ')[1].split()[0])
    assert returned >= 200 * MiB
    assert 'MiB returned to the kernel' in result['log']


@pytest.mark.parametrize('name, value, message', [
    ('mmap_threshold', MAX_MMAP_THRESHOLD + 1, 'mmap_threshold must be in '
     '[0, 33554432]'),
    ('mmap_threshold', -1, 'mmap_threshold must be an integer >= 0'),
    ('trim_threshold', 2**31, 'trim_threshold must be in [0, 2147483647]'),
    ('top_pad', 1.5, 'top_pad must be an integer'),
    ('top_pad', True, 'top_pad must be an integer'),
])
def test_bad_thresholds_refused_at_build_time(name, value, message):
    with pytest.raises((TypeError, ValueError),
                       match=message.replace('[', r'\[').replace(']', r'\]')):
        HOOKS.build(dict(type='GlibcMallocHook', **{name: value}))
