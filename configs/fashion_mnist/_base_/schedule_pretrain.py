# AdamW with MAE's parameter-wise decay rules; short cosine schedule.
# MergedGroupsOptimWrapperConstructor: mmengine's constructor, then the 84
# one-tensor parameter groups it makes here merged into the 2 distinct ones
# (decay / no decay); exact under every param scheduler.
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='MergedGroupsOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1.5e-4 * 256 / 256 * 10, betas=(0.9, 0.95),
        weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'ln': dict(decay_mult=0.0),
            'bias': dict(decay_mult=0.0),
            'pos_embed': dict(decay_mult=0.),
            'mask_token': dict(decay_mult=0.),
            'cls_token': dict(decay_mult=0.)
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=4, by_epoch=True, begin=1, end=5,
         convert_to_iter_based=True),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=5)
# The lr above is for a total batch of 256 (1 process x 256); --auto-scale-lr
# rescales it linearly for other totals.
auto_scale_lr = dict(base_batch_size=256)
