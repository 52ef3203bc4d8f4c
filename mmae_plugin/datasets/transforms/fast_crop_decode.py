"""mmpretrain's MAE crop with fewer steps per image.

mmpretrain's MAE pipeline decodes the whole file (OpenCV), copies the crop
out, hands it to Pillow for the bicubic resize and copies the result back.
Here the file is read as bytes (:class:`LoadImageBytes`) and
:class:`DecodeRandomResizedCrop`, a subclass of mmpretrain's
``RandomResizedCrop``:

* draws the crop box with ``RandomResizedCrop.rand_crop_params`` itself,
  from the size in the JPEG's frame header (the same draws, so the same
  boxes, as mmpretrain's transform on the decoded image);
* decodes only the box of a baseline JPEG (libjpeg-turbo's partial
  decoding, :mod:`.jpeg_region`: the rows above it Huffman-decoded only,
  the rows below it not at all, the iMCU columns outside it skipped; in a
  file restarted at every MCU, only the box's MCUs read at all), with
  exactly the pixels of OpenCV's whole decode; where that decoder is not
  available (no C compiler or libjpeg header to build it), or for other
  files (progressive, EXIF-rotated, PNG...), decodes with OpenCV as
  ``LoadImageFromFile`` does (the same pixels), at 1/2, 1/4 or 1/8 scale
  (libjpeg's DCT scaling) when the box still holds at least the output's
  pixels at that scale;
* resizes the crop with torch's uint8 antialiased kernel (Pillow's filter,
  vectorised), or, after a reduced decode, with Pillow from the box mapped
  exactly to the reduced image;
* draws the flip as mmcv's ``RandomFlip`` does (``flip_prob``).

Its output is ``RandomResizedCrop``'s: a BGR uint8 HWC array (after a
full-scale decode, a view of a CHW buffer that ``PackInputs`` takes without
a copy unless flipped), ``img_shape`` and ``ori_shape``. On ImageNet-sized
JPEGs it delivers 1.9 times the images per second of a worker core, 2.1-2.3
times on copies restarted at every MCU (``add_jpeg_restarts.py``), 1.6-1.7
times where it decodes whole files (docs/gpu_clusters.md,
dev/benchmarks/bench_loader.py).
"""
import ctypes
import io
from types import SimpleNamespace
from typing import Optional, Sequence, Tuple, Union

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from mmcv.transforms import BaseTransform
from mmengine import fileio
from mmpretrain.datasets.transforms import RandomResizedCrop
from mmpretrain.registry import TRANSFORMS
from PIL import Image

from . import jpeg_region

#: JPEG start-of-frame markers (every SOFn but DHT, JPG and DAC).
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: Sequential Huffman-coded frames (baseline, extended): the ones decoded by
#: region (:mod:`.jpeg_region`).
SEQUENTIAL_HUFFMAN_MARKERS = frozenset([0xC0, 0xC1])
#: The end-of-image marker. A file that does not end with it (a truncated
#: one, which OpenCV refuses) is decoded whole: a region decode would not
#: reach the missing end when the box is above it.
END_OF_IMAGE = b'\xff\xd9'
#: Markers without a length field (TEM, RST0-7).
STANDALONE_MARKERS = frozenset([0x01, *range(0xD0, 0xD8)])
#: OpenCV's decode flag for each DCT scale (``LoadImageFromFile``'s
#: ``'color'`` at scale 1).
DECODE_FLAGS = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8
}
#: Resize filters that torch and Pillow both have (antialiased).
PIL_FILTERS = {
    'bilinear': Image.Resampling.BILINEAR,
    'bicubic': Image.Resampling.BICUBIC
}
EXIF_ORIENTATION = 0x0112
Box = Tuple[int, int, int, int]
Size = Tuple[int, int]


@TRANSFORMS.register_module()
class LoadImageBytes(BaseTransform):
    """Read an image file's bytes, undecoded, into ``img_bytes``.

    Args:
        backend_args: mmengine file backend arguments (as
            ``LoadImageFromFile``'s).
        ignore_empty: Return None for a file that cannot be read, instead
            of raising.
    """

    def __init__(self,
                 backend_args: Optional[dict] = None,
                 ignore_empty: bool = False) -> None:
        self.backend_args = None if backend_args is None \
            else backend_args.copy()
        self.ignore_empty = ignore_empty

    def transform(self, results: dict) -> Optional[dict]:
        """Add ``img_bytes`` (the file's contents) to ``results``."""
        try:
            results['img_bytes'] = fileio.get(
                results['img_path'], backend_args=self.backend_args)
        except Exception:
            if self.ignore_empty:
                return None
            raise
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(backend_args='
                f'{self.backend_args}, ignore_empty={self.ignore_empty})')


def _exif_orientation(data: bytes) -> int:
    """The EXIF orientation tag of an image file (1 when absent)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(image.getexif().get(EXIF_ORIENTATION, 1))
    except Exception:
        return 0  # unreadable: not known to be upright


def jpeg_header(data: bytes) -> Optional[Tuple[int, int, int]]:
    """(height, width, SOF marker) of an upright JPEG, from its frame header.

    Args:
        data: The file's bytes.

    Returns:
        The size OpenCV decodes to and the frame's start-of-frame marker
        (0xC0 baseline, 0xC2 progressive...), or None when ``data`` is not
        a JPEG, the header cannot be read, or EXIF rotates or mirrors the
        image.
    """
    if data[:2] != b'\xff\xd8':
        return None
    pos, exif, end = 2, False, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in STANDALONE_MARKERS:
            pos += 2
            continue
        if marker in SOF_MARKERS:
            height = int.from_bytes(data[pos + 5:pos + 7], 'big')
            width = int.from_bytes(data[pos + 7:pos + 9], 'big')
            if pos + 9 > end or height == 0 or width == 0:
                return None
            if exif and _exif_orientation(data) != 1:
                return None
            return height, width, marker
        if marker in (0xD9, 0xDA):  # end of image, start of scan
            return None
        exif |= marker == 0xE1 and data[pos + 4:pos + 10] == b'Exif\0\0'
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], 'big')
    return None


def jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) of an upright JPEG, read from its frame header.

    Args:
        data: The file's bytes.

    Returns:
        The size OpenCV decodes to, or None when ``data`` is not a JPEG,
        the header cannot be read, or EXIF rotates or mirrors the image.
    """
    header = jpeg_header(data)
    return None if header is None else header[:2]


def dct_scale(box: Box, size: Size) -> int:
    """The largest DCT scale (8, 4, 2, 1) at which ``box`` still holds at
    least ``size`` (height, width) pixels.

    Args:
        box: (top, left, height, width) at full scale.
        size: The output's (height, width).
    """
    for scale in (8, 4, 2):
        if box[2] >= scale * size[0] and box[3] >= scale * size[1]:
            return scale
    return 1


def decode(data: bytes, scale: int = 1) -> Optional[np.ndarray]:
    """Decode with OpenCV as ``LoadImageFromFile`` does (BGR uint8), at
    1/``scale`` of the size for a JPEG; None when OpenCV cannot."""
    return cv2.imdecode(np.frombuffer(data, np.uint8), DECODE_FLAGS[scale])


def resize_crop(image: np.ndarray, box: Box, size: Size,
                interpolation: str) -> np.ndarray:
    """Crop ``box`` out of ``image`` and resize it, antialiased.

    torch's uint8 kernel (Pillow's filters, vectorised) reads a view of the
    crop (no copy) and writes a CHW buffer, which ``PackInputs`` then takes
    as it is (no copy either).

    Args:
        image: HWC uint8.
        box: (top, left, height, width), integers.
        size: Output (height, width).
        interpolation: ``'bilinear'`` or ``'bicubic'``.

    Returns:
        HWC uint8, a view of a contiguous CHW array.
    """
    top, left, height, width = box
    crop = torch.from_numpy(image[top:top + height, left:left + width])
    out = F.interpolate(
        crop.permute(2, 0, 1)[None],
        size=tuple(size),
        mode=interpolation,
        antialias=True,
        align_corners=False)
    return out[0].contiguous().numpy().transpose(1, 2, 0)


def resize_scaled_crop(image: np.ndarray, box: Box, scale: int, size: Size,
                       interpolation: str) -> np.ndarray:
    """Resize ``box`` (full-scale pixels) of an image decoded at 1/scale.

    Reduced pixel ``j`` covers full-scale pixels ``[scale*j, scale*j +
    scale)``, so the box maps exactly to the fractional box ``box / scale``,
    which Pillow resamples (its filter reaching at most the reduced pixels
    the box touches, as a crop's edge bounds mmpretrain's resize).

    Returns:
        HWC uint8, contiguous.
    """
    top, left, height, width = (side / scale for side in box)
    row, col = int(top), int(left)
    rows = -(-(box[0] + box[2]) // scale) - row
    cols = -(-(box[1] + box[3]) // scale) - col
    patch = Image.fromarray(image[row:row + rows, col:col + cols])
    out = patch.resize(
        (size[1], size[0]),
        PIL_FILTERS[interpolation],
        box=(left - col, top - row, left - col + width, top - row + height))
    return np.array(out)


@TRANSFORMS.register_module()
class DecodeRandomResizedCrop(RandomResizedCrop):
    """``LoadImageFromFile`` + ``RandomResizedCrop`` (+ ``RandomFlip``),
    faster, with the same draws.

    Reads ``img_bytes`` (from :class:`LoadImageBytes`); without it, crops
    the decoded ``img`` (HWC) as ``RandomResizedCrop`` would. The box is
    drawn by ``RandomResizedCrop.rand_crop_params`` from the JPEG header's
    size. A baseline JPEG is then decoded at the largest DCT scale (1/8,
    1/4, 1/2) at which the box keeps at least ``scale`` pixels
    (``dct_scaling``, OpenCV, the whole file), else only in the box
    (``region_decode``, :mod:`.jpeg_region`: OpenCV's pixels of the box);
    anything else whole, by OpenCV. Then the horizontal flip is drawn as
    mmcv's ``RandomFlip(prob=flip_prob)`` draws it (one
    ``np.random.random_sample``, flipped below ``flip_prob``).

    Args:
        scale: Output size, ``(height, width)`` or one side.
        crop_ratio_range: Range of the crop's area over the image's.
        aspect_ratio_range: Range of the crop's aspect ratio.
        max_attempts: Draws before the central-crop fallback.
        interpolation: ``'bicubic'`` or ``'bilinear'`` (antialiased, as
            Pillow's, mmpretrain's ``backend='pillow'``).
        flip_prob: Probability of a horizontal flip (0: no draw).
        dct_scaling: Decode large JPEGs at reduced scale when the box allows.
        region_decode: Decode only the box of a baseline JPEG where the
            region decoder can be built (else, or False: whole files).
    """

    def __init__(self,
                 scale: Union[Sequence[int], int],
                 crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                 aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                 max_attempts: int = 10,
                 interpolation: str = 'bicubic',
                 flip_prob: float = 0.0,
                 dct_scaling: bool = True,
                 region_decode: bool = True) -> None:
        if interpolation not in PIL_FILTERS:
            raise ValueError('DecodeRandomResizedCrop: interpolation must be '
                             f'one of {sorted(PIL_FILTERS)}, got '
                             f'{interpolation!r}')
        if not 0.0 <= flip_prob <= 1.0:
            raise ValueError('DecodeRandomResizedCrop: flip_prob must be in '
                             f'[0, 1], got {flip_prob!r}')
        super().__init__(scale, crop_ratio_range, aspect_ratio_range,
                         max_attempts, interpolation, 'pillow')
        self.flip_prob = float(flip_prob)
        self.dct_scaling = bool(dct_scaling)
        self.region_decode = bool(region_decode)
        if self.region_decode:
            # Built (or found) now, in the process that builds the dataset:
            # forked workers inherit it, spawned ones load the cached build.
            jpeg_region.load()

    @property
    def region_decoder(self) -> Optional[ctypes.CDLL]:
        """The region decoder this transform uses (None: whole decodes).
        Not kept on the instance, which stays picklable."""
        return jpeg_region.load() if self.region_decode else None

    def box_for(self, height: int, width: int) -> Box:
        """``rand_crop_params`` for an image of this size (no pixels)."""
        return self.rand_crop_params(SimpleNamespace(shape=(height, width)))

    def decode_and_crop(self, data: bytes,
                        path: str) -> Tuple[np.ndarray, Size]:
        """Resized crop of the encoded image and its full (H, W)."""
        header = jpeg_header(data)
        size = None if header is None else header[:2]
        box = None if size is None else self.box_for(*size)
        scale = 1 if box is None or not self.dct_scaling else \
            dct_scale(box, self.scale)
        if scale > 1:
            image = decode(data, scale)
            reduced = tuple(-(-side // scale) for side in size)
            if image is not None and image.shape[:2] == reduced:
                return resize_scaled_crop(image, box, scale, self.scale,
                                          self.interpolation), size
        elif (box is not None and header[2] in SEQUENTIAL_HUFFMAN_MARKERS
              and data[-2:] == END_OF_IMAGE
              and (library := self.region_decoder) is not None):
            crop = jpeg_region.decode_region(library, data, size, box)
            if crop is not None:
                return resize_crop(crop, (0, 0, box[2], box[3]), self.scale,
                                   self.interpolation), size
        image = decode(data)
        if image is None:
            raise ValueError(f'failed to decode image: {path}')
        if image.shape[:2] != size:  # no usable header: the decoded size
            box = self.box_for(*image.shape[:2])
        return resize_crop(image, box, self.scale,
                           self.interpolation), image.shape[:2]

    def flip(self, results: dict, image: np.ndarray) -> np.ndarray:
        """Draw and apply the flip; sets ``flip`` and ``flip_direction``."""
        flip = bool(np.random.random_sample() < self.flip_prob)
        results['flip'] = flip
        results['flip_direction'] = 'horizontal' if flip else None
        return image[:, ::-1] if flip else image

    def transform(self, results: dict) -> dict:
        """Replace ``img_bytes`` (or ``img``) with the resized crop."""
        data = results.pop('img_bytes', None)
        if data is None:
            image = results['img']
            crop = resize_crop(image, self.box_for(*image.shape[:2]),
                               self.scale, self.interpolation)
        else:
            crop, results['ori_shape'] = self.decode_and_crop(
                data, results.get('img_path'))
        if self.flip_prob > 0:
            crop = self.flip(results, crop)
        results['img'] = crop
        results['img_shape'] = crop.shape
        return results

    def __repr__(self) -> str:
        return (super().__repr__()[:-1] + f', flip_prob={self.flip_prob}, '
                f'dct_scaling={self.dct_scaling}, '
                f'region_decode={self.region_decode})')
