"""The GPU-decoding option (PackEncodedJpeg + DeviceJpegDataPreprocessor):
the recipe's crop boxes and flips draw for draw, its pixels up to the
decoder and resampler, a mixed JPEG/PNG batch, a training step through the
documented config, and (marked cuda) nvJPEG on the GPU."""
import os
import os.path as osp
from typing import List

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate
from mmengine.registry import init_default_scope
from mmpretrain.models.utils import SelfSupDataPreprocessor
from PIL import Image

from mmae_plugin.datasets import PackEncodedJpeg
from mmae_plugin.models.data_preprocessors import (DeviceJpegDataPreprocessor,
                                                   decode_crop_batch)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
RECIPE_CROP = dict(scale=224, crop_ratio_range=(0.2, 1.0), flip_prob=0.5)
#: The option as docs/gpu_clusters.md gives it.
OPTION = """
_base_ = '{base}'
train_dataloader = dict(
    num_workers=4,
    collate_fn=dict(_delete_=True, type='pseudo_collate'),
    dataset=dict(pipeline=[dict(type='PackEncodedJpeg', scale=224,
                                crop_ratio_range=(0.2, 1.0),
                                flip_prob=0.5)]))
data_preprocessor = dict(type='DeviceJpegDataPreprocessor', size=224)
"""


def photo(path: str, width: int, height: int, seed: int) -> str:
    """A smooth, textured RGB image (JPEG q90 or PNG by extension)."""
    rng = np.random.default_rng(seed)
    smooth = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
    pixels = np.asarray(
        smooth.resize((width, height), Image.Resampling.BICUBIC), np.int16)
    pixels = pixels + rng.integers(-6, 7, pixels.shape)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    image.save(path, quality=90) if path.endswith('.jpg') else \
        image.save(path)
    return path


@pytest.fixture(scope='module')
def images(tmp_path_factory) -> List[str]:
    folder = tmp_path_factory.mktemp('photos')
    sizes = [(320, 240), (500, 375), (260, 410), (400, 300)]
    paths = [
        photo(str(folder / f'{i}.jpg'), w, h, i)
        for i, (w, h) in enumerate(sizes)
    ]
    paths.append(photo(str(folder / 'last.png'), 300, 280, 9))
    return paths


def recipe_pipeline() -> Compose:
    """The train pipeline of configs/mae_vit-base_200e.py."""
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'mae_vit-base_200e.py'))
    return Compose([dict(s) for s in cfg.train_dataloader.dataset.pipeline])


def recipe_rgb(path: str, seed: int) -> np.ndarray:
    """The recipe's (224, 224, 3) RGB output for a seed."""
    np.random.seed(seed)
    packed = recipe_pipeline()(dict(img_path=path))['inputs']  # BGR CHW
    return packed.numpy()[::-1].transpose(1, 2, 0)


def pack(path: str, seed: int) -> dict:
    np.random.seed(seed)
    return PackEncodedJpeg(**RECIPE_CROP)(dict(img_path=path))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_boxes_and_flips_are_the_recipes_draws(images, seed):
    """Cropping the drawn box as the recipe crops gives the recipe's
    output exactly: the same box and flip for the same random state."""
    transform = PackEncodedJpeg(**RECIPE_CROP)
    for index, path in enumerate(images):
        packed = pack(path, seed + 10 * index)
        meta = packed['data_samples'].metainfo
        with open(path, 'rb') as f:
            ours = transform.crop_on_cpu(f.read(), meta['crop_box'],
                                         meta['flip'])
        want = recipe_rgb(path, seed + 10 * index)
        assert np.array_equal(ours.numpy().transpose(1, 2, 0), want), path


def test_jpegs_travel_encoded_and_pngs_as_the_recipes_crop(images):
    for path in images:
        packed = pack(path, 5)
        meta = packed['data_samples'].metainfo
        if path.endswith('.jpg'):
            assert meta['encoded'] is True
            assert bytes(packed['inputs'].numpy()) == open(path, 'rb').read()
        else:
            assert meta['encoded'] is False
            assert packed['inputs'].shape == (3, 224, 224)
            assert np.array_equal(packed['inputs'].numpy().transpose(1, 2, 0),
                                  recipe_rgb(path, 5))
        height, width = Image.open(path).size[::-1]
        top, left, crop_h, crop_w = meta['crop_box']
        assert 0 <= top <= top + crop_h <= height
        assert 0 <= left <= left + crop_w <= width
        assert meta['ori_shape'] == (height, width)


def test_decoded_crops_are_the_recipes_up_to_decoder_and_resampler(images):
    """torchvision's decoder and bicubic against OpenCV's and Pillow's:
    about one grey level on average, a few at most in most pixels."""
    packed = [pack(path, 20 + i) for i, path in enumerate(images)]
    batch = pseudo_collate(packed)
    crops = decode_crop_batch(batch['inputs'], batch['data_samples'], 224,
                              torch.device('cpu'))
    assert crops.shape == (len(images), 3, 224, 224)
    assert crops.dtype == torch.uint8
    for index, path in enumerate(images):
        want = recipe_rgb(path, 20 + index).astype(np.int16)
        got = crops[index].numpy().transpose(1, 2, 0).astype(np.int16)
        difference = np.abs(got - want)
        assert difference.mean() < 1.5, (path, difference.mean())
        assert np.percentile(difference, 99) <= 8, path


def test_preprocessor_normalises_like_the_recipes(images):
    """Same normalisation and channel order as SelfSupDataPreprocessor on
    the recipe's BGR crops (to_rgb=True: the model sees RGB)."""
    packed = [pack(path, 30 + i) for i, path in enumerate(images)]
    ours = DeviceJpegDataPreprocessor(
        mean=MEAN, std=STD, to_rgb=True)(pseudo_collate(packed), True)
    recipe = [recipe_rgb(path, 30 + i) for i, path in enumerate(images)]
    bgr = torch.from_numpy(
        np.stack(recipe)[..., ::-1].transpose(0, 3, 1, 2).copy())
    theirs = SelfSupDataPreprocessor(
        mean=MEAN, std=STD, to_rgb=True)(dict(inputs=bgr, data_samples=[]),
                                         True)['inputs']
    assert ours['inputs'].dtype == torch.float32
    assert ours['inputs'].shape == theirs.shape
    difference = (ours['inputs'] - theirs).abs().mean().item()
    assert difference < 1.5 / 57.0, difference  # < 1.5 grey levels
    assert len(ours['data_samples']) == len(images)


def test_without_to_rgb_the_model_sees_bgr_as_with_the_recipe(images):
    packed = pseudo_collate([pack(images[0], 3)])
    rgb = DeviceJpegDataPreprocessor(to_rgb=True)(packed)['inputs']
    bgr = DeviceJpegDataPreprocessor(to_rgb=False)(packed)['inputs']
    assert torch.equal(bgr, rgb.flip(1))


def test_bad_settings_and_batches_are_refused(images):
    with pytest.raises(ValueError, match='interpolation'):
        DeviceJpegDataPreprocessor(interpolation='nearest')
    with pytest.raises(ValueError, match='flip_prob'):
        PackEncodedJpeg(flip_prob=2)
    with pytest.raises(TypeError, match='pseudo_collate'):
        DeviceJpegDataPreprocessor()(
            dict(inputs=torch.zeros(2, 3, 8, 8), data_samples=[]))


def test_documented_option_trains_a_step(images, tmp_path):
    """The config of docs/gpu_clusters.md over a folder of JPEGs and a PNG:
    the dataloader's batch through the preprocessor into an M-MAE step
    (ViT-B shrunk to ViT-tiny for the CPU)."""
    import shutil

    from mmengine.optim import build_optim_wrapper
    from mmengine.runner import Runner
    from mmpretrain.registry import MODELS
    folder = tmp_path / 'data' / 'train' / 'n000'
    os.makedirs(folder)
    for path in images:
        shutil.copy(path, folder)
    config = tmp_path / 'option.py'
    config.write_text(
        OPTION.format(base=osp.join(REPO, 'configs', 'mmae_vit-base_200e.py')))
    cfg = Config.fromfile(str(config))
    loader = dict(
        cfg.train_dataloader.to_dict(),
        batch_size=len(images),
        num_workers=0,
        persistent_workers=False,
        pin_memory=False)
    loader['dataset'] = dict(
        type='CustomDataset',
        data_root=str(tmp_path / 'data'),
        data_prefix='train',
        with_label=False,
        pipeline=loader['dataset']['pipeline'])
    loader['collate_fn'].pop('_scope_', None)
    init_default_scope('mmpretrain')
    batch = next(iter(Runner.build_dataloader(loader, seed=0)))
    assert sorted(s.metainfo['encoded'] for s in batch['data_samples']) == \
        [False] + [True] * (len(images) - 1)
    cfg.merge_from_dict({
        'model.backbone.arch': 'deit-tiny',
        'model.neck.embed_dim': 192,
        'model.neck.decoder_embed_dim': 32,
        'model.neck.decoder_depth': 1,
        'model.neck.decoder_num_heads': 2
    })
    model = MODELS.build(
        dict(cfg.model.to_dict(), data_preprocessor=cfg.data_preprocessor))
    assert type(model.data_preprocessor).__name__ == \
        'DeviceJpegDataPreprocessor'
    wrapper = build_optim_wrapper(
        model,
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4)))
    log_vars = model.train_step(batch, wrapper)
    assert all(torch.isfinite(v).all() for v in log_vars.values())
    assert float(log_vars['reg_skipped']) == 0


@pytest.mark.cuda
def test_on_cuda_nvjpeg_gives_the_cpu_decoders_crops(images):
    packed = pseudo_collate(
        [pack(path, 40 + i) for i, path in enumerate(images)])
    on_gpu = decode_crop_batch(packed['inputs'], packed['data_samples'], 224,
                               torch.device('cuda'))
    on_cpu = decode_crop_batch(packed['inputs'], packed['data_samples'], 224,
                               torch.device('cpu'))
    assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape
    difference = (on_gpu.cpu().short() - on_cpu.short()).abs().float()
    assert difference.mean().item() < 1.0
    out = DeviceJpegDataPreprocessor(
        mean=MEAN, std=STD, to_rgb=True).cuda()(packed, True)
    assert out['inputs'].is_cuda and torch.isfinite(out['inputs']).all()
