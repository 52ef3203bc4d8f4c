# Barlow Twins on Fashion-MNIST with matrix-information logging (figs. 1-3).
_base_ = ['_siamese_/siamese_fmnist.py']

model = dict(
    type='BarlowTwins',
    data_preprocessor={{_base_.data_preprocessor}},
    backbone={{_base_.backbone}},
    neck=dict(
        type='NonLinearNeck',
        in_channels=128,
        hid_channels={{_base_.proj_hidden}},
        out_channels={{_base_.feat_dim}},
        num_layers=3,
        with_last_bn=False,
        with_last_bn_affine=False,
        norm_cfg=dict(type='BN1d'),
        with_avg_pool=True,
        init_cfg=dict(
            type='Kaiming', distribution='uniform', layer=['Linear'])),
    head=dict(
        type='LatentCrossCorrelationHead',
        in_channels={{_base_.feat_dim}},
        loss=dict(type='CrossCorrelationLoss')))

# Barlow Twins' recipe: a lower LARS rate for BN and bias parameters.
optim_wrapper = dict(
    optimizer=dict(lr=0.3),
    paramwise_cfg=dict(
        custom_keys={
            'bn': dict(decay_mult=0, lr_mult=0.024, lars_exclude=True),
            'bias': dict(decay_mult=0, lr_mult=0.024, lars_exclude=True),
            'downsample.1': dict(
                decay_mult=0, lr_mult=0.024, lars_exclude=True),
        }))
