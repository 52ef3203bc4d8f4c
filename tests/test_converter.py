"""FAIR MAE / timm ViT checkpoints converted to mmpretrain give the same
features: timm's own VisionTransformer (and a FAIR-style MAE decoder made of
timm blocks) against mmpretrain's VisionTransformer / MAE loaded from the
converted file."""
import argparse
import functools
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from torch import nn

timm_vit = pytest.importorskip('timm.models.vision_transformer')

from _helpers_scripts import load_script  # noqa: E402
from checkpoint_payloads import ExecPayload, SystemPayload  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmpretrain.registry import MODELS  # noqa: E402

import mmae_plugin.registration  # noqa: F401,E402

CONVERTER = osp.join(
    osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools',
    'model_converters', 'mae_to_mmpretrain.py')
EMBED, DEPTH, HEADS, PATCH, IMG = 64, 2, 4, 4, 32
DEC_EMBED, DEC_DEPTH, DEC_HEADS = 32, 2, 4
NUM_PATCHES = (IMG // PATCH)**2
ARCH = dict(
    embed_dims=EMBED,
    num_layers=DEPTH,
    num_heads=HEADS,
    feedforward_channels=4 * EMBED)
TOL = dict(rtol=1e-5, atol=1e-5)


def load_converter():
    return load_script('tools/model_converters/mae_to_mmpretrain.py')


class FairMAEDecoder(nn.Module):
    """FAIR MAE's decoder, with FAIR's attribute names, from timm blocks."""

    def __init__(self):
        super().__init__()
        self.mask_token = nn.Parameter(torch.randn(1, 1, DEC_EMBED))
        self.decoder_pos_embed = nn.Parameter(
            torch.randn(1, NUM_PATCHES + 1, DEC_EMBED))
        self.decoder_embed = nn.Linear(EMBED, DEC_EMBED)
        self.decoder_blocks = nn.ModuleList(
            timm_vit.Block(
                DEC_EMBED,
                DEC_HEADS,
                mlp_ratio=4,
                qkv_bias=True,
                norm_layer=functools.partial(nn.LayerNorm, eps=1e-6))
            for _ in range(DEC_DEPTH))
        self.decoder_norm = nn.LayerNorm(DEC_EMBED, eps=1e-6)
        self.decoder_pred = nn.Linear(DEC_EMBED, PATCH**2 * 3)

    def forward(self, latent, ids_restore):
        x = self.decoder_embed(latent)
        masked = ids_restore.shape[1] + 1 - x.shape[1]
        x_ = torch.cat(
            [x[:, 1:], self.mask_token.repeat(len(x), masked, 1)], 1)
        x_ = torch.gather(x_, 1, ids_restore[...,
                                             None].expand(-1, -1, x.shape[2]))
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
    vit = randomise(
        timm_vit.VisionTransformer(
            img_size=IMG,
            patch_size=PATCH,
            embed_dim=EMBED,
            depth=DEPTH,
            num_heads=HEADS,
            mlp_ratio=4,
            qkv_bias=True,
            num_classes=10))
    decoder = randomise(FairMAEDecoder())
    path = tmp_path_factory.mktemp('fair') / 'checkpoint-199.pth'
    # As FAIR's main_pretrain.py saves it, arguments included.
    torch.save(
        {
            'model': {
                **vit.state_dict(),
                **decoder.state_dict()
            },
            'epoch': 199,
            'args': argparse.Namespace(model='tiny')
        }, path)
    return vit, decoder, path


@pytest.fixture(scope='module')
def converted(fair_checkpoint, tmp_path_factory):
    *_, src = fair_checkpoint
    dst = tmp_path_factory.mktemp('mm') / 'converted.pth'
    proc = subprocess.run(
        [sys.executable, CONVERTER,
         str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'backbone, head, neck' in proc.stdout
    return dst


def report(name, ours, reference):
    diff = (ours - reference).abs().max().item()
    print(f'{name}: max |mmpretrain - timm| = {diff:.3g}')
    torch.testing.assert_close(ours, reference, **TOL)


def pretrained_backbone(checkpoint):
    """mmpretrain's ViT with its ``Pretrained`` init on ``checkpoint``'s
    ``backbone.`` weights (loaded by ``init_weights``)."""
    return MODELS.build(
        dict(
            type='VisionTransformer',
            arch=ARCH,
            img_size=IMG,
            patch_size=PATCH,
            out_type='raw',
            final_norm=True,
            init_cfg=dict(
                type='Pretrained',
                checkpoint=str(checkpoint),
                prefix='backbone.')))


def test_encoder_features_equal_through_pretrained_init(
        fair_checkpoint, converted):
    vit, *_ = fair_checkpoint
    backbone = pretrained_backbone(converted)
    images = torch.randn(
        4, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))
    backbone.eval()  # (mmpretrain's ViT.train returns None)
    with torch.no_grad():
        # Control: before loading, the features differ.
        assert (backbone(images)[0] -
                vit.forward_features(images)).abs().max() > 0.1
    backbone.init_weights()  # mmengine's loader, weights_only=True
    with torch.no_grad():
        report('encoder tokens',
               backbone(images)[0], vit.forward_features(images))


def test_classifier_logits_equal(fair_checkpoint, converted):
    vit, *_ = fair_checkpoint
    classifier = MODELS.build(
        dict(
            type='ImageClassifier',
            backbone=dict(
                type='VisionTransformer',
                arch=ARCH,
                img_size=IMG,
                patch_size=PATCH,
                out_type='cls_token'),
            head=dict(
                type='VisionTransformerClsHead',
                num_classes=10,
                in_channels=EMBED)))
    classifier.eval()
    state = torch.load(converted, weights_only=True)['state_dict']
    state = {k: v for k, v in state.items() if not k.startswith('neck.')}
    assert not classifier.load_state_dict(state, strict=False).missing_keys
    images = torch.randn(
        4, 3, IMG, IMG, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        report('logits', classifier(images, mode='tensor'), vit(images))


def test_mae_encoder_and_decoder_equal(fair_checkpoint, converted):
    vit, decoder, _ = fair_checkpoint
    mae = MODELS.build(
        dict(
            type='MAE',
            backbone=dict(
                type='MAEViT',
                arch=ARCH,
                img_size=IMG,
                patch_size=PATCH,
                mask_ratio=0.75),
            neck=dict(
                type='MAEPretrainDecoder',
                num_patches=NUM_PATCHES,
                patch_size=PATCH,
                in_chans=3,
                embed_dim=EMBED,
                decoder_embed_dim=DEC_EMBED,
                decoder_depth=DEC_DEPTH,
                decoder_num_heads=DEC_HEADS),
            head=dict(
                type='MAEPretrainHead',
                patch_size=PATCH,
                loss=dict(type='PixelReconstructionLoss', criterion='L2'))))
    state = torch.load(converted, weights_only=True)['state_dict']
    state = {k: v for k, v in state.items() if not k.startswith('head.')}
    mae.load_state_dict(state, strict=True)
    mae.eval()
    images = torch.randn(
        4, 3, IMG, IMG, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(4)
    with torch.no_grad():
        latent, _, ids_restore = mae.backbone(images, mask=True)
        report('masked encoder', latent,
               fair_masked_encoder(vit, images, ids_restore))
        report('decoder', mae.neck(latent, ids_restore),
               decoder(latent, ids_restore))


def test_unknown_keys_and_formats_are_refused(tmp_path):
    converter = load_converter()
    assert converter.rename_key('module.blocks.1.mlp.fc2.bias'.split('module.')
                                [1]) == 'backbone.layers.1.ffn.layers.1.bias'
    with pytest.raises(KeyError, match="key='blocks.0.ls1.gamma'"):
        converter.convert_state_dict({'blocks.0.ls1.gamma': torch.ones(2)})
    with pytest.raises(ValueError, match="checkpoint fields \\['epoch'\\]"):
        converter.extract_state_dict({'epoch': 3})


# --------------------------------------------------------------------------
# mmengine checkpoints: loaded through the plugin's allow-list; crafted
# ones refused without running anything
# --------------------------------------------------------------------------
class FairNamedViT(BaseModel):
    """timm's ViT trained in mmengine, its parameters under FAIR's names.

    The ViT's children and tokens are this model's own attributes, so the
    Runner's checkpoint holds ``blocks.0.norm1.weight``, ``head.weight``, ...
    exactly as FAIR's and timm's state dicts do.
    """

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        vit = timm_vit.VisionTransformer(
            img_size=IMG,
            patch_size=PATCH,
            embed_dim=EMBED,
            depth=DEPTH,
            num_heads=HEADS,
            mlp_ratio=4,
            qkv_bias=True,
            num_classes=10)
        for name, child in vit.named_children():
            setattr(self, name, child)
        self.cls_token, self.pos_embed = vit.cls_token, vit.pos_embed
        self._vit = [vit]  # the same modules, run by timm's forward

    @property
    def vit(self):
        return self._vit[0]

    def forward(self, inputs, labels=None, mode='tensor'):
        logits = self.vit(torch.stack(inputs))
        if mode == 'loss':
            return dict(
                loss=nn.functional.cross_entropy(logits, torch.stack(labels)))
        return logits


class RandomImages(torch.utils.data.Dataset):

    def __len__(self):
        return 4

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return dict(
            inputs=torch.randn(3, IMG, IMG, generator=generator),
            labels=torch.tensor(index % 10))


@pytest.fixture(scope='module')
def runner_checkpoint(tmp_path_factory):
    """``epoch_1.pth`` of a real Runner run, and the trained timm ViT."""
    from mmengine.runner import Runner
    work_dir = tmp_path_factory.mktemp('runner')
    runner = Runner(
        model=FairNamedViT(),
        work_dir=str(work_dir),
        experiment_name='converter_runner_checkpoint',
        train_dataloader=dict(
            dataset=RandomImages(),
            batch_size=2,
            sampler=dict(type='DefaultSampler', shuffle=False),
            num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-2)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
        log_level='WARNING')
    runner.train()
    return work_dir / 'epoch_1.pth', runner.model.vit.eval()


def run_converter(src, dst):
    """The command in a process of its own (imports torch and mmengine:
    several seconds each)."""
    return subprocess.run(
        [sys.executable, CONVERTER,
         str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=300)


def run_converter_here(src, dst, monkeypatch, capsys):
    """The command's ``main`` in this process, as the command line calls it
    (its ``sys.argv``); the outcome as :func:`run_converter` gives it."""
    monkeypatch.setattr(sys, 'argv', [CONVERTER, str(src), str(dst)])
    capsys.readouterr()
    returncode = load_converter().main()
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(sys.argv, returncode, out, err)


def test_runner_checkpoint_needs_the_allow_list(runner_checkpoint):
    """Control: the file really holds what plain weights_only refuses."""
    path, _ = runner_checkpoint
    proc = subprocess.run([
        sys.executable, '-c', 'import sys, torch; '
        'torch.load(sys.argv[1], weights_only=True)',
        str(path)
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert 'HistoryBuffer' in proc.stderr, proc.stderr[-2000:]
    checkpoint = torch.load(path, weights_only=True)  # plugin imported here
    buffer = checkpoint['message_hub']['log_scalars']['train/loss']
    assert type(buffer).__name__ == 'HistoryBuffer'
    assert buffer.data[0].dtype.kind == 'f'  # numpy arrays inside
    assert {'optimizer', 'meta', 'state_dict'} <= set(checkpoint)


def test_converter_converts_runner_checkpoint(runner_checkpoint, tmp_path):
    path, vit = runner_checkpoint
    dst = tmp_path / 'converted.pth'
    proc = run_converter(path, dst)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'backbone, head' in proc.stdout
    backbone = pretrained_backbone(dst)
    backbone.init_weights()
    backbone.eval()
    images = torch.randn(
        2, 3, IMG, IMG, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        # The trained weights, not the initial ones, were converted.
        assert (FairNamedViT().vit.eval().forward_features(images) -
                vit.forward_features(images)).abs().max() > 1e-3
        report('trained encoder tokens',
               backbone(images)[0], vit.forward_features(images))


@pytest.mark.parametrize('payload', [SystemPayload, ExecPayload])
@pytest.mark.parametrize('where', ['args', 'message_hub'])
def test_converter_refuses_crafted_checkpoint(fair_checkpoint, tmp_path,
                                              payload, where, monkeypatch,
                                              capsys):
    """FAIR weights next to a payload, where FAIR / mmengine keep extras
    (one case through the command, the others through its ``main``)."""
    vit, decoder, _ = fair_checkpoint
    weights = {**vit.state_dict(), **decoder.state_dict()}
    marker = tmp_path / 'PWNED'
    if where == 'args':
        crafted = {'model': weights, 'epoch': 1, 'args': payload(marker)}
    else:
        crafted = {
            'state_dict': weights,
            'meta': {
                'epoch': 1
            },
            'message_hub': {
                'runtime_info': {
                    'x': payload(marker)
                }
            }
        }
    src, dst = tmp_path / 'crafted.pth', tmp_path / 'out.pth'
    torch.save(crafted, src)
    if where == 'args' and payload is SystemPayload:
        proc = run_converter(src, dst)
    else:
        proc = run_converter_here(src, dst, monkeypatch, capsys)
    assert proc.returncode != 0
    assert f'src={str(src)!r} was refused under weights_only' in proc.stderr
    assert 'UnpicklingError' in proc.stderr
    assert not marker.exists(), 'the crafted checkpoint ran code'
    assert not dst.exists()


# --------------------------------------------------------------------------
# malformed input: a named error saying what was found and what is expected
# --------------------------------------------------------------------------
def error_lines(stderr):
    """The command's own lines (mmcv's import warnings left out)."""
    return [line for line in stderr.splitlines() if 'error: ' in line]


#: (checkpoint, what the error says was found, run through the command too)
MALFORMED = [
    ([torch.ones(2)], 'the checkpoint is a list of 1 items', True),
    (torch.ones(2), 'the checkpoint is a Tensor of 2 items', False),
    (None, 'the checkpoint is a NoneType', False),
    ({
        0: torch.ones(2),
        1: torch.ones(2)
    }, 'the checkpoint has the int key 0', True),
    ({
        'model': {
            0: torch.ones(2)
        }
    }, "field 'model' has the int key 0", True),
    ({
        'model': [torch.ones(2)]
    }, "field 'model' is a list of 1 items", False),
    ({
        'state_dict': {}
    }, "field 'state_dict' is a dict of 0 items", False),
    ({
        'state_dict': {
            'norm.weight': 'text'
        }
    }, "field 'state_dict' holds a str of 4 items under 'norm.weight'", False),
    ({
        1: 'a',
        'b': 2
    }, "checkpoint fields [1, 'b'] hold no state dict", False),
]


@pytest.mark.parametrize('checkpoint,found,command', MALFORMED)
def test_malformed_checkpoints_get_a_named_error(tmp_path, checkpoint, found,
                                                 command, monkeypatch, capsys):
    """Through the API, and (three of them) the command's ``main`` (the
    first in a process of its own): one line, exit 1, nothing written."""
    converter = load_converter()
    with pytest.raises(converter.MalformedCheckpointError) as error:
        converter.extract_state_dict(checkpoint)
    assert str(error.value).startswith(found)
    assert 'expected a dict of str keys to tensors' in str(error.value)
    if not command:
        return
    src, dst = tmp_path / 'bad.pth', tmp_path / 'out.pth'
    torch.save(checkpoint, src)
    proc = run_converter(src, dst) if found == MALFORMED[0][1] else \
        run_converter_here(src, dst, monkeypatch, capsys)
    assert proc.returncode == 1
    assert f'error: MalformedCheckpointError: {found}' in proc.stderr
    assert 'Traceback' not in proc.stderr
    assert len(error_lines(proc.stderr)) == 1, proc.stderr
    assert not dst.exists()


@pytest.mark.parametrize('content', [b'', b'not a checkpoint', b'PK\x03\x04'])
def test_files_that_are_not_checkpoints_are_named(tmp_path, content,
                                                  monkeypatch, capsys):
    src, dst = tmp_path / 'junk.pth', tmp_path / 'out.pth'
    src.write_bytes(content)
    proc = run_converter_here(src, dst, monkeypatch, capsys)
    assert proc.returncode == 1
    assert f'src={str(src)!r}' in proc.stderr, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert not dst.exists()


def test_keys_colliding_after_stripping_module_name_both(
        tmp_path, monkeypatch, capsys):
    converter = load_converter()
    weights = {
        'norm.weight': torch.ones(2),
        'module.norm.weight': torch.zeros(2)
    }
    with pytest.raises(converter.KeyCollisionError) as error:
        converter.convert_state_dict(weights)
    message = str(error.value)
    assert "'norm.weight' and 'module.norm.weight' both become " \
        "'backbone.ln1.weight'" in message
    # Two wrapper prefixes on one key and one on the other collide too.
    with pytest.raises(converter.KeyCollisionError, match='_orig_mod.module'):
        converter.convert_state_dict({
            'module.cls_token':
            torch.ones(1),
            '_orig_mod.module.cls_token':
            torch.ones(1)
        })
    src, dst = tmp_path / 'ddp_and_raw.pth', tmp_path / 'out.pth'
    torch.save({'model': weights}, src)
    proc = run_converter_here(src, dst, monkeypatch, capsys)
    assert proc.returncode == 1
    assert "KeyCollisionError: keys 'norm.weight' and 'module.norm.weight'" \
        in proc.stderr
    assert not dst.exists()
    # Control: the prefix alone is stripped without complaint.
    assert list(
        converter.convert_state_dict({'module.norm.weight': torch.ones(2)
                                      })) == ['backbone.ln1.weight']


@pytest.mark.parametrize('how',
                         ['same path', 'relative', 'symlink', 'hard link'])
def test_dst_equal_to_src_is_refused_before_anything_is_written(
        fair_checkpoint, tmp_path, how, monkeypatch, capsys):
    *_, original = fair_checkpoint
    src = tmp_path / 'checkpoint.pth'
    src.write_bytes(original.read_bytes())
    before = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    dst = {
        'same path': src,
        'relative': './checkpoint.pth',
        'symlink': tmp_path / 'link.pth',
        'hard link': tmp_path / 'hard.pth'
    }[how]
    if how == 'symlink':
        (tmp_path / 'link.pth').symlink_to(src)
    if how == 'hard link':
        os.link(src, tmp_path / 'hard.pth')
    proc = run_converter(src, dst) if how == 'same path' else \
        run_converter_here(dst=dst, src=src, monkeypatch=monkeypatch,
                           capsys=capsys)
    assert proc.returncode == 2, proc.stderr
    assert 'is the source checkpoint' in proc.stderr
    assert 'converting would overwrite it' in proc.stderr
    assert 'Traceback' not in proc.stderr
    assert src.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({
        'checkpoint.pth', 'link.pth' if how == 'symlink' else
        'hard.pth' if how == 'hard link' else 'checkpoint.pth'
    })


def test_killed_conversion_leaves_the_previous_output_whole(
        fair_checkpoint, tmp_path):
    """SIGKILL in the middle of torch.save: DST keeps its old bytes (the
    write goes to a temporary renamed over DST after fsync); the next run
    removes the dead writer's temporary, replaces DST (a new inode) and
    drops its stale checksum sidecar."""
    *_, src = fair_checkpoint
    dst = tmp_path / 'converted.pth'
    dst.write_bytes(b'previous output')
    sidecar = tmp_path / '.converted.pth.sha256'
    sidecar.write_text('0' * 64 + '  converted.pth\n')
    killer = ('import os, signal, sys\n'
              'sys.path.insert(0, sys.argv[1])\n'
              'from _helpers_scripts import load_script\n'
              'converter = load_script("tools/model_converters/'
              'mae_to_mmpretrain.py")\n'
              'def half_a_save(obj, file):\n'
              '    file.write(b"PK half a zip")\n'
              '    file.flush()\n'
              '    os.kill(os.getpid(), signal.SIGKILL)\n'
              'converter.torch.save = half_a_save\n'
              'converter.convert_file(sys.argv[2], sys.argv[3])\n')
    proc = subprocess.run([
        sys.executable, '-c', killer,
        osp.dirname(osp.abspath(__file__)),
        str(src),
        str(dst)
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert dst.read_bytes() == b'previous output'
    temporaries = [p.name for p in tmp_path.iterdir() if p.suffix == '.tmp']
    assert len(temporaries) == 1 and temporaries[0].startswith(
        '.converted.pth.'), temporaries
    old_inode = dst.stat().st_ino
    proc = run_converter(src, dst)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ['converted.pth']
    assert dst.stat().st_ino != old_inode
    assert 'backbone.ln1.weight' in torch.load(dst)['state_dict']
