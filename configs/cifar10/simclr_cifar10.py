# SimCLR, ResNet-18 (CIFAR stem), CIFAR-10, 200 epochs, batch 256 on 1 GPU,
# with MatrixInfoHook (paper figures 1-3). Recipe: mmpretrain's SimCLR.
_base_ = [
    'mmpretrain::simclr/simclr_resnet50_16xb256-coslr-200e_in1k.py',
    '_base_/cifar10_siamese.py',
]

data_preprocessor = {{_base_.cifar10_data_preprocessor}}
train_dataloader = {{_base_.cifar10_train_dataloader}}
model = dict(
    data_preprocessor={{_base_.cifar10_data_preprocessor}},
    backbone={{_base_.cifar10_backbone}},
    neck=dict(in_channels=512, hid_channels=512, out_channels=128))

# LARS, lr 0.3 x batch / 256 (SimCLR's linear scaling, mmpretrain's 4.8 at
# batch 4096).
optim_wrapper = dict(optimizer=dict(lr=0.3))
param_scheduler = {{_base_.cifar10_param_scheduler}}
train_cfg = dict(max_epochs={{_base_.cifar10_epochs}})
default_hooks = {{_base_.cifar10_default_hooks}}
auto_scale_lr = dict(base_batch_size=256)
