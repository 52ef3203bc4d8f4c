"""MatrixInfoHook's default branches on every self-supervised algorithm.

For each of the 19 self-supervised algorithm classes of mmpretrain 1.2 the
test loads mmpretrain's own shipped pretraining config (``mmpretrain::``,
the smallest backbone; two more for the variants without a CLS token,
MAE-HiViT and iTPN with a CLIP target), shrinks it with
``--cfg-options``-style overrides (tiny backbones and decoders, 8 random
images of 64 x 64 pixels, batch 4, one epoch of 2 iterations, no checkpoint,
no download, no CUDA autocast), adds the plugin and
``MatrixInfoHook(interval=1)`` to its own custom hooks, and trains it with
the real mmengine ``Runner``. The hook must tap the branches
docs/matrix_info.md lists and log every one- or two-branch quantity at both
iterations. MaskFeat keeps its 224 x 224 views: its ``HOGGenerator``
assumes 14 x 14 patches.

Offline stand-ins (the configs would download pretrained teachers): BEiT v1
and CAE's DALL-E tokenizer and BEiT v2's VQKD get ``init_cfg=None`` (random
weights of the same type, shrunk); the ``CLIPGenerator`` of MILAN, EVA and
iTPN-CLIP loads a randomly initialised tiny CLIP written to a temporary file
(same type, same ``build_clip_model`` path, no download). What the hook taps
never depends on the teacher's weights.
"""
import copy
import math
from types import SimpleNamespace
from typing import Dict, NamedTuple

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.hub import get_config
from mmengine.runner import Runner
from mmpretrain.registry import MODELS
from PIL import Image
from test_matrix_info_hook import (ONE_BRANCH_KEYS, TWO_BRANCH_KEYS,
                                   read_scalars)

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
from mmae_plugin.engine.monitoring.measure import two_branch_quantities
from mmae_plugin.engine.monitoring.taps import (first_tensor, select_rows,
                                                to_embeddings)

#: Images of the synthetic dataset, their size, the batch (2 iterations).
NUM_IMAGES, IMAGE_SIZE, BATCH = 8, 64, 4
#: Training pipeline of every config.
PIPE = 'train_dataloader.dataset.pipeline'
#: A 2-layer, 64-wide ViT for every ViT-based algorithm (patch 16: 4 x 4).
TINY_VIT = dict(
    embed_dims=64, num_layers=2, num_heads=2, feedforward_channels=128)
#: HiViT of iTPN and MAE-HiViT: 64 wide in its main stage, no CLS token.
TINY_HIVIT = dict(embed_dims=64, depths=[1, 1, 2], num_heads=2)
#: SimMIM's Swin and MixMIM's encoder: one block per stage, 16 wide.
TINY_SWIN = dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2])


def replacing(**values) -> dict:
    """A dict override that replaces the config's value (a named arch)."""
    return dict(_delete_=True, **values)


#: A tiny MAE-style decoder for 4 x 4 patches.
TINY_DECODER = dict(
    num_patches=16,
    embed_dim=64,
    decoder_embed_dim=32,
    decoder_depth=1,
    decoder_num_heads=2)
#: iTPN's decoder: the tiny one with a one-block, 32-wide pyramid.
ITPN_DECODER = dict(TINY_DECODER, fpn_dim=32, fpn_depth=1)
#: ResNet-18 instead of ResNet-50 (its last stage has 512 channels).
RESNET18 = {'model.backbone.depth': 18, 'model.neck.in_channels': 512}
#: DALL-E tokenizer of BEiT v1 and CAE: random, narrow, 64 visual words.
TINY_DALLE = dict(
    type='DALL-E', n_hid=8, n_blk_per_group=1, vocab_size=64, init_cfg=None)
#: A 4 x 4 BEiT mask of 6 patches (the configs mask 75 of 14 x 14).
BEIT_MASK = dict(
    type='BEiTMaskGenerator',
    input_size=(4, 4),
    num_masking_patches=6,
    min_num_patches=2)
#: BEiT v2's and iTPN-CLIP's: exactly 6 patches.
BEIT_V2_MASK = dict(BEIT_MASK, max_num_patches=6)


def neck(call: int = 0, **spec) -> dict:
    """Expected branch: a ``neck`` call (Siamese projections)."""
    return dict(module='neck', call=call, **spec)


def encoder(pool: str, **spec) -> dict:
    """Expected branch: the masked encoder pass, pooled by ``pool``."""
    return {'module': 'backbone', 'pool': pool, **spec}


class Case(NamedTuple):
    """One algorithm: its config, the expected branches, the overrides."""
    config: str
    algorithm: str
    #: Keys of each branch the hook must tap by default (docs table).
    branches: tuple
    overrides: dict


CASES: Dict[str, Case] = {
    'mocov2':
    Case('mocov2/mocov2_resnet50_8xb32-coslr-200e_in1k.py', 'MoCo',
         (neck(), dict(module='encoder_k.module.1', call=0, rows='shuffled')),
         {
             **RESNET18, 'model.queue_len': 16,
             f'{PIPE}.1.transforms.0.0.scale': 32
         }),
    'mocov3':
    Case(
        'mocov3/mocov3_vit-small-p16_16xb256-amp-coslr-300e_in1k.py', 'MoCoV3',
        (neck(), dict(module='momentum_encoder', call=1)), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck.in_channels': 64,
            'model.neck.hid_channels': 128,
            'model.neck.out_channels': 64,
            'model.head.predictor.in_channels': 64,
            'model.head.predictor.hid_channels': 128,
            'model.head.predictor.out_channels': 64,
            f'{PIPE}.1.transforms.0.0.scale': IMAGE_SIZE,
            f'{PIPE}.1.transforms.1.0.scale': IMAGE_SIZE
        }),
    'simclr':
    Case(
        'simclr/simclr_resnet50_8xb32-coslr-200e_in1k.py', 'SimCLR',
        (neck(rows='even'), neck(rows='odd')), {
            **RESNET18, 'model.neck.hid_channels': 256,
            f'{PIPE}.1.transforms.0.0.scale': 32
        }),
    'byol':
    Case(
        'byol/byol_resnet50_16xb256-coslr-200e_in1k.py', 'BYOL',
        (neck(), dict(module='target_net', call=1)), {
            **RESNET18, 'model.neck.hid_channels': 256,
            'model.head.predictor.hid_channels': 256,
            f'{PIPE}.1.transforms.0.0.scale': 32,
            f'{PIPE}.1.transforms.1.0.scale': 32
        }),
    'barlowtwins':
    Case(
        'barlowtwins/barlowtwins_resnet50_8xb256-coslr-300e_in1k.py',
        'BarlowTwins', (neck(), neck(call=1)), {
            **RESNET18, 'model.neck.hid_channels': 256,
            'model.neck.out_channels': 256,
            'model.head.in_channels': 256,
            f'{PIPE}.1.transforms.0.0.scale': 32,
            f'{PIPE}.1.transforms.1.0.scale': 32
        }),
    'simsiam':
    Case(
        'simsiam/simsiam_resnet50_8xb32-coslr-100e_in1k.py', 'SimSiam',
        (neck(), neck(call=1)), {
            **RESNET18, 'model.neck.hid_channels': 256,
            'model.neck.out_channels': 256,
            'model.head.predictor.in_channels': 256,
            'model.head.predictor.hid_channels': 64,
            'model.head.predictor.out_channels': 256,
            f'{PIPE}.1.transforms.0.0.scale': 32
        }),
    'swav':
    Case(
        'swav/swav_resnet50_8xb32-mcrop-coslr-200e_in1k-224px-96px.py', 'SwAV',
        (neck(block=(0, 8)), neck(block=(1, 8))), {
            **RESNET18, 'model.neck.hid_channels': 256,
            'model.head.loss.num_prototypes': 64,
            'custom_hooks.0.batch_size': BATCH,
            f'{PIPE}.1.transforms.0.0.scale': 32,
            f'{PIPE}.1.transforms.1.0.scale': 16
        }),
    'densecl':
    Case(
        'densecl/densecl_resnet50_8xb32-coslr-200e_in1k.py', 'DenseCL',
        (neck(), dict(module='encoder_k.module.1', call=0, rows='shuffled')), {
            **RESNET18, 'model.queue_len': 16,
            'model.neck.hid_channels': 256,
            f'{PIPE}.1.transforms.0.0.scale': 32
        }),
    'mae':
    Case(
        'mae/mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py', 'MAE',
        (encoder('cls'), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': TINY_DECODER,
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    'mff':
    Case(
        'mff/mff_vit-base-p16_8xb512-amp-coslr-300e_in1k.py', 'MFF',
        (encoder('cls', module='backbone.layers.1'), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.backbone.out_indices': [0, 1],
            'model.neck': TINY_DECODER,
            f'{PIPE}.2.size': IMAGE_SIZE,
            f'{PIPE}.3.size': IMAGE_SIZE
        }),
    'simmim':
    Case(
        'simmim/simmim_swin-base-w6_8xb256-amp-coslr-100e_in1k-192px.py',
        'SimMIM', (encoder('mean', index=(-1, )), ), {
            'model.backbone.arch': replacing(**TINY_SWIN),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.backbone.stage_cfgs.block_cfgs.window_size': 2,
            'model.neck.in_channels': 128,
            f'{PIPE}.1.scale': IMAGE_SIZE,
            f'{PIPE}.3.input_size': IMAGE_SIZE
        }),
    'maskfeat':
    Case(
        'maskfeat/maskfeat_vit-base-p16_8xb256-amp-coslr-300e_in1k.py',
        'MaskFeat',
        (encoder('mean'), ),
        {
            # 224 x 224 views: HOGGenerator assumes 14 x 14 patches.
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.neck.in_channels': 64
        }),
    'mixmim':
    Case(
        'mixmim/mixmim_mixmim-base_16xb128-coslr-300e_in1k.py', 'MixMIM',
        (encoder('mean', index=(0, ), token_mask=1, extra_tokens=0), ), {
            'model.backbone.arch': replacing(**TINY_SWIN),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.backbone.window_size': [4, 4, 4, 2],
            'model.neck.num_patches': 4,
            'model.neck.embed_dim': 128,
            'model.neck.decoder_embed_dim': 32,
            'model.neck.decoder_depth': 1,
            'model.neck.decoder_num_heads': 2,
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    'beit':
    Case(
        'beit/beit_beit-base-p16_8xb256-amp-coslr-300e_in1k.py', 'BEiT',
        (encoder('mean', index=(-1, )), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.head.embed_dims': 64,
            'model.head.num_embed': 64,
            'model.target_generator': TINY_DALLE,
            f'{PIPE}.3.size': IMAGE_SIZE,
            f'{PIPE}.3.second_size': IMAGE_SIZE // 2,
            f'{PIPE}.4': BEIT_MASK
        }),
    'beitv2':
    Case(
        'beitv2/beitv2_beit-base-p16_8xb256-amp-coslr-300e_in1k.py', 'BEiT',
        (encoder('mean', index=(-1, )), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.backbone.out_indices': [0, 1],
            'model.neck.backbone_arch': replacing(**TINY_VIT, depth=2),
            'model.neck.early_layers': 1,
            'model.neck.num_layers': 1,
            'model.head.embed_dims': 64,
            'model.head.num_embed': 64,
            'model.target_generator.encoder_config.arch':
            replacing(**TINY_VIT),
            'model.target_generator.encoder_config.img_size': IMAGE_SIZE,
            'model.target_generator.num_embed': 64,
            'model.target_generator.init_cfg': None,
            f'{PIPE}.3.size': IMAGE_SIZE,
            f'{PIPE}.3.second_size': IMAGE_SIZE,
            f'{PIPE}.4': BEIT_V2_MASK
        }),
    'cae':
    Case(
        'cae/cae_beit-base-p16_8xb256-amp-coslr-300e_in1k.py', 'CAE',
        (encoder('mean'), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck.embed_dims': 64,
            'model.neck.num_heads': 2,
            'model.neck.regressor_depth': 1,
            'model.neck.decoder_depth': 1,
            'model.neck.num_classes': 64,
            'model.neck.mask_tokens_num': 6,
            'model.target_generator': TINY_DALLE,
            f'{PIPE}.2.size': IMAGE_SIZE,
            f'{PIPE}.2.second_size': IMAGE_SIZE // 2,
            f'{PIPE}.3': BEIT_MASK
        }),
    'milan':
    Case(
        'milan/milan_vit-base-p16_16xb256-amp-coslr-400e_in1k.py', 'MILAN',
        (encoder('cls'), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': dict(TINY_DECODER, predict_feature_dim=32),
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    'eva':
    Case(
        'eva/eva-mae-style_vit-base-p16_16xb256-coslr-400e_in1k.py', 'EVA',
        (encoder('cls'), ), {
            'model.backbone.arch': replacing(**TINY_VIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': dict(TINY_DECODER, predict_feature_dim=32),
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    'spark':
    Case(
        'spark/spark_sparse-resnet50_8xb512-amp-coslr-800e_in1k.py', 'SparK',
        (encoder('mean', index=(-1, )), ), {
            'model.backbone.depth': 18,
            'model.input_size': IMAGE_SIZE,
            'model.enc_dec_norm_dim': 512,
            'model.enc_dec_norm_cfg.type': 'SparseBatchNorm2d',
            'model.neck.feature_dim': 64,
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    'itpn':
    Case(
        'itpn/itpn-pixel_hivit-base-p16_8xb512-amp-coslr-400e_in1k.py', 'iTPN',
        (encoder('mean', index=(0, -1), extra_tokens=0), ), {
            'model.backbone.arch': replacing(**TINY_HIVIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': ITPN_DECODER,
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
    # Variants: iTPN with a CLIP target, MAE with HiViT (no CLS token).
    'itpn_clip':
    Case(
        'itpn/itpn-clip-b_hivit-base-p16_8xb256-amp-coslr-300e_in1k.py',
        'iTPN', (encoder('mean', index=(-1, ), extra_tokens=0), ), {
            'model.backbone.arch': replacing(**TINY_HIVIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': dict(ITPN_DECODER, decoder_embed_dim=64),
            'model.head.embed_dims': 64,
            'model.head.num_embed': 32,
            f'{PIPE}.3.size': IMAGE_SIZE,
            f'{PIPE}.3.second_size': IMAGE_SIZE,
            f'{PIPE}.4': BEIT_V2_MASK
        }),
    'mae_hivit':
    Case(
        'mae/mae_hivit-base-p16_8xb512-amp-coslr-400e_in1k.py', 'MAE',
        (encoder('mean', extra_tokens=0), ), {
            'model.backbone.arch': replacing(**TINY_HIVIT),
            'model.backbone.img_size': IMAGE_SIZE,
            'model.neck': TINY_DECODER,
            f'{PIPE}.1.scale': IMAGE_SIZE
        }),
}


@pytest.fixture(scope='module')
def image_folder(tmp_path_factory) -> str:
    """:func:`random_images` in a folder of their own."""
    return random_images(tmp_path_factory.mktemp('images'))


def random_images(folder) -> str:
    """Write 8 random 64 x 64 RGB PNG images into ``folder``; its path."""
    rng = np.random.default_rng(0)
    for index in range(NUM_IMAGES):
        pixels = rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
        Image.fromarray(pixels).save(folder / f'{index}.png')
    return str(folder)


def save_tiny_clip(path: str) -> str:
    """Save a randomly initialised tiny CLIP checkpoint, as CLIPGenerator
    loads it, to ``path``.

    ViT with 64-wide tokens, one layer, patches of 16 pixels at 64 x 64
    (the 4 x 4 grid of the tiny ViTs) and 32-dimensional outputs; the text
    tower is the smallest ``build_clip_model`` accepts.

    Returns:
        ``path``.
    """
    from mmpretrain.models.utils.clip_generator_helper import CLIP
    torch.manual_seed(0)
    clip = CLIP(
        embed_dim=32,
        image_resolution=IMAGE_SIZE,
        vision_layers=1,
        vision_width=64,
        vision_patch_size=16,
        context_length=4,
        vocab_size=8,
        transformer_width=64,
        transformer_heads=1,
        transformer_layers=1)
    torch.save(clip.state_dict(), path)
    return str(path)


def without_amp(optim_wrapper: dict) -> dict:
    """The config's optimizer wrapper without CUDA autocast (CPU test)."""
    if optim_wrapper.get('type') != 'AmpOptimWrapper':
        return optim_wrapper
    wrapper = {
        key: value
        for key, value in optim_wrapper.items()
        if key not in ('loss_scale', 'dtype')
    }
    return dict(wrapper, type='OptimWrapper', _delete_=True)


def shrunk_config(case: Case, work_dir: str, images: str, clip: str) -> Config:
    """The shipped config, shrunk to 2 CPU iterations with the hook."""
    cfg = get_config(f'mmpretrain::{case.config}')
    cfg.merge_from_dict(copy.deepcopy(case.overrides))
    if cfg.model.get('target_generator', {}).get('type') == 'CLIPGenerator':
        cfg.model.target_generator.tokenizer_path = clip
    pipeline = cfg.train_dataloader.dataset.pipeline
    cfg.train_dataloader = dict(
        batch_size=BATCH,
        num_workers=0,
        persistent_workers=False,
        drop_last=True,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='default_collate'),
        dataset=dict(
            type='CustomDataset',
            data_root=images,
            with_label=False,
            pipeline=pipeline))
    cfg.merge_from_dict(
        dict(
            work_dir=work_dir,
            custom_imports=dict(
                imports=['mmae_plugin.registration'],
                allow_failed_imports=False),
            custom_hooks=list(cfg.get('custom_hooks') or []) +
            [dict(type='MatrixInfoHook', interval=1)],
            train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=1),
            optim_wrapper=without_amp(cfg.optim_wrapper),
            default_hooks=dict(
                checkpoint=None, logger=dict(type='LoggerHook', interval=1)),
            resume=False,
            load_from=None,
            log_level='WARNING',
            randomness=dict(seed=0)))
    return cfg


def expected_keys(case: Case) -> tuple:
    return TWO_BRANCH_KEYS if len(case.branches) == 2 else ONE_BRANCH_KEYS


@pytest.mark.parametrize('name', list(CASES))
def test_default_branches_log_every_quantity(name, tmp_path, image_folder,
                                             tiny_clip):
    case = CASES[name]
    cfg = shrunk_config(case, str(tmp_path), image_folder, tiny_clip)
    runner = Runner.from_cfg(cfg)
    assert type(runner.model).__name__ == case.algorithm
    runner.train()

    hook = next(h for h in runner.hooks if isinstance(h, MatrixInfoHook))
    assert len(hook.branches) == len(case.branches)
    for spec, expected in zip(hook.branches, case.branches):
        assert {key: spec[key] for key in expected} == expected, spec
    keys = expected_keys(case)
    for key in keys:
        value = runner.message_hub.get_scalar(f'train/minfo/{key}').current()
        assert math.isfinite(value), (key, value)
    rows = [
        row for row in read_scalars(str(tmp_path)) if 'minfo/' + keys[0] in row
    ]
    assert [row['step'] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(row[f'minfo/{key}']) for key in keys), row


def test_every_self_supervised_algorithm_is_covered():
    """The cases cover every algorithm class mmpretrain 1.2 ships."""
    from mmpretrain.models import selfsup
    algorithms = {
        name
        for name in selfsup.__all__
        if isinstance(getattr(selfsup, name), type)
        and issubclass(getattr(selfsup, name), selfsup.BaseSelfSupervisor)
        and name != 'BaseSelfSupervisor'
    }
    assert len(algorithms) == 19
    assert algorithms == {case.algorithm for case in CASES.values()}


# --------------------------------------------------------------------------
# the parts the default branches added: shuffled rows, tuple indices,
# blocks, token masks, no CLS token
# --------------------------------------------------------------------------
def test_covariance_quantities_ignore_the_row_order_of_a_branch():
    """Why MoCo v2's batch-shuffled keys are exact with the default kernel:
    the d x d covariance of a branch is a sum over its rows."""
    generator = torch.Generator().manual_seed(0)
    z1 = torch.randn(8, 5, generator=generator, dtype=torch.float64)
    z2 = z1 + 0.5 * torch.randn(8, 5, generator=generator, dtype=torch.float64)
    shuffled = z2[torch.randperm(8, generator=generator)]
    paired = two_branch_quantities(z1, z2, 'covariance', 1.0)
    unpaired = two_branch_quantities(z1, shuffled, 'covariance', 1.0)
    for key, value in paired.items():
        torch.testing.assert_close(unpaired[key], value)
    gram = two_branch_quantities(z1, z2, 'gram', 1.0)
    assert not torch.allclose(
        two_branch_quantities(z1, shuffled, 'gram', 1.0)['mutual_info_gram'],
        gram['mutual_info_gram'])


def test_gram_kernel_refuses_the_batch_shuffled_moco_keys(
        image_folder, tiny_clip, tmp_path):
    cfg = shrunk_config(CASES['mocov2'], str(tmp_path), image_folder,
                        tiny_clip)
    model = MODELS.build(cfg.model)
    runner = SimpleNamespace(model=model)
    MatrixInfoHook(kernel='covariance').before_run(runner)
    with pytest.raises(ValueError, match="rows='shuffled'.*kernel='gram'"):
        MatrixInfoHook(kernel='gram').before_run(runner)


BAD_BRANCHES = [
    # (branch, error type, words the message must contain)
    (dict(module='backbone', index='a'), TypeError, ['branch index', "'a'"]),
    (dict(module='neck', block=3), ValueError, ['(index, count)', '3']),
    (dict(module='neck', block=(0, 0)), ValueError, ['block count', '>= 1']),
    (dict(module='neck', block=(2, 2)), ValueError, ['< its count']),
    (dict(module='backbone',
          extra_tokens=-1), ValueError, ['extra_tokens', '>= 0']),
    (dict(module='backbone',
          extra_tokens=0), ValueError, ["pool='cls'", 'CLS token']),
    (dict(module='backbone',
          token_mask=1), ValueError, ["token_mask needs pool='mean'"]),
    (dict(module='neck',
          rows='random'), ValueError, ['branch rows', 'shuffled']),
]


@pytest.mark.parametrize(
    'branch,error,words',
    BAD_BRANCHES,
    ids=[repr(row[0]) for row in BAD_BRANCHES])
def test_hook_rejects_bad_branch_keys(branch, error, words):
    with pytest.raises(error) as info:
        MatrixInfoHook(branches=[branch])
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_index_follows_nested_tuples():
    tokens = torch.randn(2, 3, 4)
    output = ((torch.randn(2, 1), torch.randn(2, 2), tokens), None)
    assert first_tensor(output, (0, -1)) is tokens
    assert first_tensor(output).shape == (2, 1)
    with pytest.raises(ValueError, match='out of range'):
        first_tensor(output, (0, 5))


def test_token_mask_averages_each_sample_own_tokens():
    """MixMIM: tokens where the shared mask is 1 belong to another image."""
    tokens = torch.randn(3, 4, 2, dtype=torch.float64)
    mask = torch.tensor([0., 1., 0., 1.]).reshape(1, 4, 1)
    pooled = to_embeddings(tokens, 'mean', extra_tokens=0, mask=mask)
    torch.testing.assert_close(pooled, tokens[:, [0, 2]].mean(dim=1))
    # Without a CLS token, 'mean' averages every token.
    torch.testing.assert_close(
        to_embeddings(tokens, 'mean', extra_tokens=0), tokens.mean(dim=1))


def test_blocks_then_rows_select_the_crops():
    z = torch.arange(12.).reshape(12, 1)  # 3 crops of a batch of 4
    torch.testing.assert_close(select_rows(z, 'all', (1, 3)), z[4:8])
    torch.testing.assert_close(select_rows(z, 'odd', (2, 3)), z[[9, 11]])
    with pytest.raises(ValueError, match='multiple of 5'):
        select_rows(z, 'all', (0, 5))


#: Algorithms whose loss forward changes more than buffers: CAE steps its
#: teacher (``momentum_update``), SwAV normalises its prototypes in place
#: and pushes the batch into its queue (a plain tensor attribute, here from
#: the first epoch on), MoCo v2 enqueues its keys (buffers), BYOL steps its
#: target network (mmengine's ``BaseAveragedModel``).
STATEFUL_FORWARDS = {
    'cae': {},
    'swav': {
        'custom_hooks.0.epoch_queue_starts': 0,
        'custom_hooks.0.queue_length': 2 * BATCH
    },
    'mocov2': {},
    'byol': {}
}


def train_twice_with_heldout(name: str, work_dir: str, images: str, clip: str,
                             heldout: bool) -> Runner:
    """Two epochs of the shrunk config, with or without a held-out pass
    (at the start and after each epoch, on the training images)."""
    case = CASES[name]
    cfg = shrunk_config(case, work_dir, images, clip)
    cfg.merge_from_dict(STATEFUL_FORWARDS[name])
    cfg.train_cfg.max_epochs = 2
    if heldout:
        cfg.custom_hooks[-1]['heldout'] = dict(
            dataset=copy.deepcopy(cfg.train_dataloader.dataset),
            num_batches=1,
            batch_size=BATCH)
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def tensors_of(runner: Runner) -> Dict[str, torch.Tensor]:
    """The model's state dict and, for SwAV, its queue."""
    model = runner.model
    tensors = dict(model.state_dict())
    loss = getattr(getattr(model, 'head', None), 'loss_module', None)
    if getattr(loss, 'queue', None) is not None:
        tensors['queue'] = loss.queue
    return tensors


@pytest.mark.parametrize('name', list(STATEFUL_FORWARDS))
def test_heldout_pass_leaves_training_unchanged(name, tmp_path, image_folder,
                                                tiny_clip):
    """Three held-out passes (at the start and after each of 2 epochs)
    leave every parameter, buffer and queue bit for bit where training
    without them leaves it."""
    plain = train_twice_with_heldout(name, str(tmp_path / 'plain'),
                                     image_folder, tiny_clip, False)
    measured = train_twice_with_heldout(name, str(tmp_path / 'heldout'),
                                        image_folder, tiny_clip, True)
    hook = next(h for h in measured.hooks if isinstance(h, MatrixInfoHook))
    assert hook.heldout is not None
    assert measured.message_hub.get_scalar(
        'minfo_heldout/' + expected_keys(CASES[name])[0]) is not None
    ours, theirs = tensors_of(measured), tensors_of(plain)
    assert ours.keys() == theirs.keys()
    changed = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not changed, changed
