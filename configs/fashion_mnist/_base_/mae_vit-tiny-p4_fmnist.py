# mmpretrain's MAE ViT recipe shrunk to 28 x 28 one-channel images:
# a 4-layer, 128-wide encoder over 7 x 7 patches of 4 x 4 pixels.
_base_ = ['mmpretrain::_base_/models/mae_vit-base-p16.py']

vit_arch = dict(
    _delete_=True, embed_dims=128, num_layers=4, num_heads=4,
    feedforward_channels=512)
model = dict(
    backbone=dict(
        arch=vit_arch, img_size=28, patch_size=4,
        patch_cfg=dict(in_channels=1),  # MAEViT takes channels here only
        mask_ratio=0.75),
    neck=dict(
        num_patches=49,
        patch_size=4,
        in_chans=1,
        embed_dim=128,
        decoder_embed_dim=64,
        decoder_depth=2,
        decoder_num_heads=4),
    head=dict(patch_size=4, in_channels=1))
