# MAE ViT-B/16 pretrained 200 epochs on ImageNet-1K: the baseline at the
# budget of the M-MAE paper (batch 1024 = 8 GPUs x 128, AdamW with base lr
# 1.5e-4 per 256 images, weight decay 0.05, 40 warm-up epochs, mask 0.75).
# mmpretrain ships 300 epochs and up; the schedule is restated for 200.
#   tools/dist_train.sh configs/mae_vit-base_200e.py 8
_base_ = 'mmpretrain::mae/mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py'

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

# mmpretrain's MAE augmentation (RandomResizedCrop 224 of 20-100 % of the
# area, bicubic; horizontal flip with probability 0.5) at 1.8 times the
# images per second of a worker core (docs/gpu_clusters.md): the file read
# as bytes; the box drawn by RandomResizedCrop's own sampler from the JPEG
# header's size; only the crop's rows and columns decoded (libjpeg-turbo;
# else OpenCV's whole decode, the same pixels); torch's antialiased uint8
# bicubic resize of the crop; the
# flip drawn as RandomFlip(prob=0.5) draws it. Same draws, same boxes.
train_pipeline = [
    dict(type='LoadImageBytes'),
    dict(
        type='DecodeRandomResizedCrop',
        scale=224,
        crop_ratio_range=(0.2, 1.0),
        interpolation='bicubic',
        flip_prob=0.5),
    dict(type='PackInputs')
]
# Data loading sized to feed a GPU (docs/gpu_clusters.md): 8 workers, the
# CPUS_PER_TASK=9 of tools/slurm_train.sh minus the main process; pinned
# batches, so the preprocessor's non-blocking copy is only queued; the
# workers persist across epochs. The preprocessor is mmpretrain's, bit for
# bit, with that copy and the BGR -> RGB swap on the device.
train_dataloader = dict(
    batch_size=128,  # per GPU: 8 x 128 = 1024
    num_workers=8,
    pin_memory=True,
    persistent_workers=True,
    dataset=dict(pipeline=train_pipeline))
data_preprocessor = dict(type='NonBlockingSelfSupDataPreprocessor')
# One optimizer group per distinct (lr, weight decay) instead of one per
# tensor (exact; fewer kernel launches per step). Mixed precision in
# bfloat16 (A100, H100, H200, ...: fp32's range, no overflow) and so without
# a loss scaler: mmpretrain's AmpOptimWrapper would scale anyway and pay a
# host sync per step for it (MixedPrecisionOptimWrapper, loss_scale='auto').
# The regulariser runs in float64/float32 with autocast off either way. GPUs
# without bfloat16 (V100, T4) train in float16, with dynamic loss scaling:
#   --cfg-options optim_wrapper.dtype=float16
optim_wrapper = dict(
    type='MixedPrecisionOptimWrapper',
    loss_scale='auto',
    constructor='MergedGroupsOptimWrapperConstructor',
    dtype='bfloat16',
    optimizer=dict(lr=1.5e-4 * 1024 / 256))
auto_scale_lr = dict(base_batch_size=1024)

# Lists are replaced, not merged: the whole schedule is restated.
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=0.0001,
        by_epoch=True,
        begin=0,
        end=40,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=160,
        by_epoch=True,
        begin=40,
        end=200,
        convert_to_iter_based=True)
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=200)

# Resumed runs (resume=True in the base) draw the same masks as unbroken ones.
# DivergenceHook: stop at the first non-finite loss, before a NaN checkpoint.
custom_hooks = [dict(type='ReseedHook'), dict(type='DivergenceHook')]
