# Shared by the Siamese Fashion-MNIST configs (SimCLR, BYOL, Barlow Twins,
# spectral contrastive):
# two augmented views, a quarter-width ResNet-18, the MatrixInfoHook, and
# a short cosine schedule that runs on CPU cores in minutes. Figures 1-3 of
# the information-flow paper are drawn from the hook's logs with
# tools/analysis/plot_matrix_info.py.
_base_ = [
    '../_base_/default_runtime.py',  # plugin import, logger, env, seed
    '../_base_/fmnist_pretrain.py',  # GzipFashionMNIST, 1-channel stats
    'resnet18_quarter_arch.py',  # the encoder (`backbone`)
]

# Two views of every image. Fashion-MNIST is grey, so SimCLR's colour
# augmentations have nothing to act on; crops, flips and blur remain.
view_pipeline = [
    dict(
        type='RandomResizedCrop',
        scale=28,
        crop_ratio_range=(0.3, 1.0),
        backend='pillow'),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomApply',
        transforms=[
            dict(
                type='GaussianBlur',
                magnitude_range=(0.1, 1.0),
                magnitude_std='inf',
                prob=1.0)
        ],
        prob=0.5),
]
train_pipeline = [
    dict(type='MultiView', num_views=2, transforms=[view_pipeline]),
    dict(type='PackInputs'),
]

# 12,800 training images (50 batches of 256) keep one epoch under a couple
# of minutes on 2 CPU cores; drop `indices` to use all 60,000.
train_dataloader = dict(
    batch_size=256, dataset=dict(pipeline=train_pipeline, indices=12800))
# Each view is flipped in its pipeline: no second, batched flip.
data_preprocessor = dict(flip_prob=0.0)

feat_dim = 128  # embedding size d of every method, so curves are comparable
proj_hidden = 512

# LARS as the mmpretrain recipes, scaled down for batch 256 and 10 epochs.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='LARS', lr=0.6, momentum=0.9, weight_decay=1e-6),
    paramwise_cfg=dict(
        custom_keys={
            'bn': dict(decay_mult=0, lars_exclude=True),
            'bias': dict(decay_mult=0, lars_exclude=True),
            'downsample.1': dict(decay_mult=0, lars_exclude=True),
        }))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-2,
        by_epoch=True,
        begin=0,
        end=1,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=9,
        by_epoch=True,
        begin=1,
        end=10,
        convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=10)
# The lr is for a total batch of 256; --auto-scale-lr rescales it linearly.
auto_scale_lr = dict(base_batch_size=256)

default_hooks = dict(logger=dict(type='LoggerHook', interval=10))
# Every 10 iterations, for enough points in these short runs (the default 50
# suits long ones): a sample costs ~20 ms, 10 iterations ~3 s on 2 CPU
# cores, so under 1 % (measured by dev/benchmarks/bench_matrix_info.py).
# Per epoch (and before training) the same quantities on a fixed held-out
# set as well: 4 batches of 256 test images, each with the same two views at
# every epoch (seed 0), logged as minfo_heldout/<name>. BatchNorm in train
# mode (batch statistics), the regime of the training-batch values and of
# the paper's figures (eval mode, running statistics, gave entropies about
# 1 nat lower after one epoch, and at initialisation the running statistics
# are still the identity). Measured cost per measurement on 2 shared CPU
# cores: 2 s (SimCLR), 5 s (Barlow Twins), 7 s (spectral), 25 s (BYOL,
# four encoder passes) against 2.5-4 min per 12,800-image epoch.
minfo_heldout = dict(
    dataset=dict(
        type={{_base_.dataset_type}},
        data_root={{_base_.data_root}},
        split='test',
        pipeline=train_pipeline),
    num_batches=4,
    seed=0,
    mode='train')
custom_hooks = [
    dict(
        type='MatrixInfoHook',
        interval=10,
        kernel='covariance',
        heldout=minfo_heldout),
    dict(type='DivergenceHook')
]
