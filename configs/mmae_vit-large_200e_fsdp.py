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
# CPU hosts), acting only inside this strategy's own calls. The initial
# weights are rank 0's at any world size (mmengine broadcasts them after
# init_weights), so sync_module_states stays off.
# mixed_precision: FSDP gathers each unit's parameters in bfloat16 (half
# float32's bytes) and computes with them under the optim_wrapper's
# bfloat16 autocast (the strategy refuses a param_dtype other than
# optim_wrapper.dtype); the float32 shards stay the optimizer's weights.
# Gradients are reduce-scattered in float32: a mean over ranks of gradients
# that largely cancel would lose its low bits if each rank's term were first
# rounded to bfloat16 (8-bit mantissa), and this recipe is for when memory,
# not bandwidth, binds. Traffic per rank and step: (N-1)/N * (2 + 2 + 4) *
# P bytes, DDP's all-reduce 2 (N-1)/N * 4 P: the same, instead of 1.5x in
# float32 (docs/gpu_clusters.md#fsdp). Buffers stay float32.
# cast_root_forward_inputs=False: the preprocessed images reach the model in
# float32 (FSDP's default casts them to param_dtype at the root) and meet
# bfloat16 only in the autocast ops (the patch embedding), so MAE's
# normalised-pixel target is built from float32 pixels, as under DDP. The
# strategy refuses it without the optim_wrapper's autocast.
strategy = dict(
    type='MMAEFSDPStrategy',
    model_wrapper=dict(
        auto_wrap_policy=dict(
            type='torch.distributed.fsdp.wrap.size_based_auto_wrap_policy',
            min_num_params=1e7),
        mixed_precision=dict(
            param_dtype='bfloat16',
            reduce_dtype='float32',
            buffer_dtype='float32',
            cast_root_forward_inputs=False)))
# mmengine's FSDPStrategy switches to FSDP's sharded loss scaler only for a
# wrapper typed 'AmpOptimWrapper'; the float16 fallback of this recipe's
# MixedPrecisionOptimWrapper (bfloat16 needs no scaler) is told here. On
# GPUs without bfloat16 set both dtypes: --cfg-options
# optim_wrapper.dtype=float16
# strategy.model_wrapper.mixed_precision.param_dtype=float16
optim_wrapper = dict(use_fsdp=True)
