# Fashion-MNIST mosaics (FashionMNISTMosaic) for pretraining: the fixed
# table of 60,000 training mosaics of seed 0, images only. No flips in any
# mosaic config: a horizontal flip swaps the left and right cells, so it
# would teach the invariance the per-cell evaluation measures against.
_base_ = ['mosaic_arch.py']

dataset_type = 'FashionMNISTMosaic'
data_root = '/usr/share/datasets/fashion-mnist'
mosaic_seed = 0

data_preprocessor = dict(
    type='BatchFlipDataPreprocessor',
    flip_prob=0.0,
    mean=[72.94],  # Fashion-MNIST training-set pixel statistics
    std=[90.02],
    to_rgb=False)

train_pipeline = [
    dict(type='Collect', keys=['img']),
    dict(type='PackInputs', meta_keys=()),
]
train_dataloader = dict(
    batch_size=256,
    num_workers=1,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        split='train',
        grid={{_base_.grid}},
        seed=mosaic_seed,
        pipeline=train_pipeline))
