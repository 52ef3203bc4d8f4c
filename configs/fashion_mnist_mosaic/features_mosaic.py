# Frozen features of a mosaic encoder for the mosaic study's evaluation
# (tools/compare.py --evaluation mosaic, docs/mosaic.md): the ViT of the
# mosaic configs on the CLS token and the mean patch token
# (pooling='cls+mean' gives both), the 60,000 training mosaics (the probes'
# training set) and the 10,000 test mosaics. Its labels are one class per
# cell, so it is not a tools/test.py kNN config.
_base_ = [
    '../fashion_mnist/_base_/default_runtime.py',
    '_base_/mosaic_pretrain.py',
]

test_pipeline = [dict(type='PackInputs')]
mosaic_loader = dict(
    batch_size=500,
    num_workers=1,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))

model = dict(
    type='KNNClassifier',
    data_preprocessor=dict(
        type='ClsDataPreprocessor',
        mean={{_base_.data_preprocessor.mean}},
        std={{_base_.data_preprocessor.std}},
        to_rgb=False),
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        out_type='raw',
        final_norm=True),
    pooling='cls+mean',
    num_classes=10,
    prototype=dict(
        **mosaic_loader,
        dataset=dict(
            type={{_base_.dataset_type}},
            data_root={{_base_.data_root}},
            split='train',
            grid={{_base_.grid}},
            seed={{_base_.mosaic_seed}},
            pipeline=test_pipeline)))

test_dataloader = dict(
    **mosaic_loader,
    dataset=dict(
        type={{_base_.dataset_type}},
        data_root={{_base_.data_root}},
        split='test',
        grid={{_base_.grid}},
        seed={{_base_.mosaic_seed}},
        test_mode=True,
        pipeline=test_pipeline))
test_evaluator = []
test_cfg = dict()
train_dataloader = None
val_dataloader = None
val_evaluator = None
