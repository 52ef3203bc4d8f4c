# M-MAE on Fashion-MNIST with attention distance / collapse logged per layer.
_base_ = ['mmae_fmnist.py', '_attention_locality_hook.py']

# The hook lives in mmae_plugin.engine, which `import mmae_plugin` does not
# load; import it explicitly. custom_hooks replaces the base list, so the
# runtime's ReseedHook is restated.
custom_imports = dict(
    imports=['mmae_plugin', 'mmae_plugin.engine'], allow_failed_imports=False)
custom_hooks = [
    dict(type='ReseedHook'),
    {{_base_.attention_locality_hook}},
]
