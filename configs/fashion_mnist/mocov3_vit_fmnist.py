# MoCo v3 (contrastive) on Fashion-MNIST with the SAME ViT as the MAE configs
# (4 layers, 128 wide, 4 heads, 7 x 7 patches of 4 x 4 pixels, one channel),
# the same optimiser and schedule, and AttentionLocalityHook, so that MAE,
# M-MAE and contrastive learning differ only in the objective.
_base_ = [
    '_base_/vit-tiny-p4_arch.py',  # the ViT shared by all fmnist configs
    '_base_/fmnist_pretrain.py',
    '_base_/schedule_pretrain.py',
    '_base_/default_runtime.py',
    '_attention_locality_hook.py',
]

# Added as a named default hook: default_hooks is merged key by key, so the
# runtime's custom_hooks stay as they are (mmpretrain's own runtime puts its
# VisualizationHook here the same way).
default_hooks = dict(attention_locality={{_base_.attention_locality_hook}})

temperature = 0.2

# Two asymmetric views as in MoCo v3's ViT recipe, restricted to transforms
# that make sense for 28 x 28 grayscale images (no colour jitter/grayscale).
view_pipeline1 = [
    dict(
        type='RandomResizedCrop',
        scale=28,
        crop_ratio_range=(0.2, 1.),
        backend='pillow'),
    dict(
        type='GaussianBlur',
        magnitude_range=(0.1, 1.0),
        magnitude_std='inf',
        prob=0.5),
    dict(type='RandomFlip', prob=0.5),
]
view_pipeline2 = [
    dict(
        type='RandomResizedCrop',
        scale=28,
        crop_ratio_range=(0.2, 1.),
        backend='pillow'),
    dict(
        type='GaussianBlur',
        magnitude_range=(0.1, 1.0),
        magnitude_std='inf',
        prob=0.1),
    dict(type='Solarize', thr=128, prob=0.2),
    dict(type='RandomFlip', prob=0.5),
]
train_pipeline = [
    dict(
        type='MultiView',
        num_views=[1, 1],
        transforms=[view_pipeline1, view_pipeline2]),
    dict(type='PackInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

model = dict(
    type='MoCoV3',
    base_momentum=0.01,
    # Each view is flipped in its pipeline: no second, batched flip.
    data_preprocessor=dict(
        type='BatchFlipDataPreprocessor',
        flip_prob=0.0,
        mean={{_base_.data_preprocessor.mean}},
        std={{_base_.data_preprocessor.std}},
        to_rgb=False),
    backbone=dict(
        type='MoCoV3ViT',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        stop_grad_conv1=True),
    neck=dict(
        type='NonLinearNeck',
        in_channels={{_base_.vit_arch.embed_dims}},
        hid_channels=512,
        out_channels=128,
        num_layers=3,
        with_bias=False,
        with_last_bn=True,
        with_last_bn_affine=False,
        with_last_bias=False,
        with_avg_pool=False),
    head=dict(
        type='MoCoV3Head',
        predictor=dict(
            type='NonLinearNeck',
            in_channels=128,
            hid_channels=512,
            out_channels=128,
            num_layers=2,
            with_bias=False,
            with_last_bn=True,
            with_last_bn_affine=False,
            with_last_bias=False,
            with_avg_pool=False),
        loss=dict(type='CrossEntropyLoss', loss_weight=2 * temperature),
        temperature=temperature))

# The shared schedule's parameter groups name MAE-only parameters
# (mask_token); keep the same optimiser and learning rate, drop those keys.
optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        custom_keys={
            'ln': dict(decay_mult=0.0),
            'bias': dict(decay_mult=0.0),
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }))
find_unused_parameters = True
