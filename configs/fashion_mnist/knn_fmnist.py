# kNN classification (k = 20, cosine, votes weighted by exp(cos / 0.07), as in
# InstDisc / DINO) of a Fashion-MNIST encoder's frozen CLS features, plus
# their matrix-information statistics. It trains nothing: the 60,000 training
# images are the neighbours, the 10,000 test images are classified.
#   python tools/test.py configs/fashion_mnist/knn_fmnist.py PRETRAINED.pth \
#       --out knn.json --out-item metrics
#   tools/dist_test.sh configs/fashion_mnist/knn_fmnist.py PRETRAINED.pth 2
# Mean-pooled patch tokens instead of the CLS token:
#   --cfg-options model.pooling=mean model.backbone.out_type=featmap
_base_ = [
    '_base_/vit-tiny-p4_arch.py',
    '_base_/fmnist_classification.py',
    '_base_/default_runtime.py',
]

model = dict(
    type='KNNClassifier',
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        out_type='cls_token',
        final_norm=True),
    pooling='cls',
    num_classes=10,
    k=20,
    temperature=0.07,
    prototype=dict(
        batch_size=500,
        num_workers=1,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='default_collate'),
        dataset=dict(
            type={{_base_.dataset_type}},
            data_root={{_base_.data_root}},
            split='train',
            pipeline={{_base_.test_pipeline}})))

test_evaluator = [
    dict(type='Accuracy', topk=(1, 5)),
    dict(type='RepresentationStatistics'),
]
test_cfg = dict()
# Nothing is trained or validated.
train_dataloader = None
val_dataloader = None
val_evaluator = None
