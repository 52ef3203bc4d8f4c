# knn_fmnist.py (k = 20, cosine, votes weighted by exp(cos / 0.07); the
# 60,000 training images are the neighbours) on the Siamese configs'
# quarter-width ResNet-18, its last stage global-average-pooled (128-d),
# plus its matrix-information statistics. The evaluation config of the
# Siamese comparison (docs/siamese.md) and of:
#   python tools/test.py configs/fashion_mnist/knn_fmnist_resnet.py \
#       work_dirs/simclr_fmnist/epoch_10.pth
_base_ = ['knn_fmnist.py', '_siamese_/resnet18_quarter_arch.py']

model = dict(backbone=dict(_delete_=True, **_base_.backbone), pooling='mean')
