# Supervised control of the mosaic study: the same ViT trained from random
# initialisation with every cell's label (CellClsHead on the CLS token), at
# the pretraining arms' budget and schedule, with the regularisation of
# ../fashion_mnist/supervised_fmnist.py (AdamW, drop path 0.1, label
# smoothing 0.1). Its frozen features go through the same evaluation as the
# pretrained encoders: what labels buy.
_base_ = [
    '../fashion_mnist/_base_/default_runtime.py',
    '_base_/mosaic_pretrain.py',
]

data_preprocessor = dict(
    _delete_=True,
    type='ClsDataPreprocessor',
    mean={{_base_.data_preprocessor.mean}},
    std={{_base_.data_preprocessor.std}},
    to_rgb=False)
train_pipeline = [dict(type='PackInputs', meta_keys=())]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        out_type='cls_token',
        final_norm=True,
        drop_path_rate=0.1),
    head=dict(
        type='CellClsHead',
        num_cells={{_base_.num_cells}},
        num_classes=10,
        in_channels={{_base_.vit_arch.embed_dims}},
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=[dict(type='TruncNormal', layer='Linear', std=2e-5)]))

optim_wrapper = dict(
    type='OptimWrapper',
    constructor='MergedGroupsOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys={
            '.ln': dict(decay_mult=0.0),
            '.bias': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
            '.pos_embed': dict(decay_mult=0.0),
        }))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-3,
        by_epoch=True,
        begin=0,
        end=1,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=4,
        by_epoch=True,
        begin=1,
        end=5,
        eta_min=1e-6,
        convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=5)
auto_scale_lr = dict(base_batch_size=256)
