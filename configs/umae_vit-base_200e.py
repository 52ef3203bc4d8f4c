# U-MAE ViT-B/16, 200 epochs on ImageNet-1K (paper Table 1: linear 58.5,
# fine-tune 83.0): MAE + lambda * mean((zn zn^T)^2) of the masked pass's
# CLS token, lambda = 0.01 as published, applied through an exact gather
# with weight 0.01 / 8 (see mmae_vit-base_200e.py for why).
#   tools/dist_train.sh configs/umae_vit-base_200e.py 8
_base_ = 'mae_vit-base_200e.py'

model = dict(
    type='MMAE',
    feature='cls',
    regularizer=dict(
        type='UniformityLoss', gather='global', loss_weight=0.01 / 8))

# RegularizerSkipHook: reports the steps whose regulariser term was skipped
# (MMAE's logged reg_skipped code). A named default hook: default_hooks is
# merged key by key, so the runtime's custom_hooks stay as they are.
default_hooks = dict(regularizer_skip=dict(type='RegularizerSkipHook'))
