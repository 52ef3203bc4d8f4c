# Weighted kNN (k = 20, cosine, exp(cos / 0.07) votes, as in DINO) of an
# ImageNet ViT-B/16 pretrained with MAE, U-MAE or M-MAE: frozen CLS token after
# the final LayerNorm; the 1.28 M training images (test-time pipeline) are the
# neighbours, the 50,000 validation images are classified. Trains nothing.
# Data elsewhere: also set model.prototype.dataset.data_root.
#   tools/dist_test.sh configs/knn_vit-base.py PRETRAINED.pth 8 \
#       --out knn.json --out-item metrics
_base_ = 'linear_vit-base_90e.py'

model = dict(
    _delete_=True,
    type='KNNClassifier',
    backbone=dict(
        type='VisionTransformer',
        arch='base',
        img_size=224,
        patch_size=16,
        out_type='cls_token',
        final_norm=True),
    pooling='cls',
    num_classes=1000,
    k=20,
    temperature=0.07,
    prototype=dict(
        batch_size=256,
        num_workers=8,
        pin_memory=True,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='default_collate'),
        dataset=dict(
            type='ImageNet',
            data_root='data/imagenet',
            split='train',
            pipeline={{_base_.test_pipeline}})))

test_evaluator = [
    dict(type='Accuracy', topk=(1, 5)),
    dict(type='RepresentationStatistics'),
]
# Nothing is trained or validated.
train_dataloader = None
train_cfg = None
optim_wrapper = None
param_scheduler = None
val_dataloader = None
val_cfg = None
val_evaluator = None
