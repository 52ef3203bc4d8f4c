# Runtime shared by every Fashion-MNIST config: mmpretrain's default runtime,
# the plugin imported, CPU-friendly dataloading.
_base_ = ['mmpretrain::_base_/default_runtime.py']

custom_imports = dict(
    imports=['mmae_plugin.registration'], allow_failed_imports=False)

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=2),
    runtime_info=dict(type='DeferredRuntimeInfoHook'))
# The plugin's runner: auto-resume from the run's own newest intact
# checkpoint; SafeCheckpointHook: finite-only, atomic, checksummed saves
# (docs/reliability.md); DeferredRuntimeInfoHook: a step's logged values are
# read a step later, so the host never waits for the step it just queued.
runner_type = 'MMAERunner'
env_cfg = dict(dist_cfg=dict(backend='nccl'))  # gloo without CUDA (plugin)
randomness = dict(seed=0, diff_rank_seed=True)
# Every random draw (masks, augmentations in workers or in the main process)
# derives from (seed, epoch, iteration or sample index): a resumed run draws
# exactly what an uninterrupted one draws.
# DivergenceHook: stop at the first non-finite loss, before a NaN checkpoint.
# GlibcMallocHook: freed host memory stays in the process for the next
# iteration instead of coming back from the kernel page by page (the
# Runner's throughput loss on the CPU, docs/performance.md).
custom_hooks = [
    dict(type='ReseedHook'),
    dict(type='DivergenceHook'),
    dict(type='GlibcMallocHook')
]
