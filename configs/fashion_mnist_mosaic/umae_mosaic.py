# U-MAE on 2 x 2 Fashion-MNIST mosaics: MAE + square uniformity of the CLS
# token, as ../fashion_mnist/umae_fmnist.py (lambda 0.01).
_base_ = ['mae_mosaic.py']

model = dict(
    type='MMAE',
    feature='cls',
    regularizer=dict(type='UniformityLoss', gather='global', loss_weight=0.01))
default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
