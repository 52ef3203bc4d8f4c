"""The recipes' fast loader (``LoadImageBytes`` + ``DecodeRandomResizedCrop``)
against mmpretrain's MAE pipeline (``LoadImageFromFile`` ->
``RandomResizedCrop`` 224 bicubic -> ``RandomFlip`` -> ``PackInputs``).

On ImageNet-like JPEGs (500 x 375, quality 90, ~100 KB of gradients, shapes
and grain): the same seed gives the same boxes and flips and pixels within
a grey level; independent seeds give crop parameters a two-sample KS test
cannot tell apart and the same flip rate, decoding only the box
(libjpeg-turbo's partial decoding, ``jpeg_region``) or the whole file; the
box decoded alone has exactly the pixels of OpenCV's whole decode, in every
chroma subsampling; a fixed box is resized as Pillow's bicubic does it, at
full scale and (within ~1-2 grey levels on average) after a reduced JPEG
decode; progressive, CMYK, corrupt, EXIF-rotated and non-JPEG files, and a
machine where the region decoder cannot be built, fall back to OpenCV's
whole decode. Tests of the region decoder skip where it cannot be built
(no C compiler or libjpeg header).
"""
import ctypes
import io
import itertools
import os
import os.path as osp
import pickle
import shutil
import tempfile
from typing import Dict, List, Tuple

import cv2
import numpy as np
import pytest
import torch
from _helpers_scripts import load_script
from mmengine.config import Config
from mmengine.dataset import Compose
from mmengine.registry import init_default_scope
from mmpretrain.datasets.transforms import RandomResizedCrop
from PIL import Image, ImageDraw, ImageFilter
from scipy import stats

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.datasets.transforms import fast_crop_decode as fast
from mmae_plugin.datasets.transforms import jpeg_region

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MMPRETRAIN_STEPS = [
    dict(type='LoadImageFromFile'),
    dict(
        type='RandomResizedCrop',
        scale=224,
        crop_ratio_range=(0.2, 1.0),
        backend='pillow',
        interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackInputs')
]
FAST_STEPS = [
    dict(type='LoadImageBytes'),
    dict(
        type='DecodeRandomResizedCrop',
        scale=224,
        crop_ratio_range=(0.2, 1.0),
        interpolation='bicubic',
        flip_prob=0.5),
    dict(type='PackInputs')
]
KS_DRAWS = 2000
#: KS p-values of the fixed seeds below (deterministic), for the record.
KS_ALPHA = 0.01
#: The region decoder (built on first use), or None where it cannot be.
REGION = jpeg_region.load()
needs_region = pytest.mark.skipif(
    REGION is None,
    reason='no region decoder: ' + str(jpeg_region.unavailable_reason()))
PATHS = [
    pytest.param('region', marks=needs_region),
    'whole',
]


def natural_jpeg(width: int,
                 height: int,
                 seed: int,
                 exif: bytes = None) -> bytes:
    """A photograph-like JPEG (quality 90): colour gradients, 30 blurred
    ellipses and rectangles, Gaussian grain (sigma 20): ~100 KB at 500 x
    375, as an ImageNet photograph."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    planes = [
        128 + 90 * np.sin(2 * np.pi *
                          (x * rng.uniform(.5, 2) + y * rng.uniform(.5, 2)) +
                          rng.uniform(0, 6)) for _ in range(3)
    ]
    image = Image.fromarray(np.stack(planes, -1).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(30):
        cx, cy = rng.integers(0, width), rng.integers(0, height)
        r = rng.integers(width // 40, width // 6)
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((cx - r, cy - r, cx + r, cy + r),
              fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    pixels = np.asarray(image.filter(ImageFilter.GaussianBlur(1)),
                        np.float32) + rng.normal(0, 20, (height, width, 3))
    out = io.BytesIO()
    kwargs = {} if exif is None else dict(exif=exif)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
        out, 'JPEG', quality=90, **kwargs)
    return out.getvalue()


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope='module')
def jpegs(tmp_path_factory) -> List[str]:
    folder = tmp_path_factory.mktemp('jpegs')
    return [
        write(folder / f'{i}.jpg', natural_jpeg(500, 375, i)) for i in range(4)
    ]


@pytest.fixture(scope='module')
def pipelines() -> Dict[str, Compose]:
    init_default_scope('mmpretrain')
    return dict(mmpretrain=Compose(MMPRETRAIN_STEPS), fast=Compose(FAST_STEPS))


def run_seeded(pipeline: Compose, paths: List[str], seed: int) -> List:
    """The pipeline over ``paths`` after seeding numpy's global stream."""
    np.random.seed(seed)
    return [pipeline(dict(img_path=path)) for path in paths]


def bgr(packed: Dict) -> np.ndarray:
    """HWC int array of a packed sample."""
    return packed['inputs'].permute(1, 2, 0).numpy().astype(int)


# ----------------------------------------------------------- the files
def test_test_images_are_imagenet_like(jpegs):
    for path in jpegs:
        with Image.open(path) as image:
            assert image.size == (500, 375) and image.format == 'JPEG'
        assert 70e3 < osp.getsize(path) < 150e3


# ------------------------------------------ same seed, same augmentation
def test_same_seed_gives_mmpretrains_crops_flips_and_pixels(jpegs, pipelines):
    """Draw for draw the fast path is mmpretrain's: the same box and flip
    (so the same metadata) and, from the same decoded pixels, the same
    bicubic filter, rounded by torch instead of Pillow: 32 draws, mean abs
    error 0.03 grey levels (0.27 at most per image, where torch orders or
    rounds the two passes differently; at most 4 levels per pixel)."""
    paths = jpegs * 8  # 32 draws
    reference = run_seeded(pipelines['mmpretrain'], paths, 7)
    ours = run_seeded(pipelines['fast'], paths, 7)
    errors = []
    for ref, out in zip(reference, ours):
        assert out['inputs'].shape == (3, 224, 224)
        assert out['inputs'].dtype == torch.uint8
        for key in ('flip', 'ori_shape', 'img_shape', 'img_path'):
            assert out['data_samples'].metainfo[key] == \
                ref['data_samples'].metainfo[key], key
        errors.append(np.abs(bgr(out) - bgr(ref)))
    errors = np.stack(errors)
    assert errors.mean() < 0.1 and errors.max() <= 6
    assert errors.mean(axis=(1, 2, 3)).max() < 0.35
    # Per-channel mean / std over the batch: equal to 0.05 grey levels.
    stack = {
        name: torch.stack([r['inputs'] for r in batch]).double()
        for name, batch in (('ref', reference), ('ours', ours))
    }
    for reduce in (torch.mean, torch.std):
        np.testing.assert_allclose(
            reduce(stack['ours'], dim=(0, 2, 3)),
            reduce(stack['ref'], dim=(0, 2, 3)),
            atol=0.05)


# ---------------------------------- independent seeds, same distribution
def crop_params(boxes: List[Tuple[int, int, int, int]],
                sizes: List[Tuple[int, int]]) -> Dict[str, np.ndarray]:
    """Relative area, log aspect ratio and relative centre of boxes."""
    box = np.asarray(boxes, float)
    size = np.asarray(sizes, float)
    top, left, h, w = box.T
    return dict(
        area=h * w / (size[:, 0] * size[:, 1]),
        log_aspect=np.log(w / h),
        centre_y=(top + h / 2) / size[:, 0],
        centre_x=(left + w / 2) / size[:, 1])


@pytest.mark.parametrize('path', PATHS)
def test_crop_boxes_and_flips_match_in_distribution(jpegs, monkeypatch, path):
    """2,000 boxes of the fast transform (recorded as it decodes them, by
    region or whole, on the real files) against 2,000 of
    ``RandomResizedCrop.rand_crop_params`` on the decoded images, from
    another seed: two-sample KS p-values of the relative area, log aspect
    ratio and centre all above 0.01; flip rates within a chi-square test
    of each other and of 0.5."""
    recorded = []
    if path == 'region':
        decode_region = jpeg_region.decode_region

        def spy(library, data, size, box):
            recorded.append((box, size))
            return decode_region(library, data, size, box)

        monkeypatch.setattr(jpeg_region, 'decode_region', spy)
    else:
        resize = fast.resize_crop

        def spy(image, box, size, interpolation):
            recorded.append((box, image.shape[:2]))
            return resize(image, box, size, interpolation)

        monkeypatch.setattr(fast, 'resize_crop', spy)
    crop = fast.DecodeRandomResizedCrop(
        224,
        crop_ratio_range=(0.2, 1.0),
        flip_prob=0.5,
        region_decode=path == 'region')
    data = [open(path, 'rb').read() for path in jpegs]
    np.random.seed(0)
    flips = []
    for index in range(KS_DRAWS):
        out = crop(dict(img_bytes=data[index % len(data)], img_path='x'))
        flips.append(out['flip'])
    assert len(recorded) == KS_DRAWS  # every box through this path
    reference = RandomResizedCrop(
        224,
        crop_ratio_range=(0.2, 1.0),
        backend='pillow',
        interpolation='bicubic')
    images = [cv2.imread(path) for path in jpegs]
    np.random.seed(1)
    ref_boxes = [
        reference.rand_crop_params(images[i % len(images)])
        for i in range(KS_DRAWS)
    ]
    ref_flips = np.random.random_sample(KS_DRAWS) < 0.5
    ours = crop_params([b for b, _ in recorded], [s for _, s in recorded])
    theirs = crop_params(ref_boxes,
                         [images[i % 4].shape[:2] for i in range(KS_DRAWS)])
    for name in ours:
        result = stats.ks_2samp(ours[name], theirs[name])
        assert result.pvalue > KS_ALPHA, (name, result)
    table = [[sum(flips), KS_DRAWS - sum(flips)],
             [int(ref_flips.sum()),
              int(KS_DRAWS - ref_flips.sum())]]
    assert stats.chi2_contingency(table).pvalue > KS_ALPHA
    assert stats.binomtest(sum(flips), KS_DRAWS).pvalue > KS_ALPHA


def test_flip_draw_is_random_flips_draw():
    """``flip_prob=0.5`` flips exactly when mmcv's ``RandomFlip(0.5)``
    does, from the same numpy stream."""
    init_default_scope('mmpretrain')
    flip = Compose([dict(type='RandomFlip', prob=0.5)])
    crop = fast.DecodeRandomResizedCrop(224, flip_prob=0.5)
    image = np.zeros((4, 4, 3), np.uint8)
    np.random.seed(3)
    theirs = [flip(dict(img=image))['flip'] for _ in range(200)]
    np.random.seed(3)
    ours = [crop.flip({}, image) is not image for _ in range(200)]
    assert ours == theirs and 50 < sum(ours) < 150


# ------------------------------------------------ a fixed box, the pixels
def pillow_reference(data: bytes, box, size=(224, 224)) -> np.ndarray:
    """Full decode (OpenCV, as LoadImageFromFile), crop, Pillow bicubic."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    top, left, h, w = box
    crop = Image.fromarray(image[top:top + h, left:left + w])
    return np.asarray(
        crop.resize(size[::-1], Image.Resampling.BICUBIC), dtype=int)


@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('box', [(10, 20, 300, 400), (0, 0, 375, 500),
                                 (150, 200, 150, 170), (201, 317, 174, 183)])
def test_fixed_box_at_full_scale_is_pillows_bicubic(box, path):
    """Down- and up-sampling, the box decoded alone or the whole file:
    mean abs error < 0.05, at most 2 levels (0.003-0.006 and 1 measured,
    the same on both paths)."""
    data = natural_jpeg(500, 375, 11)
    if path == 'region':
        image = jpeg_region.decode_region(REGION, data, (375, 500), box)
        assert image.shape == (box[2], box[3], 3)
        out = fast.resize_crop(image, (0, 0, box[2], box[3]), (224, 224),
                               'bicubic')
    else:
        image = fast.decode(data)
        out = fast.resize_crop(image, box, (224, 224), 'bicubic')
    error = np.abs(out.astype(int) - pillow_reference(data, box))
    assert error.mean() < 0.05 and error.max() <= 2


@pytest.mark.parametrize('box,scale', [((100, 150, 1000, 1300), 4),
                                       ((0, 0, 1500, 2000), 4),
                                       ((37, 211, 905, 1207), 4),
                                       ((3, 5, 460, 470), 2)])
def test_reduced_decode_of_a_fixed_box_stays_close(box, scale):
    """A box holding >= 224 pixels at 1/2 or 1/4 scale, decoded there (DCT
    scaling) and mapped exactly, against the full decode Pillow-resized:
    mean abs error < 4 grey levels on this grainy image (0.5-3.4 measured;
    the largest where the reduced crop is resized almost 1:1, so the DCT's
    low-pass replaces the bicubic's); shape and dtype unchanged."""
    data = natural_jpeg(2000, 1500, 5)
    assert fast.jpeg_size(data) == (1500, 2000)
    assert fast.dct_scale(box, (224, 224)) == scale
    image = fast.decode(data, scale)
    assert image.shape == (1500 // scale, 2000 // scale, 3)
    out = fast.resize_scaled_crop(image, box, scale, (224, 224), 'bicubic')
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - pillow_reference(data, box)).mean() < 4


def test_reduced_decodes_keep_the_pixel_statistics():
    """40 recipe draws on a 2000 x 1500 JPEG, nearly all decoded at 1/2-1/8
    scale, against mmpretrain's ``RandomResizedCrop`` from the same seed
    (the same boxes) on the full decode: per-channel mean within 0.2 and
    std within 1 % (the DCT's low-pass keeps a little more of the grain);
    mean abs error < 3 grey levels per pixel."""
    data = natural_jpeg(2000, 1500, 5)
    reference = RandomResizedCrop(
        224,
        crop_ratio_range=(0.2, 1.0),
        backend='pillow',
        interpolation='bicubic')
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    full = fast.decode(data)
    np.random.seed(4)
    theirs = np.stack([reference(dict(img=full))['img']
                       for _ in range(40)]).astype(float)
    np.random.seed(4)
    ours = np.stack([crop(dict(img_bytes=data))['img']
                     for _ in range(40)]).astype(float)
    np.testing.assert_allclose(
        ours.mean(axis=(0, 1, 2)), theirs.mean(axis=(0, 1, 2)), atol=0.2)
    np.testing.assert_allclose(
        ours.std(axis=(0, 1, 2)), theirs.std(axis=(0, 1, 2)), rtol=0.01)
    assert np.abs(ours - theirs).mean() < 3


def test_large_file_through_the_transform_decodes_reduced(
        tmp_path, monkeypatch):
    """A 2000 x 1500 JPEG: most boxes are decoded at 1/2-1/4 scale, and
    ``ori_shape`` is the file's full size."""
    scales = []
    decode = fast.decode

    def spy(data, scale=1):
        scales.append(scale)
        return decode(data, scale)

    monkeypatch.setattr(fast, 'decode', spy)
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    data = natural_jpeg(2000, 1500, 2)
    np.random.seed(0)
    for _ in range(20):
        out = crop(dict(img_bytes=data))
        assert out['img'].shape == (224, 224, 3)
        assert out['ori_shape'] == (1500, 2000)
    assert set(scales) <= {1, 2, 4} and scales.count(1) < 10


def test_dct_scale_keeps_the_output_resolution():
    assert fast.dct_scale((0, 0, 447, 1000), (224, 224)) == 1
    assert fast.dct_scale((0, 0, 448, 448), (224, 224)) == 2
    assert fast.dct_scale((0, 0, 1792, 1800), (224, 224)) == 8
    assert fast.dct_scale((0, 0, 1000, 900), (224, 224)) == 4
    assert fast.dct_scale((0, 0, 900, 1000), (224, 448)) == 2


# ------------------------------------------ headers and the fallbacks
def exif_with_orientation(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[fast.EXIF_ORIENTATION] = orientation
    return exif.tobytes()


def test_jpeg_size_reads_the_frame_header():
    assert fast.jpeg_size(natural_jpeg(500, 375, 0)) == (375, 500)
    upright = natural_jpeg(64, 48, 0, exif=exif_with_orientation(1))
    assert fast.jpeg_size(upright) == (48, 64)
    # Rotated or mirrored by EXIF: not the decoded size, so none.
    rotated = natural_jpeg(64, 48, 0, exif=exif_with_orientation(6))
    assert fast.jpeg_size(rotated) is None
    progressive = io.BytesIO()
    Image.new('RGB', (40, 30)).save(progressive, 'JPEG', progressive=True)
    assert fast.jpeg_size(progressive.getvalue()) == (30, 40)
    png = io.BytesIO()
    Image.new('RGB', (40, 30)).save(png, 'PNG')
    assert fast.jpeg_size(png.getvalue()) is None
    assert fast.jpeg_size(b'\xff\xd8\xff') is None


@pytest.mark.parametrize('kind', ['png', 'exif_rotated', 'grayscale'])
def test_files_without_a_usable_header_match_mmpretrain(
        kind, tmp_path, pipelines):
    """PNG, an EXIF-rotated JPEG (OpenCV turns it upright) and a grayscale
    JPEG: decoded whole, the box drawn on the decoded size, as mmpretrain
    does (same seed, same box and flip)."""
    data = natural_jpeg(300, 200, 4)
    if kind == 'png':
        image = Image.open(io.BytesIO(data))
        out = io.BytesIO()
        image.save(out, 'PNG')
        data = out.getvalue()
    elif kind == 'exif_rotated':
        data = natural_jpeg(300, 200, 4, exif=exif_with_orientation(6))
    else:
        out = io.BytesIO()
        Image.open(io.BytesIO(data)).convert('L').save(out, 'JPEG')
        data = out.getvalue()
    path = write(tmp_path / f'{kind}.img', data)
    (ref, ) = run_seeded(pipelines['mmpretrain'], [path], 5)
    (ours, ) = run_seeded(pipelines['fast'], [path], 5)
    assert ours['data_samples'].ori_shape == ref['data_samples'].ori_shape
    if kind == 'exif_rotated':
        assert ours['data_samples'].ori_shape == (300, 200)
    assert ours['data_samples'].flip == ref['data_samples'].flip
    assert np.abs(bgr(ours) - bgr(ref)).mean() < 0.05


# -------------------------------------------------- the box decoded alone
#: OpenCV's sampling-factor codes.
SAMPLING = {
    '4:2:0': cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    '4:2:2': cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    '4:4:4': cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
    '4:1:1': cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411
}
#: A restart interval of one MCU (the DRI segment).
EVERY_MCU = b'\xff\xdd\x00\x04\x00\x01'


def reencoded(kind: str, height: int, width: int, seed: int) -> bytes:
    """A photograph-like baseline JPEG in one chroma layout or encoder."""
    data = natural_jpeg(width, height, seed)
    image = Image.open(io.BytesIO(data))
    out = io.BytesIO()
    if kind == 'opencv':  # OpenCV's encoder (4:2:0, its Huffman tables)
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        return cv2.imencode('.jpg', pixels,
                            [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    if kind.startswith('restart_every_mcu'):  # decoded from the box's MCUs
        layout = kind.split(' ')[1]
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        params = [
            cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, 1
        ]
        if layout == 'grayscale':
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY)
        else:
            params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, SAMPLING[layout]]
        data = cv2.imencode('.jpg', pixels, params)[1].tobytes()
        assert EVERY_MCU in data
        return data
    if kind == 'grayscale':
        image.convert('L').save(out, 'JPEG', quality=90)
    elif kind == 'restart_markers':  # every MCU row: decoded as any file
        image.save(out, 'JPEG', quality=90, restart_marker_rows=1)
    elif kind == 'optimized':
        image.save(out, 'JPEG', quality=90, optimize=True)
    else:  # 4:2:0, 4:2:2, 4:4:4
        subsampling = {'4:4:4': 0, '4:2:2': 1, '4:2:0': 2}[kind]
        image.save(out, 'JPEG', quality=90, subsampling=subsampling)
    return out.getvalue()


def edge_boxes(height: int, width: int) -> List[Tuple[int, int, int, int]]:
    """The whole image, single pixels in the corners, a row, a column and
    boxes against each edge."""
    return [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1),
            (height // 2, 0, 1, width), (0, width // 2, height, 1),
            (0, width // 3, height // 2, 7),
            (height // 3, width - 9, min(5, height - height // 3), 9),
            (height - 3, 1, 3, width - 1)]


@needs_region
@pytest.mark.parametrize('kind', [
    '4:2:0', '4:2:2', '4:4:4', 'grayscale', 'optimized', 'opencv',
    'restart_markers', 'restart_every_mcu 4:2:0', 'restart_every_mcu 4:2:2',
    'restart_every_mcu 4:4:4', 'restart_every_mcu 4:1:1',
    'restart_every_mcu grayscale'
])
@pytest.mark.parametrize('size', [(375, 500), (29, 37), (16, 16), (3, 70)])
def test_region_decode_is_opencvs_whole_decode_cropped(kind, size):
    """Every chroma layout, odd sizes and boxes on every edge: the box
    decoded alone is bit for bit OpenCV's whole decode cropped (60 recipe
    boxes and 8 edge boxes per file)."""
    height, width = size
    data = reencoded(kind, height, width, sum(size))
    assert fast.jpeg_header(data)[:2] == size
    whole = fast.decode(data)
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    np.random.seed(height)
    boxes = [crop.box_for(height, width) for _ in range(60)]
    for top, left, h, w in boxes + edge_boxes(height, width):
        out = jpeg_region.decode_region(REGION, data, size, (top, left, h, w))
        assert out is not None and out.flags.c_contiguous
        np.testing.assert_array_equal(out, whole[top:top + h, left:left + w])


@needs_region
@pytest.mark.parametrize('kind', [
    '4:2:0', 'restart_every_mcu 4:2:0', 'restart_every_mcu 4:1:1',
    'restart_every_mcu grayscale'
])
def test_every_box_of_a_small_image(kind):
    """All 10,395 boxes of a 9 x 21 image, one pixel wide ones included
    (libjpeg upsamples rows of at most two chroma samples another way):
    OpenCV's pixels."""
    data = reencoded(kind, 9, 21, 3)
    whole = fast.decode(data)
    for top, height in itertools.combinations(range(10), 2):
        for left, width in itertools.combinations(range(22), 2):
            box = (top, left, height - top, width - left)
            out = jpeg_region.decode_region(REGION, data, (9, 21), box)
            np.testing.assert_array_equal(out, whole[top:height, left:width])


def damaged_first_interval(data: bytes) -> bytes:
    """A file restarted at every MCU with its first MCU's data zeroed."""
    start = data.index(b'\xff\xda')
    start += 2 + int.from_bytes(data[start + 2:start + 4], 'big')
    end = data.index(b'\xff\xd0', start)
    return data[:start] + bytes(end - start) + data[end:]


@needs_region
def test_a_file_restarted_at_every_mcu_is_decoded_from_the_boxs_mcus():
    """Only the MCUs around the box are read: damage in the first MCU
    leaves a box below it exact and warning-free, where a decode that
    reads the rows above the box carries the damage down (or warns)."""
    clean = reencoded('restart_every_mcu 4:2:0', 375, 500, 5)
    plain = reencoded('4:2:0', 375, 500, 5)
    whole = fast.decode(clean)
    box = (200, 300, 100, 150)
    out = jpeg_region.decode_region(REGION, damaged_first_interval(clean),
                                    (375, 500), box)
    np.testing.assert_array_equal(out, whole[200:300, 300:450])
    middle = plain.index(b'\xff\xda') + 200
    damaged_plain = plain[:middle] + bytes(8) + plain[middle + 8:]
    out = jpeg_region.decode_region(REGION, damaged_plain, (375, 500), box)
    assert out is None or not np.array_equal(
        out,
        fast.decode(plain)[200:300, 300:450])


@needs_region
def test_region_path_gives_the_whole_paths_outputs(jpegs, monkeypatch):
    """Same seed, 40 draws: decoding only the boxes (OpenCV never decodes)
    gives exactly the crops, flips and sizes of the whole decodes."""
    whole_decodes = []
    decode = fast.decode

    def spy(data, scale=1):
        whole_decodes.append(scale)
        return decode(data, scale)

    monkeypatch.setattr(fast, 'decode', spy)
    kwargs = dict(scale=224, crop_ratio_range=(0.2, 1.0), flip_prob=0.5)
    region = fast.DecodeRandomResizedCrop(**kwargs)
    whole = fast.DecodeRandomResizedCrop(**kwargs, region_decode=False)
    assert region.region_decoder is not None and whole.region_decoder is None
    data = [open(path, 'rb').read() for path in jpegs] * 10
    np.random.seed(6)
    ours = [region(dict(img_bytes=d, img_path='x')) for d in data]
    assert whole_decodes == []
    np.random.seed(6)
    theirs = [whole(dict(img_bytes=d, img_path='x')) for d in data]
    assert whole_decodes == [1] * len(data)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a['img'], b['img'])
        assert (a['flip'], a['ori_shape']) == (b['flip'], b['ori_shape'])


def corrupted(data: bytes) -> bytes:
    """``data`` with a restart marker half-way through its scan data (where
    there should be none): libjpeg warns 'premature end of data segment'
    and fills the rest with grey; OpenCV returns that image."""
    middle = len(data) // 2
    return data[:middle] + b'\xff\xd5' + data[middle + 2:]


@needs_region
@pytest.mark.parametrize('kind',
                         ['progressive', 'cmyk', 'corrupt', 'trailing_bytes'])
def test_files_the_region_path_leaves_to_opencv(kind, tmp_path, pipelines,
                                                monkeypatch):
    """Progressive (never tried), CMYK (refused by the decoder), corrupt
    scan data (boxes that reach it: libjpeg warns, the decoder returns
    None; boxes above it: decoded alone, the same pixels as OpenCV's
    whole decode) and a file that does
    not end with its end-of-image marker are decoded whole, as mmpretrain
    does: 12 seeds, the same boxes, flips and pixels."""
    data = natural_jpeg(300, 200, 4)
    image = Image.open(io.BytesIO(data))
    out = io.BytesIO()
    if kind == 'progressive':
        image.save(out, 'JPEG', quality=90, progressive=True)
        data = out.getvalue()
    elif kind == 'cmyk':
        image.convert('CMYK').save(out, 'JPEG', quality=90)
        data = out.getvalue()
    elif kind == 'corrupt':
        data = corrupted(data)
    else:
        data += b'\0' * 16
    region_calls = []
    decode_region = jpeg_region.decode_region

    def spy(library, data, size, box):
        result = decode_region(library, data, size, box)
        region_calls.append(result is not None)
        return result

    monkeypatch.setattr(jpeg_region, 'decode_region', spy)
    path = write(tmp_path / f'{kind}.jpg', data)
    for seed in range(12):
        (ref, ) = run_seeded(pipelines['mmpretrain'], [path], seed)
        (ours, ) = run_seeded(pipelines['fast'], [path], seed)
        assert ours['data_samples'].flip == ref['data_samples'].flip
        assert ours['data_samples'].ori_shape == (200, 300)
        assert np.abs(bgr(ours) - bgr(ref)).mean() < 0.05
    if kind == 'cmyk':
        assert region_calls == [False] * 12
    elif kind == 'corrupt':  # boxes above the damage decode alone
        assert False in region_calls
    else:
        assert region_calls == []


@needs_region
def test_region_decode_reports_warnings_and_bad_boxes():
    """Corrupt data inside the box: libjpeg's warning makes the decode
    return None (the caller decodes whole); so do a box outside the image
    and a size other than the header's."""
    data = corrupted(natural_jpeg(300, 200, 4))
    assert jpeg_region.decode_region(REGION, data, (200, 300),
                                     (0, 0, 200, 300)) is None
    assert jpeg_region.decode_region(REGION, data, (200, 300),
                                     (0, 0, 10, 300)) is not None
    good = natural_jpeg(300, 200, 4)
    below, right, whole = (150, 0, 51, 10), (0, 295, 10, 6), (0, 0, 10, 10)
    for size, box in [((200, 300), below), ((200, 300), right),
                      ((201, 300), whole)]:
        assert jpeg_region.decode_region(REGION, good, size, box) is None


def test_without_the_region_decoder_the_transform_decodes_whole(
        jpegs, tmp_path, monkeypatch):
    """No compiler (or a failing build): ``load`` returns None and says
    why once, at INFO level; every transform then decodes whole files,
    with the region path's outputs."""
    messages = []
    monkeypatch.setattr(jpeg_region, 'print_log',
                        lambda message, **kwargs: messages.append(message))
    monkeypatch.setattr(jpeg_region, '_state',
                        dict(loaded=False, library=None, reason=None))
    monkeypatch.setenv(jpeg_region.CACHE_VARIABLE, str(tmp_path / 'cache'))
    monkeypatch.setenv('CC', str(tmp_path / 'no-compiler'))
    kwargs = dict(scale=224, crop_ratio_range=(0.2, 1.0), flip_prob=0.5)
    crops = [fast.DecodeRandomResizedCrop(**kwargs) for _ in range(3)]
    assert all(crop.region_decoder is None for crop in crops)
    assert len(messages) == 1 and 'no-compiler' in messages[0]
    assert 'apt-get install gcc libjpeg-dev' in messages[0]
    assert 'no-compiler' in jpeg_region.unavailable_reason()
    data = [open(path, 'rb').read() for path in jpegs]
    reference = fast.DecodeRandomResizedCrop(**kwargs, region_decode=False)
    np.random.seed(2)
    ours = [crops[0](dict(img_bytes=d))['img'] for d in data]
    np.random.seed(2)
    theirs = [reference(dict(img_bytes=d))['img'] for d in data]
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    # A compiler that fails: the same, with its output in the reason.
    monkeypatch.setattr(jpeg_region, '_state',
                        dict(loaded=False, library=None, reason=None))
    monkeypatch.setenv('CC', 'false')
    assert jpeg_region.load() is None
    assert 'the build failed' in jpeg_region.unavailable_reason()
    assert len(messages) == 2


@pytest.mark.parametrize('region_decode', [True, False])
def test_the_transform_pickles(jpegs, region_decode):
    """Spawned dataloader workers get the transform pickled (the region
    decoder is not on the instance: they load their own)."""
    crop = fast.DecodeRandomResizedCrop(
        224,
        crop_ratio_range=(0.2, 1.0),
        flip_prob=0.5,
        region_decode=region_decode)
    copy = pickle.loads(pickle.dumps(crop))
    assert copy.region_decode == region_decode
    assert (copy.region_decoder is None) == (crop.region_decoder is None)
    data = open(jpegs[0], 'rb').read()
    np.random.seed(8)
    ours = crop(dict(img_bytes=data))['img']
    np.random.seed(8)
    np.testing.assert_array_equal(copy(dict(img_bytes=data))['img'], ours)


def test_self_test_refuses_a_decoder_with_other_pixels():
    """A library that returns success with pixels other than OpenCV's is
    not used."""

    class Zeros:

        @staticmethod
        def mmae_decode_region(data, size, image_height, image_width, top,
                               left, height, width, out):
            ctypes.memset(out, 0, height * width * 3)
            return 0

    with pytest.raises(RuntimeError, match="differs from OpenCV's"):
        jpeg_region.self_test(Zeros())


@needs_region
def test_the_built_library_is_cached(tmp_path, monkeypatch):
    """Built once per cache folder (atomically), then loaded from it."""
    monkeypatch.setattr(jpeg_region, '_state',
                        dict(loaded=False, library=None, reason=None))
    monkeypatch.setenv(jpeg_region.CACHE_VARIABLE, str(tmp_path))
    assert jpeg_region.load() is not None
    built = jpeg_region.library_path()
    assert osp.dirname(built) == str(tmp_path) and osp.isfile(built)
    assert os.listdir(tmp_path) == [osp.basename(built)]  # no leftovers
    stamp = os.stat(built).st_mtime_ns
    jpeg_region.reset()
    assert jpeg_region.load() is not None
    assert os.stat(built).st_mtime_ns == stamp


def test_cache_folder(tmp_path, monkeypatch):
    """``$MMAE_JPEG_REGION_CACHE``, else ``$XDG_CACHE_HOME/mmae_plugin``,
    else (a home that cannot be written) the temporary folder."""
    monkeypatch.setenv(jpeg_region.CACHE_VARIABLE, str(tmp_path / 'a'))
    assert jpeg_region.cache_dir() == str(tmp_path / 'a')
    monkeypatch.delenv(jpeg_region.CACHE_VARIABLE)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'b'))
    assert jpeg_region.cache_dir() == str(tmp_path / 'b' / 'mmae_plugin')
    (tmp_path / 'file').write_text('')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'file'))
    assert jpeg_region.cache_dir().startswith(tempfile.gettempdir())


def test_decoded_image_input_crops_like_random_resized_crop():
    """Without ``img_bytes`` the transform crops ``img`` (a drop-in for
    ``RandomResizedCrop``): same box from the same seed."""
    image = fast.decode(natural_jpeg(500, 375, 3))
    reference = RandomResizedCrop(
        224,
        crop_ratio_range=(0.2, 1.0),
        backend='pillow',
        interpolation='bicubic')
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    np.random.seed(9)
    theirs = reference(dict(img=image))['img']
    np.random.seed(9)
    ours = crop(dict(img=image))
    assert ours['img_shape'] == (224, 224, 3) and 'flip' not in ours
    assert np.abs(ours['img'].astype(int) - theirs).mean() < 0.05


def test_unreadable_files(tmp_path):
    loader = fast.LoadImageBytes(ignore_empty=True)
    assert loader(dict(img_path=str(tmp_path / 'missing.jpg'))) is None
    with pytest.raises(FileNotFoundError):
        fast.LoadImageBytes()(dict(img_path=str(tmp_path / 'missing.jpg')))
    crop = fast.DecodeRandomResizedCrop(224)
    with pytest.raises(ValueError, match='failed to decode image: bad'):
        crop(dict(img_bytes=b'not an image', img_path='bad'))


def test_arguments_are_checked():
    with pytest.raises(ValueError, match='interpolation'):
        fast.DecodeRandomResizedCrop(224, interpolation='lanczos')
    with pytest.raises(ValueError, match='flip_prob'):
        fast.DecodeRandomResizedCrop(224, flip_prob=1.5)
    text = repr(fast.DecodeRandomResizedCrop(224, flip_prob=0.5))
    assert 'flip_prob=0.5' in text and 'dct_scaling=True' in text
    assert 'region_decode=True' in text


# ------------------------------------------------------------- recipes
@pytest.mark.parametrize('name', [
    'mae_vit-base_200e', 'mmae_vit-base_200e', 'umae_vit-base_200e',
    'mmae_vit-large_200e', 'mmae_vit-large_200e_fsdp'
])
def test_pretraining_recipes_select_the_fast_loader(name, jpegs):
    cfg = Config.fromfile(osp.join(REPO, 'configs', f'{name}.py'))
    steps = cfg.train_dataloader.dataset.pipeline
    assert [dict(step) for step in steps] == FAST_STEPS
    assert cfg.train_pipeline == steps
    # mmpretrain's MAE preprocessor swaps BGR -> RGB, as before.
    assert cfg.data_preprocessor.to_rgb
    init_default_scope('mmpretrain')
    packed = Compose(steps)(dict(img_path=jpegs[0]))
    assert packed['inputs'].shape == (3, 224, 224)


def test_bench_loader_reports_both_pipelines(capsys):
    bench = load_script('dev/benchmarks/bench_loader.py')
    result = bench.main(['--images', '2', '--rounds', '1'])
    assert result['steps']['mmpretrain'] == [
        s['type'] for s in MMPRETRAIN_STEPS
    ]
    assert result['steps']['fast'] == [s['type'] for s in FAST_STEPS]
    assert result['summary']['ratio']['of_medians'] > 0
    if shutil.which('jpegtran') is not None:  # tools/setup_env.sh installs it
        assert result['steps']['fast_restarts'] == result['steps']['fast']
        assert result['summary']['ratio_restarts']['of_medians'] > 0
        assert -0.2 < result['restart_copies']['change'] < 0.2
    assert result['dct_scale_fractions'][1] == 1.0  # ImageNet-sized files
    region = result['region_decode']
    assert region['available'] == (REGION is not None)
    assert region['fraction'] == (1.0 if REGION is not None else 0.0)
    assert 0.2 <= region['mean_pixels_reconstructed'] <= 1.0
    out = capsys.readouterr().out
    assert 'fast / mmpretrain:' in out
    assert ('fast_restarts / mmpretrain' in out) == \
        (shutil.which('jpegtran') is not None)
