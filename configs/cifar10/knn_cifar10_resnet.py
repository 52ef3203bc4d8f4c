# The frozen kNN evaluation of the CIFAR-10 Siamese configs (k = 20,
# cosine, votes weighted by exp(cos / 0.07); the 50,000 training images are
# the neighbours, the 10,000 test images are classified) on their ResNet-18
# (CIFAR stem), the last stage global-average-pooled (512-d), plus its
# matrix-information statistics. The evaluation config of
# dev/cifar10_campaign.sh, and of:
#   python tools/test.py configs/cifar10/knn_cifar10_resnet.py \
#       work_dirs/simclr_cifar10/epoch_200.pth
_base_ = ['mmpretrain::_base_/default_runtime.py']

custom_imports = dict(
    imports=['mmae_plugin.registration'], allow_failed_imports=False)
data_root = 'data/cifar10'
test_pipeline = [dict(type='PackInputs')]

model = dict(
    type='KNNClassifier',
    data_preprocessor=dict(
        type='ClsDataPreprocessor',
        mean=[125.307, 122.961, 113.8575],
        std=[51.5865, 50.847, 51.255],
        to_rgb=False),
    backbone=dict(type='ResNet_CIFAR', depth=18, norm_cfg=dict(type='BN')),
    pooling='mean',
    num_classes=10,
    k=20,
    temperature=0.07,
    prototype=dict(
        batch_size=500,
        num_workers=4,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='default_collate'),
        dataset=dict(
            type='CIFAR10',
            data_root=data_root,
            split='train',
            download=False,
            pipeline=test_pipeline)))

test_dataloader = dict(
    batch_size=500,
    num_workers=4,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type='CIFAR10',
        data_root=data_root,
        split='test',
        download=False,
        pipeline=test_pipeline))
test_evaluator = [
    dict(type='Accuracy', topk=(1, 5)),
    dict(type='RepresentationStatistics'),
]
test_cfg = dict()
train_dataloader = None
val_dataloader = None
val_evaluator = None
