# kNN classification (k = 20, cosine, votes weighted by exp(cos / 0.07)) of
# the frozen, global-average-pooled last stage of the Siamese configs'
# quarter-width ResNet-18 (128 channels), plus its matrix-information
# statistics. The evaluation config of the Siamese comparison
# (docs/siamese.md) and of:
#   python tools/test.py configs/fashion_mnist/knn_fmnist_resnet.py \
#       work_dirs/simclr_fmnist/epoch_10.pth
_base_ = [
    '_base_/fmnist_classification.py',
    '_base_/default_runtime.py',
    '_siamese_/resnet18_quarter_arch.py',
]

model = dict(
    type='KNNClassifier',
    backbone={{_base_.backbone}},
    pooling='mean',
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
train_dataloader = None
val_dataloader = None
val_evaluator = None
