# linear_fmnist.py on the CLS token and the mean of the patch tokens,
# concatenated (DINO's ViT-B linear evaluation): the classifier that
# `evaluate_frozen.py configs/fashion_mnist/knn_fmnist_clsmean.py
# --save-linear` writes, so tools/test.py evaluates the quick start's probe.
_base_ = ['linear_fmnist.py']

num_features = 256  # 2 x embed_dims of _base_/vit-tiny-p4_arch.py
model = dict(
    backbone=dict(out_type='raw'),
    neck=[
        dict(type='TokenPoolingNeck', pooling='cls+mean'),
        dict(type='ClsBatchNormNeck', input_features=num_features),
    ],
    head=dict(in_channels=num_features))
