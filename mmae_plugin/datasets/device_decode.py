"""The worker's half of decoding and cropping on the GPU (an option).

The recipe's pipeline (``LoadImageFromFile`` -> ``RandomResizedCrop`` ->
``RandomFlip`` -> ``PackInputs``) decodes and resizes every image on a
worker core: a few hundred images/s per core (docs/gpu_clusters.md), where
one H200 trains MAE ViT-B on several thousand. :class:`PackEncodedJpeg`
replaces that pipeline with what needs no pixels: it reads the file's bytes,
takes the size from the JPEG header, draws the recipe's crop box and flip
with the recipe's own random calls, and packs the encoded bytes.
:class:`~mmae_plugin.models.data_preprocessors.DeviceJpegDataPreprocessor`
then decodes the batch on the model's device
(``torchvision.io.decode_jpeg``), crops, resizes (bicubic, antialiased),
flips and normalises there. Images that are not baseline RGB or greyscale
JPEGs (PNG, CMYK) are decoded and cropped here on the CPU instead, as the
recipe does, and travel as pixels.

The boxes and flips are the recipe's draws (same ``np.random`` calls in the
same order); the pixels differ from the recipe's by the decoder and the
resampling (torchvision's antialiased bicubic, not Pillow's): a mean
absolute difference under 0.1 grey level, at most 2, on the tests'
photograph-like JPEGs (tests/test_device_decode.py).
"""
import io
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmpretrain.datasets.transforms import RandomResizedCrop
from mmpretrain.registry import TRANSFORMS
from mmpretrain.structures import DataSample

from mmae_plugin.utils.validation import check_real

__all__ = ['PackEncodedJpeg', 'DEVICE_DECODE_MODES']

#: PIL modes of JPEGs the device decoder takes (as RGB).
DEVICE_DECODE_MODES = ('RGB', 'L')
JPEG_MAGIC = b'\xff\xd8\xff'


@TRANSFORMS.register_module()
class PackEncodedJpeg(BaseTransform):
    """Read an image's bytes, draw the recipe's crop box and flip, pack.

    Output: ``inputs`` is the file's bytes as a 1-D uint8 tensor (a JPEG the
    device decodes), or, for other images, the crop already made here as a
    (3, scale, scale) uint8 RGB tensor; ``data_samples`` a ``DataSample``
    with ``crop_box`` (top, left, height, width), ``flip``, ``encoded`` and
    the image's shape. Use ``pseudo_collate`` (the tensors differ in size).

    Args:
        scale: Side of the square crop (the recipe's 224).
        crop_ratio_range, aspect_ratio_range, max_attempts: As in
            mmpretrain's ``RandomResizedCrop``, whose box sampling is used.
        flip_prob: Probability of a horizontal flip (``RandomFlip``'s
            ``prob``, drawn as it draws it).
        interpolation: Resampling of the CPU fallback (Pillow), as the
            recipe's ``RandomResizedCrop``.
    """

    def __init__(self,
                 scale: int = 224,
                 crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                 aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                 max_attempts: int = 10,
                 flip_prob: float = 0.5,
                 interpolation: str = 'bicubic') -> None:
        flip_prob = check_real(flip_prob, 'flip_prob', minimum=0, maximum=1)
        self.crop = RandomResizedCrop(
            scale=scale,
            crop_ratio_range=crop_ratio_range,
            aspect_ratio_range=aspect_ratio_range,
            max_attempts=max_attempts,
            interpolation=interpolation,
            backend='pillow')
        self.scale = scale
        self.flip_prob = flip_prob

    def draw_box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        """The recipe's random box (top, left, height, width) for a size."""
        shape_only = np.broadcast_to(np.uint8(0), (height, width, 3))
        return tuple(int(v) for v in self.crop.rand_crop_params(shape_only))

    def draw_flip(self) -> bool:
        """``RandomFlip(prob)``'s draw: the same ``np.random.choice``."""
        direction = np.random.choice(['horizontal', None],
                                     p=[self.flip_prob, 1 - self.flip_prob])
        return direction is not None

    def transform(self, results: Dict) -> Dict:
        """Pack one image (``results['img_path']``).

        Args:
            results: The dataset's item (``img_path``).

        Returns:
            ``dict(inputs=..., data_samples=...)``.
        """
        path = results['img_path']
        with open(path, 'rb') as f:
            data = f.read()
        mode, (width, height) = image_header(data)
        box = self.draw_box(height, width)
        flip = self.draw_flip()
        encoded = data.startswith(JPEG_MAGIC) and mode in DEVICE_DECODE_MODES
        if encoded:
            inputs = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            inputs = self.crop_on_cpu(data, box, flip)
        sample = DataSample(
            metainfo=dict(
                img_path=path,
                ori_shape=(height, width),
                crop_box=box,
                flip=flip,
                encoded=encoded,
                img_shape=(self.scale, self.scale)))
        return dict(inputs=inputs, data_samples=sample)

    def crop_on_cpu(self, data: bytes, box: Sequence[int],
                    flip: bool) -> torch.Tensor:
        """The recipe's crop of an image the device cannot decode, RGB."""
        import mmcv
        image = mmcv.imfrombytes(data, flag='color', channel_order='rgb')
        top, left, height, width = box
        image = mmcv.imcrop(
            image, np.array([left, top, left + width - 1, top + height - 1]))
        image = mmcv.imresize(
            image, (self.scale, self.scale),
            interpolation=self.crop.interpolation,
            backend='pillow')
        if flip:
            image = mmcv.imflip(image, direction='horizontal')
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(scale={self.scale}, crop_ratio_range='
                f'{self.crop.crop_ratio_range}, aspect_ratio_range='
                f'{self.crop.aspect_ratio_range}, flip_prob={self.flip_prob})')


def image_header(data: bytes) -> Tuple[Optional[str], Tuple[int, int]]:
    """``(PIL mode, (width, height))`` from the header alone."""
    from PIL import Image
    with Image.open(io.BytesIO(data)) as image:
        return image.mode, image.size
