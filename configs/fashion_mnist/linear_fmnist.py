# Linear probe of a Fashion-MNIST pretrained encoder (MAE, U-MAE or M-MAE),
# following mmpretrain's MAE linear benchmark: frozen ViT, CLS token,
# BatchNorm without affine, a linear classifier trained with LARS.
# Usage:
#   python tools/train.py configs/fashion_mnist/linear_fmnist.py \
#       --cfg-options model.backbone.init_cfg.checkpoint=PRETRAINED.pth
_base_ = [
    '_base_/vit-tiny-p4_classifier.py',
    '_base_/fmnist_classification.py',
    '_base_/default_runtime.py',
]

model = dict(
    backbone=dict(frozen_stages={{_base_.vit_arch.num_layers}}),
    neck=dict(
        type='ClsBatchNormNeck',
        input_features={{_base_.vit_arch.embed_dims}}),
    head=dict(init_cfg=[dict(type='TruncNormal', layer='Linear', std=0.01)]))

# LARS rescales every step by ||w|| / ||grad||, so its lr is not SGD's. On a
# 5-epoch M-MAE encoder (10,240 probe images, 5 epochs) we measured top-1
# 58.0 % at lr 1.6, 71.7 % at 6.4, 74.5 % at 20 and 74.9 % at 60.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='LARS', lr=20.0, weight_decay=0.0, momentum=0.9))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-4,
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
        eta_min=0.0,
        convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=5, val_interval=5)
val_cfg = dict()
test_cfg = dict()
# The lr is for a total batch of 256; --auto-scale-lr rescales it linearly.
auto_scale_lr = dict(base_batch_size=256)
