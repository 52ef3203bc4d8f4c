# U-MAE on Fashion-MNIST: MAE + square uniformity of the CLS token.
_base_ = ['mae_fmnist.py']

model = dict(
    type='MMAE',
    feature='cls',
    regularizer=dict(type='UniformityLoss', gather='global', loss_weight=0.01))

# RegularizerSkipHook: reports the steps whose regulariser term was skipped
# (MMAE's logged reg_skipped code). A named default hook: default_hooks is
# merged key by key, so the runtime's custom_hooks stay as they are.
default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
