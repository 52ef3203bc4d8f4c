# MAE on 2 x 2 Fashion-MNIST mosaics (56 x 56, 7 x 7 patches): the model,
# optimiser and schedule of ../fashion_mnist/mae_fmnist.py, the data of
# _base_/mosaic_pretrain.py.
#   python tools/train.py configs/fashion_mnist_mosaic/mae_mosaic.py
_base_ = [
    '../fashion_mnist/_base_/default_runtime.py',
    '../fashion_mnist/_base_/schedule_pretrain.py',
    '_base_/mosaic_pretrain.py',
    'mmpretrain::_base_/models/mae_vit-base-p16.py',
]

model = dict(
    backbone=dict(
        _delete_=True,
        type='MAEViT',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
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
