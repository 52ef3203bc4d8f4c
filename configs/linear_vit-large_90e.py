# Linear probe of a ViT-L/16 pretrained with MAE, U-MAE or M-MAE (see
# linear_vit-base_90e.py).
_base_ = 'mmpretrain::mae/benchmarks/vit-large-p16_8xb2048-linear-coslr-90e_in1k.py'

custom_imports = dict(imports=['mmae_plugin'], allow_failed_imports=False)

train_dataloader = dict(batch_size=1024)
# bfloat16 autocast for the frozen encoder (see mae_vit-base_200e.py; on
# GPUs without bfloat16: --cfg-options optim_wrapper.dtype=float16).
optim_wrapper = dict(
    type='MixedPrecisionOptimWrapper', loss_scale='auto',  # no scaler in bf16
    dtype='bfloat16', optimizer=dict(lr=0.1 * 8192 / 256))  # blr 0.1
auto_scale_lr = dict(base_batch_size=8192)
