# Fragment (not runnable on its own): the AttentionLocalityHook settings
# shared by every Fashion-MNIST config that measures attention locality.
# All of them probe the same 64 un-augmented training images, so MAE, M-MAE
# and contrastive models of the same size are compared on identical inputs.
# mmengine forbids one key in two sibling bases, so this file only defines a
# variable; including configs add it with
# `default_hooks = dict(
#      attention_locality={{_base_.attention_locality_hook}})`.
attention_locality_hook = dict(
    type='AttentionLocalityHook',
    interval=1,
    num_probe_images=64,
    probe_at_start=True,
    probe_pipeline=[dict(type='PackInputs')])
