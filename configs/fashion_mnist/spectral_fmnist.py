# Spectral contrastive learning (HaoChen et al., 2021) on Fashion-MNIST with
# matrix-information logging: the method the information-flow paper proves
# maximises the joint entropy between branches, beside SimCLR, BYOL and
# Barlow Twins on the same backbone, views, schedule and embedding size.
_base_ = ['_siamese_/siamese_fmnist.py']

model = dict(
    type='SpectralContrastive',
    data_preprocessor={{_base_.data_preprocessor}},
    backbone={{_base_.backbone}},
    # Barlow Twins' projector (the authors' code uses the same
    # Linear-BN-ReLU x2 + Linear shape): no last BN, so the loss sees the
    # projections' own scale.
    neck=dict(
        type='NonLinearNeck',
        in_channels=128,
        hid_channels={{_base_.proj_hidden}},
        out_channels={{_base_.feat_dim}},
        num_layers=3,
        with_last_bn=False,
        with_last_bn_affine=False,
        norm_cfg=dict(type='BN1d'),
        with_avg_pool=True),
    # mu=1: projections are kept in the unit ball, as in the authors' code.
    head=dict(
        type='SpectralContrastiveHead',
        loss=dict(type='SpectralContrastiveLoss', mu=1.0)))
