# End-to-end fine-tuning of a ViT-B/16 pretrained with MAE, U-MAE or M-MAE:
# mmpretrain's MAE benchmark (100 epochs, layer decay 0.65, batch 8 x 128).
#   tools/dist_train.sh configs/finetune_vit-base_100e.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=PRETRAINED.pth
_base_ = 'mmpretrain::mae/benchmarks/vit-base-p16_8xb128-coslr-100e_in1k.py'

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
