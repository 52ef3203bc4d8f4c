# M-MAE on Fashion-MNIST: MAE + TCR of the masked pass's CLS token.
# One process here has the whole batch, so gather='global' and the
# reference weight 0.01 mean the same thing on 1 or N processes.
_base_ = ['mae_fmnist.py']

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

# RegularizerSkipHook: reports the steps whose regulariser term was skipped
# (MMAE's logged reg_skipped code). A named default hook: default_hooks is
# merged key by key, so the runtime's custom_hooks stay as they are.
default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
