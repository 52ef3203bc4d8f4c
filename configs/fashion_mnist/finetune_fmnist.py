# End-to-end fine-tuning of a Fashion-MNIST pretrained encoder (MAE, U-MAE or
# M-MAE), MAE's fine-tuning protocol scaled down: the whole ViT trains with
# AdamW, layer-wise lr decay 0.65, drop path 0.1 and label smoothing 0.1;
# 1 warm-up epoch, cosine to 10 epochs, batch 256.
# Usage:
#   python tools/train.py configs/fashion_mnist/finetune_fmnist.py \
#       --cfg-options model.backbone.init_cfg.checkpoint=PRETRAINED.pth
_base_ = [
    '_base_/vit-tiny-p4_classifier.py',
    '_base_/fmnist_classification.py',
    '_base_/default_runtime.py',
]

model = dict(
    backbone=dict(drop_path_rate=0.1),
    head=dict(
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=[dict(type='TruncNormal', layer='Linear', std=2e-5)]))

# mmpretrain's layer-decay constructor, tensors of a layer that share a weight
# decay merged into one group (exact; see docs/performance.md).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999)),
    constructor='MergedGroupsLearningRateDecayOptimWrapperConstructor',
    paramwise_cfg=dict(
        layer_decay_rate=0.65,
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
        T_max=9,
        by_epoch=True,
        begin=1,
        end=10,
        eta_min=1e-6,
        convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# The lr above is for a total batch of 256; --auto-scale-lr rescales it.
auto_scale_lr = dict(base_batch_size=256)
