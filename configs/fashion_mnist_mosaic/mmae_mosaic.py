# M-MAE on 2 x 2 Fashion-MNIST mosaics: MAE + TCR of the masked pass's CLS
# token, as ../fashion_mnist/mmae_fmnist.py (lambda 0.01, mu 1; one process
# has the whole batch, so gather='global').
_base_ = ['mae_mosaic.py']

model = dict(
    type='MMAE',
    feature='cls',
    regularizer=dict(
        type='TCRLoss',
        mu=1.0,
        form='reference',
        centering=False,
        gather='global',
        loss_weight=0.01))
default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
