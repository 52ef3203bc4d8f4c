# M-MAE ViT-L/16, 200 epochs on ImageNet-1K (paper Table 1: linear 66.0,
# fine-tune 84.3): as the ViT-B recipe with mu = 3. See mmae_vit-base_200e.py
# for why the weight is 0.01 / 8 with the exact gather.
#   tools/dist_train.sh configs/mmae_vit-large_200e.py 8
_base_ = 'mmae_vit-base_200e.py'

model = dict(
    backbone=dict(type='MAEViT', arch='l'),
    neck=dict(type='MAEPretrainDecoder', embed_dim=1024),
    regularizer=dict(mu=3.0))
