# Plain MAE (mmpretrain's algorithm) on Fashion-MNIST: the baseline.
_base_ = [
    '_base_/mae_vit-tiny-p4_fmnist.py',
    '_base_/fmnist_pretrain.py',
    '_base_/schedule_pretrain.py',
    '_base_/default_runtime.py',
]
