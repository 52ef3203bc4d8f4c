# SimCLR on 2 x 2 Fashion-MNIST mosaics with the same ViT, optimiser and
# schedule as the MAE arms (mae_mosaic.py), so the arms differ only in the
# objective (as ../fashion_mnist/mocov3_vit_fmnist.py). Views: SimCLR's
# random resized crops and blur; the images are grey, so its colour
# augmentations have nothing to act on; no flips (see
# _base_/mosaic_pretrain.py).
_base_ = [
    '../fashion_mnist/_base_/default_runtime.py',
    '../fashion_mnist/_base_/schedule_pretrain.py',
    '_base_/mosaic_pretrain.py',
]

view_pipeline = [
    dict(
        type='RandomResizedCrop',
        scale={{_base_.img_size}},
        crop_ratio_range=(0.2, 1.0),
        backend='pillow'),
    dict(
        type='RandomApply',
        transforms=[
            dict(
                type='GaussianBlur',
                magnitude_range=(0.1, 1.0),
                magnitude_std='inf',
                prob=1.0)
        ],
        prob=0.5),
]
train_pipeline = [
    dict(type='MultiView', num_views=2, transforms=[view_pipeline]),
    dict(type='PackInputs', meta_keys=()),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

model = dict(
    type='SimCLR',
    data_preprocessor={{_base_.data_preprocessor}},
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        out_type='cls_token',
        final_norm=True),
    neck=dict(
        type='NonLinearNeck',
        in_channels={{_base_.vit_arch.embed_dims}},
        hid_channels=512,
        out_channels=128,
        num_layers=2,
        norm_cfg=dict(type='BN1d'),
        with_avg_pool=False),
    head=dict(
        type='ContrastiveHead',
        loss=dict(type='CrossEntropyLoss'),
        temperature=0.1))

# The shared schedule's parameter groups name MAE-only parameters
# (mask_token); the same optimiser and rates without those keys.
optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        custom_keys={
            'ln': dict(decay_mult=0.0),
            'bias': dict(decay_mult=0.0),
            'pos_embed': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }))
