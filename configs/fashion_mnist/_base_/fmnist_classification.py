# Labelled Fashion-MNIST for the evaluations of a pretrained encoder (linear
# probe, fine-tuning, kNN): the 60,000 training images (flipped at random
# while training) and the 10,000 test images, top-1 accuracy.
dataset_type = 'GzipFashionMNIST'
data_root = '/usr/share/datasets/fashion-mnist'

data_preprocessor = dict(
    type='ClsDataPreprocessor',
    num_classes=10,
    mean=[72.94],  # Fashion-MNIST training-set pixel statistics
    std=[90.02],
    to_rgb=False)

train_pipeline = [dict(type='RandomFlip', prob=0.5), dict(type='PackInputs')]
test_pipeline = [dict(type='PackInputs')]

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
val_dataloader = dict(
    batch_size=500,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        split='test',
        test_mode=True,
        pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
