# M-MAE on Fashion-MNIST with attention distance / collapse logged per layer.
_base_ = ['mmae_fmnist.py', '_attention_locality_hook.py']

# Added as a named default hook: default_hooks is merged key by key, so the
# runtime's custom_hooks stay as they are (mmpretrain's own runtime puts its
# VisualizationHook here the same way).
default_hooks = dict(attention_locality={{_base_.attention_locality_hook}})
