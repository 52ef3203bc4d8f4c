# SimCLR on Fashion-MNIST with matrix-information logging (paper figs. 1-3).
_base_ = ['_siamese_/siamese_fmnist.py']

model = dict(
    type='SimCLR',
    data_preprocessor={{_base_.data_preprocessor}},
    backbone={{_base_.backbone}},
    neck=dict(
        type='NonLinearNeck',
        in_channels=128,
        hid_channels={{_base_.proj_hidden}},
        out_channels={{_base_.feat_dim}},
        num_layers=2,
        norm_cfg=dict(type='BN1d'),
        with_avg_pool=True),
    head=dict(
        type='ContrastiveHead',
        loss=dict(type='CrossEntropyLoss'),
        temperature=0.1))
