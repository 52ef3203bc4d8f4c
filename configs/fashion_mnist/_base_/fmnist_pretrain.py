# Fashion-MNIST (28 x 28, one channel) for masked-image pretraining.
dataset_type = 'GzipFashionMNIST'
data_root = '/usr/share/datasets/fashion-mnist'

data_preprocessor = dict(
    type='SelfSupDataPreprocessor',
    mean=[72.94],  # Fashion-MNIST training-set pixel statistics
    std=[90.02],
    to_rgb=False)

train_pipeline = [
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackInputs'),
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
        pipeline=train_pipeline))
