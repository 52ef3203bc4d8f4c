# CIFAR-10 pieces shared by the Siamese configs of this folder. Every name is
# prefixed with `cifar10_` because the method configs also inherit
# mmpretrain's ImageNet recipe, and mmengine forbids a key defined by two
# bases; the method files assign these values to the real keys.
#
# Data: the python version of CIFAR-10 (the folder `cifar-10-batches-py`
# extracted from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz)
# under `cifar10_data_root`. Nothing is downloaded: when the folder is absent
# mmpretrain's CIFAR10 raises "Cannot find CIFAR10 dataset in <folder>".
# Point it elsewhere with
#   --cfg-options train_dataloader.dataset.data_root=/path/to/cifar10
custom_imports = dict(
    imports=['mmae_plugin.registration'], allow_failed_imports=False)
# default_scope='mmpretrain' comes from mmpretrain's default_runtime.

cifar10_data_root = 'data/cifar10'

cifar10_data_preprocessor = dict(
    type='SelfSupDataPreprocessor',
    mean=[125.307, 122.961, 113.8575],
    std=[51.5865, 50.847, 51.255],
    to_rgb=False)  # CIFAR10 already yields RGB arrays

# SimCLR's augmentations at 32 x 32 (no blur on CIFAR, as in SimCLR).
cifar10_view_pipeline = [
    dict(
        type='RandomResizedCrop',
        scale=32,
        crop_ratio_range=(0.08, 1.0),
        backend='pillow'),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomApply',
        transforms=[
            dict(
                type='ColorJitter',
                brightness=0.4,
                contrast=0.4,
                saturation=0.4,
                hue=0.1)
        ],
        prob=0.8),
    dict(
        type='RandomGrayscale',
        prob=0.2,
        keep_channels=True,
        channel_weights=(0.114, 0.587, 0.2989)),
]

cifar10_train_dataloader = dict(
    batch_size=256,
    num_workers=8,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        _delete_=True,  # drop the ImageNet keys (ann_file, data_prefix)
        type='CIFAR10',
        data_root=cifar10_data_root,
        split='train',
        download=False,
        pipeline=[
            dict(
                type='MultiView',
                num_views=2,
                transforms=[cifar10_view_pipeline]),
            dict(type='PackInputs')
        ]))

# CIFAR variant of ResNet-18 (3x3 stem, no max-pool): 512-d features.
# SyncBN as mmpretrain's recipes; on one device the runner reverts it to BN.
cifar10_backbone = dict(
    _delete_=True,
    type='ResNet_CIFAR',
    depth=18,
    norm_cfg=dict(type='SyncBN'),
    zero_init_residual=True)

cifar10_epochs = 200
cifar10_param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-4,
        by_epoch=True,
        begin=0,
        end=10,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=cifar10_epochs - 10,
        by_epoch=True,
        begin=10,
        end=cifar10_epochs,
        convert_to_iter_based=True)
]

# Paper figures 1-3: quantities of the batch-normalised covariances of the
# two branches, every 50 iterations (a multiple of the logger interval).
cifar10_default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(type='SafeCheckpointHook', interval=20, max_keep_ckpts=3),
    runtime_info=dict(type='DeferredRuntimeInfoHook'))
runner_type = 'MMAERunner'  # verified auto-resume (docs/reliability.md)
# Per epoch and before training, the same quantities on a fixed held-out
# set: 2 batches of 2,048 test images with the same two views at every
# epoch (seed 0), BatchNorm in train mode as on the training batches. 2,048
# images per batch: the covariance of the widest projector here (Barlow
# Twins', 2048-d) is then not rank-limited, and every method is measured
# alike (docs/siamese_controls.md). About 2 s per measurement on one GPU.
cifar10_heldout = dict(
    dataset=dict(
        type='CIFAR10',
        data_root=cifar10_data_root,
        split='test',
        download=False,
        pipeline=[
            dict(
                type='MultiView',
                num_views=2,
                transforms=[cifar10_view_pipeline]),
            dict(type='PackInputs')
        ]),
    num_batches=2,
    batch_size=2048,
    seed=0,
    mode='train')
custom_hooks = [
    dict(
        type='MatrixInfoHook',
        interval=50,
        kernel='covariance',
        heldout=cifar10_heldout),
    dict(type='DivergenceHook')
]
