# The Fashion-MNIST ViT (vit-tiny-p4_arch.py) as an ImageClassifier whose
# encoder loads a pretrained checkpoint's ``backbone.*`` weights:
#   --cfg-options model.backbone.init_cfg.checkpoint=PRETRAINED.pth
_base_ = ['vit-tiny-p4_arch.py']

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='VisionTransformer',
        arch={{_base_.vit_arch}},
        img_size={{_base_.img_size}},
        patch_size={{_base_.patch_size}},
        in_channels={{_base_.in_channels}},
        out_type='cls_token',
        final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint='', prefix='backbone.')),
    head=dict(
        type='VisionTransformerClsHead',
        num_classes=10,
        in_channels={{_base_.vit_arch.embed_dims}},
        loss=dict(type='CrossEntropyLoss')))
