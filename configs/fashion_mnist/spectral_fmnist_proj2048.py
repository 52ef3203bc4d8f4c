# Spectral contrastive learning with a 2048-wide projector (hidden and output),
# Barlow Twins' width in the paper. Every method's joint entropy is
# bounded by ln d: 4.85 nats at d = 128 (spectral_fmnist.py), 7.62 at
# d = 2048. On 2 CPU cores a step costs 2.8x the 128-wide one (Barlow
# Twins, 1.17 s against 0.42 s) and a held-out measurement about 40 s, so
# the CPU width control (dev/section3_controls.sh,
# docs/siamese_controls.md) runs 512; this is the width for a GPU.
_base_ = ['spectral_fmnist.py']

model = dict(neck=dict(hid_channels=2048, out_channels=2048))

# A d x d covariance from B images has rank at most B - 1: the held-out
# batches hold 2048 images (2 of them, 4,096 test images), so the estimate
# is not rank-limited at d = 2048 as 256-image batches would be (ln 256 =
# 5.5 nats against the ceiling ln 2048 = 7.6). The training-batch values
# (256 images) stay rank-limited; every 50 iterations, since a 2048 x 2048
# eigendecomposition costs several steps.
custom_hooks = [
    dict(
        type='MatrixInfoHook',
        interval=50,
        kernel='covariance',
        heldout=dict(_base_.minfo_heldout, num_batches=2, batch_size=2048)),
    dict(type='DivergenceHook')
]
