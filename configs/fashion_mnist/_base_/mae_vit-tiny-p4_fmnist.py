# mmpretrain's MAE ViT recipe shrunk to Fashion-MNIST's 28 x 28 images.
_base_ = [
    'mmpretrain::_base_/models/mae_vit-base-p16.py',
    'vit-tiny-p4_arch.py',
]

model = dict(
    backbone=dict(
        _delete_=True,
        type='MAEViT',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        # MAEViT takes the channel count through patch_cfg only.
        patch_cfg=dict(in_channels={{_base_.in_channels}}),
        mask_ratio=0.75),
    neck=dict(
        num_patches={{_base_.num_patches}},
        patch_size={{_base_.patch_size}},
        in_chans={{_base_.in_channels}},
        embed_dim={{_base_.vit_arch.embed_dims}},
        decoder_embed_dim=64,
        decoder_depth=2,
        decoder_num_heads=4),
    head=dict(
        patch_size={{_base_.patch_size}}, in_channels={{_base_.in_channels}}))
