# Labelled Fashion-MNIST for the evaluations of a pretrained encoder (linear
# probe, fine-tuning, kNN): the pretraining data (fmnist_pretrain.py) with
# labels, random flips in the pipeline, and the 10,000 test images scored by
# top-1 accuracy.
_base_ = ['fmnist_pretrain.py']

data_preprocessor = dict(
    _delete_=True,
    type='ClsDataPreprocessor',
    num_classes=10,
    mean={{_base_.data_preprocessor.mean}},
    std={{_base_.data_preprocessor.std}},
    to_rgb=False)

train_pipeline = [dict(type='RandomFlip', prob=0.5), dict(type='PackInputs')]
test_pipeline = [dict(type='PackInputs')]

train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=500,
    num_workers={{_base_.train_dataloader.num_workers}},
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type={{_base_.dataset_type}},
        data_root={{_base_.data_root}},
        split='test',
        test_mode=True,
        pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
