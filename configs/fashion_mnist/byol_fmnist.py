# BYOL on Fashion-MNIST with matrix-information logging (paper figs. 1-3).
# MatrixInfoHook compares the online projection of view 1 with the target
# projection of view 2 (the online and momentum networks of the paper).
_base_ = ['_siamese_/siamese_fmnist.py']

model = dict(
    type='BYOL',
    base_momentum=0.01,
    data_preprocessor={{_base_.data_preprocessor}},
    backbone={{_base_.backbone}},
    neck=dict(
        type='NonLinearNeck',
        in_channels=128,
        hid_channels={{_base_.proj_hidden}},
        out_channels={{_base_.feat_dim}},
        num_layers=2,
        with_bias=True,
        with_last_bn=False,
        norm_cfg=dict(type='BN1d'),
        with_avg_pool=True),
    head=dict(
        type='LatentPredictHead',
        predictor=dict(
            type='NonLinearNeck',
            in_channels={{_base_.feat_dim}},
            hid_channels={{_base_.proj_hidden}},
            out_channels={{_base_.feat_dim}},
            num_layers=2,
            with_bias=True,
            with_last_bn=False,
            norm_cfg=dict(type='BN1d'),
            with_avg_pool=False),
        loss=dict(type='CosineSimilarityLoss')))
