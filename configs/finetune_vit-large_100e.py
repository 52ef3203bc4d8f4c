# End-to-end fine-tuning of a ViT-L/16 pretrained with MAE, U-MAE or M-MAE.
# mmpretrain's ViT-L recipe (layer decay 0.75, lr 4e-3) runs 50 epochs; the
# M-MAE evaluation protocol fine-tunes for 100, so the schedule is restated.
_base_ = 'mmpretrain::mae/benchmarks/vit-large-p16_8xb128-coslr-50e_in1k.py'

custom_imports = dict(
    imports=['mmae_plugin.registration'], allow_failed_imports=False)
# The plugin's runner and checkpoint hook: auto-resume from the run's own
# newest intact checkpoint; finite-only, atomic, checksummed saves.
runner_type = 'MMAERunner'
# DeferredRuntimeInfoHook: the step's logged values are read a step later
# (the host never waits for the step it just queued); logs unchanged.
default_hooks = dict(
    checkpoint=dict(type='SafeCheckpointHook'),
    runtime_info=dict(type='DeferredRuntimeInfoHook'))
# Stop at the first non-finite loss, naming the terms (docs/reliability.md).
custom_hooks = [dict(type='DivergenceHook')]
# mmpretrain's layer-decay constructor, with the tensors of a layer that
# share a weight decay in one optimizer group (exact; ~2 groups per layer).
optim_wrapper = dict(
    constructor='MergedGroupsLearningRateDecayOptimWrapperConstructor')

param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-4,
        by_epoch=True,
        begin=0,
        end=5,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=95,
        by_epoch=True,
        begin=5,
        end=100,
        eta_min=1e-6,
        convert_to_iter_based=True)
]
train_cfg = dict(by_epoch=True, max_epochs=100)

# Data loading sized to feed a GPU (docs/gpu_clusters.md): 8 workers, the
# CPUS_PER_TASK=9 of tools/slurm_train.sh minus the main process; pinned
# batches, so the preprocessor's non-blocking copy is only queued; the
# workers persist across epochs. The preprocessor is mmpretrain's, bit for
# bit, with that copy and the BGR -> RGB swap on the device.
train_dataloader = dict(
    batch_size=128, num_workers=8, pin_memory=True, persistent_workers=True)
val_dataloader = dict(num_workers=8, pin_memory=True)
test_dataloader = dict(num_workers=8, pin_memory=True)
data_preprocessor = dict(type='NonBlockingClsDataPreprocessor')
