# M-MAE ViT-L/16, 200 epochs, sharded with PyTorch FSDP through MMEngine's
# FlexibleRunner: the recipe of mmae_vit-large_200e.py (global batch 1024 =
# 8 GPUs x 128, mu = 3), with parameters, gradients and optimizer states
# sharded across GPUs. The wrap policy is mmpretrain's own ViT-L FSDP recipe
# (mae/benchmarks/vit-large-p16_8xb128-fsdp-coslr-50e_in1k.py): every
# submodule with at least 1e7 parameters gets its own FSDP unit.
#   tools/dist_train.sh configs/mmae_vit-large_200e_fsdp.py 8
_base_ = 'mmae_vit-large_200e.py'

runner_type = 'MMAEFlexibleRunner'
# MMAEFSDPStrategy is mmengine's FSDPStrategy with the plugin's FSDP fixes
# (resume's optimizer state load, per-rank seeds, full optimizer state on
# CPU hosts), acting only inside this strategy's own calls.
strategy = dict(
    type='MMAEFSDPStrategy',
    model_wrapper=dict(
        auto_wrap_policy=dict(
            type='torch.distributed.fsdp.wrap.size_based_auto_wrap_policy',
            min_num_params=1e7)))
# mmengine's FSDPStrategy switches to FSDP's sharded loss scaler only for a
# wrapper typed 'AmpOptimWrapper'; the float16 fallback of this recipe's
# MixedPrecisionOptimWrapper (bfloat16 needs no scaler) is told here.
optim_wrapper = dict(use_fsdp=True)
