# U-MAE on Fashion-MNIST: MAE + square uniformity of the CLS token.
_base_ = ['mae_fmnist.py']

model = dict(
    type='MMAE',
    feature='cls',
    regularizer=dict(type='UniformityLoss', gather='global', loss_weight=0.01))
