# Supervised control of the evidence study: the Fashion-MNIST ViT
# (vit-tiny-p4_arch.py) trained from random initialisation with labels, at
# the pretraining configs' budget (batch 256, 1 warm-up epoch then cosine,
# the same images and epochs), with the regularisation of MAE's fine-tuning
# recipe (finetune_fmnist.py: AdamW, drop path 0.1, label smoothing 0.1)
# but no layer-wise lr decay (nothing is pretrained). Its frozen CLS / CLS +
# mean features go through the same kNN / linear / low-shot evaluation as the
# pretrained encoders: an upper reference for what labels buy.
#   python tools/train.py configs/fashion_mnist/supervised_fmnist.py
_base_ = ['finetune_fmnist.py']

model = dict(backbone=dict(init_cfg=None))

optim_wrapper = dict(
    constructor='MergedGroupsOptimWrapperConstructor',
    paramwise_cfg=dict(
        _delete_=True,
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
# The evidence study evaluates the frozen features itself; no validation.
train_cfg = dict(_delete_=True, by_epoch=True, max_epochs=5)
val_dataloader = None
val_evaluator = None
val_cfg = None
