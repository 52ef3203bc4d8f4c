"""FAIR MAE / timm ViT checkpoints converted to mmpretrain give the same
features: timm's own VisionTransformer (and a FAIR-style MAE decoder made of
timm blocks) against mmpretrain's VisionTransformer / MAE loaded from the
converted file."""
import argparse
import functools
import importlib.util
import os.path as osp
import subprocess
import sys

import pytest
import torch
from torch import nn

timm_vit = pytest.importorskip('timm.models.vision_transformer')

from mmpretrain.registry import MODELS  # noqa: E402

import mmae_plugin  # noqa: F401,E402

CONVERTER = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
                     'model_converters', 'mae_to_mmpretrain.py')
EMBED, DEPTH, HEADS, PATCH, IMG = 64, 2, 4, 4, 32
DEC_EMBED, DEC_DEPTH, DEC_HEADS = 32, 2, 4
NUM_PATCHES = (IMG // PATCH)**2
ARCH = dict(embed_dims=EMBED, num_layers=DEPTH, num_heads=HEADS,
            feedforward_channels=4 * EMBED)
TOL = dict(rtol=1e-5, atol=1e-5)


def load_converter():
    spec = importlib.util.spec_from_file_location('mae_to_mmpretrain', CONVERTER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FairMAEDecoder(nn.Module):
    """FAIR MAE's decoder, with FAIR's attribute names, from timm blocks."""

    def __init__(self):
        super().__init__()
        self.mask_token = nn.Parameter(torch.randn(1, 1, DEC_EMBED))
        self.decoder_pos_embed = nn.Parameter(
            torch.randn(1, NUM_PATCHES + 1, DEC_EMBED))
        self.decoder_embed = nn.Linear(EMBED, DEC_EMBED)
        self.decoder_blocks = nn.ModuleList(
            timm_vit.Block(DEC_EMBED, DEC_HEADS, mlp_ratio=4, qkv_bias=True,
                           norm_layer=functools.partial(nn.LayerNorm, eps=1e-6))
            for _ in range(DEC_DEPTH))
        self.decoder_norm = nn.LayerNorm(DEC_EMBED, eps=1e-6)
        self.decoder_pred = nn.Linear(DEC_EMBED, PATCH**2 * 3)

    def forward(self, latent, ids_restore):
        x = self.decoder_embed(latent)
        masked = ids_restore.shape[1] + 1 - x.shape[1]
        x_ = torch.cat([x[:, 1:], self.mask_token.repeat(len(x), masked, 1)], 1)
        x_ = torch.gather(x_, 1, ids_restore[..., None].expand(-1, -1, x.shape[2]))
        x = torch.cat([x[:, :1], x_], 1) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]


def randomise(module):
    """Random values everywhere, LayerNorm affines included."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return module.eval()


def fair_masked_encoder(vit, images, ids_restore):
    """FAIR MAE's forward_encoder on timm's ViT, keeping the given patches."""
    x = vit.patch_embed(images) + vit.pos_embed[:, 1:]
    keep = NUM_PATCHES - int(NUM_PATCHES * 0.75)
    ids_keep = torch.argsort(ids_restore, dim=1)[:, :keep]
    x = torch.gather(x, 1, ids_keep[..., None].expand(-1, -1, x.shape[2]))
    cls = (vit.cls_token + vit.pos_embed[:, :1]).expand(len(x), -1, -1)
    x = torch.cat([cls, x], 1)
    for block in vit.blocks:
        x = block(x)
    return vit.norm(x)


@pytest.fixture(scope='module')
def fair_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    vit = randomise(timm_vit.VisionTransformer(
        img_size=IMG, patch_size=PATCH, embed_dim=EMBED, depth=DEPTH,
        num_heads=HEADS, mlp_ratio=4, qkv_bias=True, num_classes=10))
    decoder = randomise(FairMAEDecoder())
    path = tmp_path_factory.mktemp('fair') / 'checkpoint-199.pth'
    # As FAIR's main_pretrain.py saves it, arguments included.
    torch.save({'model': {**vit.state_dict(), **decoder.state_dict()},
                'epoch': 199, 'args': argparse.Namespace(model='tiny')}, path)
    return vit, decoder, path


@pytest.fixture(scope='module')
def converted(fair_checkpoint, tmp_path_factory):
    *_, src = fair_checkpoint
    dst = tmp_path_factory.mktemp('mm') / 'converted.pth'
    proc = subprocess.run([sys.executable, CONVERTER, str(src), str(dst)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'backbone, head, neck' in proc.stdout
    return dst


def report(name, ours, reference):
    diff = (ours - reference).abs().max().item()
    print(f'{name}: max |mmpretrain - timm| = {diff:.3g}')
    torch.testing.assert_close(ours, reference, **TOL)


def test_encoder_features_equal_through_pretrained_init(fair_checkpoint,
                                                        converted):
    vit, *_ = fair_checkpoint
    backbone = MODELS.build(dict(
        type='VisionTransformer', arch=ARCH, img_size=IMG, patch_size=PATCH,
        out_type='raw', final_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=str(converted),
                      prefix='backbone.')))
    images = torch.randn(4, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))
    backbone.eval()  # (mmpretrain's ViT.train returns None)
    with torch.no_grad():
        # Control: before loading, the features differ.
        assert (backbone(images)[0] - vit.forward_features(images)).abs().max() > 0.1
    backbone.init_weights()  # mmengine's loader, weights_only=True
    with torch.no_grad():
        report('encoder tokens', backbone(images)[0],
               vit.forward_features(images))


def test_classifier_logits_equal(fair_checkpoint, converted):
    vit, *_ = fair_checkpoint
    classifier = MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='VisionTransformer', arch=ARCH, img_size=IMG,
                      patch_size=PATCH, out_type='cls_token'),
        head=dict(type='VisionTransformerClsHead', num_classes=10,
                  in_channels=EMBED)))
    classifier.eval()
    state = torch.load(converted, weights_only=True)['state_dict']
    state = {k: v for k, v in state.items() if not k.startswith('neck.')}
    assert not classifier.load_state_dict(state, strict=False).missing_keys
    images = torch.randn(4, 3, IMG, IMG, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        report('logits', classifier(images, mode='tensor'), vit(images))


def test_mae_encoder_and_decoder_equal(fair_checkpoint, converted):
    vit, decoder, _ = fair_checkpoint
    mae = MODELS.build(dict(
        type='MAE',
        backbone=dict(type='MAEViT', arch=ARCH, img_size=IMG, patch_size=PATCH,
                      mask_ratio=0.75),
        neck=dict(type='MAEPretrainDecoder', num_patches=NUM_PATCHES,
                  patch_size=PATCH, in_chans=3, embed_dim=EMBED,
                  decoder_embed_dim=DEC_EMBED, decoder_depth=DEC_DEPTH,
                  decoder_num_heads=DEC_HEADS),
        head=dict(type='MAEPretrainHead', patch_size=PATCH,
                  loss=dict(type='PixelReconstructionLoss', criterion='L2'))))
    state = torch.load(converted, weights_only=True)['state_dict']
    state = {k: v for k, v in state.items() if not k.startswith('head.')}
    mae.load_state_dict(state, strict=True)
    mae.eval()
    images = torch.randn(4, 3, IMG, IMG, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(4)
    with torch.no_grad():
        latent, _, ids_restore = mae.backbone(images, mask=True)
        report('masked encoder', latent,
               fair_masked_encoder(vit, images, ids_restore))
        report('decoder', mae.neck(latent, ids_restore),
               decoder(latent, ids_restore))


def test_unknown_keys_and_formats_are_refused(tmp_path):
    converter = load_converter()
    assert converter.rename_key('module.blocks.1.mlp.fc2.bias'.split(
        'module.')[1]) == 'backbone.layers.1.ffn.layers.1.bias'
    with pytest.raises(KeyError, match="key='blocks.0.ls1.gamma'"):
        converter.convert_state_dict({'blocks.0.ls1.gamma': torch.ones(2)})
    with pytest.raises(ValueError, match="checkpoint fields \\['epoch'\\]"):
        converter.extract_state_dict({'epoch': 3})
