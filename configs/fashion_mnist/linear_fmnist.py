# Linear probe of a Fashion-MNIST pretrained encoder (MAE, U-MAE or M-MAE),
# following mmpretrain's MAE linear benchmark: frozen ViT, CLS token,
# BatchNorm without affine, a linear classifier trained with LARS.
# Usage:
#   python tools/train.py configs/fashion_mnist/linear_fmnist.py \
#       --cfg-options model.backbone.init_cfg.checkpoint=PRETRAINED.pth
_base_ = [
    '_base_/vit-tiny-p4_arch.py',
    '_base_/default_runtime.py',
]

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        frozen_stages={{_base_.vit_arch.num_layers}},
        out_type='cls_token',
        final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint='', prefix='backbone.')),
    neck=dict(
        type='ClsBatchNormNeck',
        input_features={{_base_.vit_arch.embed_dims}}),
    head=dict(
        type='VisionTransformerClsHead',
        num_classes=10,
        in_channels={{_base_.vit_arch.embed_dims}},
        loss=dict(type='CrossEntropyLoss'),
        init_cfg=[dict(type='TruncNormal', layer='Linear', std=0.01)]))

data_preprocessor = dict(
    type='ClsDataPreprocessor',
    num_classes=10,
    mean=[72.94],
    std=[90.02],
    to_rgb=False)

dataset_type = 'GzipFashionMNIST'
data_root = '/usr/share/datasets/fashion-mnist'
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
        pipeline=[dict(type='RandomFlip', prob=0.5),
                  dict(type='PackInputs')]))
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
        pipeline=[dict(type='PackInputs')]))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

# LARS rescales every step by ||w|| / ||grad||, so its lr is not SGD's. On a
# 5-epoch M-MAE encoder (10,240 probe images, 5 epochs) we measured top-1
# 58.0 % at lr 1.6, 71.7 % at 6.4, 74.5 % at 20 and 74.9 % at 60.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='LARS', lr=20.0, weight_decay=0.0, momentum=0.9))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=4, by_epoch=True, begin=1, end=5,
         eta_min=0.0, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=5, val_interval=5)
val_cfg = dict()
test_cfg = dict()
