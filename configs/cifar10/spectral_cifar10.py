# Spectral contrastive learning (HaoChen et al., 2021) on CIFAR-10 for the
# information-flow figures: mmpretrain's SimCLR recipe (LARS, the two-view
# pipeline of cifar10_siamese.py) with the plugin's SpectralContrastive
# algorithm. Projector: Barlow Twins' shape and width here (Linear-BN-ReLU
# x2 + Linear, 2048 wide), so the two joint-entropy maximisers of the
# paper's Theorem 2 share the ceiling ln 2048.
_base_ = [
    'mmpretrain::simclr/simclr_resnet50_16xb256-coslr-200e_in1k.py',
    '_base_/cifar10_siamese.py',
]

data_preprocessor = {{_base_.cifar10_data_preprocessor}}
train_dataloader = {{_base_.cifar10_train_dataloader}}
model = dict(
    type='SpectralContrastive',
    data_preprocessor={{_base_.cifar10_data_preprocessor}},
    backbone={{_base_.cifar10_backbone}},
    neck=dict(
        type='NonLinearNeck',
        in_channels=512,
        hid_channels=2048,
        out_channels=2048,
        num_layers=3,
        with_last_bn=False,
        with_last_bn_affine=False,
        norm_cfg=dict(type='SyncBN'),
        with_avg_pool=True),
    # mu=1: projections kept in the unit ball, as in the authors' code.
    head=dict(
        _delete_=True,
        type='SpectralContrastiveHead',
        loss=dict(type='SpectralContrastiveLoss', mu=1.0)))

optim_wrapper = dict(optimizer=dict(lr=0.3))
param_scheduler = {{_base_.cifar10_param_scheduler}}
train_cfg = dict(max_epochs={{_base_.cifar10_epochs}})
default_hooks = {{_base_.cifar10_default_hooks}}
auto_scale_lr = dict(base_batch_size=256)
