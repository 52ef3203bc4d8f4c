# Fashion-MNIST (28 x 28, one channel) for masked-image pretraining.
dataset_type = 'GzipFashionMNIST'
data_root = '/usr/share/datasets/fashion-mnist'

# The random horizontal flip runs batched on the main process (one torch op
# per batch, drawn from torch's generator that ReseedHook reseeds every
# iteration) instead of per sample in the dataloader worker, which on 2 CPU
# cores takes its time from the model (docs/performance.md). Multi-view
# configs that flip each view in their pipeline set flip_prob=0.
data_preprocessor = dict(
    type='BatchFlipDataPreprocessor',
    flip_prob=0.5,
    mean=[72.94],  # Fashion-MNIST training-set pixel statistics
    std=[90.02],
    to_rgb=False)

# Pretraining reads only the image: dropping the label and meta keys before
# packing halves the worker's time per batch and what it sends to the main
# process (256 label tensors pickled through shared memory per batch).
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
        pipeline=train_pipeline))
