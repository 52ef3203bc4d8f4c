# Barlow Twins, ResNet-18 (CIFAR stem), CIFAR-10, 200 epochs, batch 256 on 1
# GPU, with MatrixInfoHook (paper figures 1-3). Recipe: mmpretrain's
# Barlow Twins with a 2048-d projector (8192 on ImageNet).
_base_ = [
    'mmpretrain::barlowtwins/barlowtwins_resnet50_8xb256-coslr-300e_in1k.py',
    '_base_/cifar10_siamese.py',
]

data_preprocessor = {{_base_.cifar10_data_preprocessor}}
train_dataloader = {{_base_.cifar10_train_dataloader}}
model = dict(
    data_preprocessor={{_base_.cifar10_data_preprocessor}},
    backbone={{_base_.cifar10_backbone}},
    neck=dict(in_channels=512, hid_channels=2048, out_channels=2048),
    head=dict(in_channels=2048))

optim_wrapper = dict(optimizer=dict(lr=0.3))
param_scheduler = {{_base_.cifar10_param_scheduler}}
train_cfg = dict(max_epochs={{_base_.cifar10_epochs}})
default_hooks = {{_base_.cifar10_default_hooks}}
auto_scale_lr = dict(base_batch_size=256)
