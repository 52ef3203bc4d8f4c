# The Siamese configs' encoder, shared with their kNN evaluation: ResNet-18
# at 1/4 width (stem 16, stages 16-32-64-128 channels). The stride-2 stem
# and max-pool bring 28 x 28 to 7 x 7, which keeps a step at about 0.5 s on
# 2 CPU cores (a CIFAR-style stem at full resolution costs 10x more). BN
# instead of the SyncBN of mmpretrain's ImageNet recipes: SyncBN has no CPU
# kernel; on GPUs switch back to SyncBN.
backbone = dict(
    type='ResNet',
    depth=18,
    in_channels=1,
    stem_channels=16,
    base_channels=16,
    norm_cfg=dict(type='BN'),
    zero_init_residual=True)
