"""Fashion-MNIST read straight from the gzipped IDX files as shipped."""
import gzip
import os
import os.path as osp
import zlib
from typing import List, Optional, Sequence, Union

import numpy as np
from mmpretrain.datasets import FashionMNIST
from mmpretrain.registry import DATASETS

from mmae_plugin.utils.validation import check_bool, check_choice, check_int

#: Where the Debian package ``dataset-fashion-mnist`` installs the files.
DEFAULT_FASHION_MNIST_ROOT = '/usr/share/datasets/fashion-mnist'
SPLITS = ('train', 'test')
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
#: IDX type code of unsigned bytes, the only type Fashion-MNIST uses.
IDX_UBYTE = 0x08


class CorruptDataError(ValueError):
    """A data file that exists but cannot be what it claims to be."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f'corrupt Fashion-MNIST file {path!r}: {problem}')


def read_file_bytes(path: str) -> bytes:
    """All bytes of ``path``, decompressed when it ends in ``.gz``."""
    try:
        if path.endswith('.gz'):
            with gzip.open(path, 'rb') as f:
                return f.read()
        with open(path, 'rb') as f:
            return f.read()
    except gzip.BadGzipFile as err:
        raise CorruptDataError(path, f'not a gzip file ({err})') from None
    except EOFError:
        raise CorruptDataError(
            path, 'truncated gzip stream (it ends before '
            'the end-of-stream marker)') from None
    except zlib.error as err:
        raise CorruptDataError(path, f'damaged gzip data ({err})') from None


def read_idx_ubyte(path: str, ndim: int) -> np.ndarray:
    """An IDX array of unsigned bytes with ``ndim`` dimensions, checked.

    IDX: two zero bytes, the type code (0x08 = unsigned byte), the number of
    dimensions, one big-endian uint32 per dimension, then the data.

    Args:
        path: File, decompressed or ``.gz``.
        ndim: Expected number of dimensions.

    Returns:
        Read-only uint8 array of the header's shape.
    """
    data = read_file_bytes(path)
    if not data:
        raise CorruptDataError(path, 'the file is empty')
    header = 4 + 4 * ndim
    if len(data) < header:
        raise CorruptDataError(
            path, f'{len(data)} bytes, too short for the '
            f'{header}-byte IDX header')
    magic = int.from_bytes(data[:4], 'big')
    expected = (IDX_UBYTE << 8) | ndim
    if magic != expected:
        raise CorruptDataError(
            path, f'bad IDX magic number 0x{magic:08x}, expected '
            f'0x{expected:08x} (unsigned bytes, {ndim} dimensions)')
    shape = tuple(
        int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    size = int(np.prod(shape))
    if len(data) - header != size:
        raise CorruptDataError(
            path, f'the header announces shape {shape} ({size} bytes of '
            f'data) but the file holds {len(data) - header} (truncated?)')
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


@DATASETS.register_module()
class GzipFashionMNIST(FashionMNIST):
    """mmpretrain's ``FashionMNIST`` that also reads the ``.gz`` files.

    Finds each IDX file decompressed or gzipped in ``data_root``, never writes
    there (a read-only folder works), honours ``split`` and says how to get
    missing files. A data file that is empty, truncated, not gzip, has a bad
    IDX header or labels outside 0..9 is refused, naming the file.

    Args:
        data_root: Folder with the four IDX files (``.gz`` or not).
        split: ``'train'`` (60,000 images) or ``'test'`` (10,000).
        download: Download with mmpretrain's downloader when missing (a
            bool).
        indices: ``None`` (all), a count ``n >= 1`` (the first ``n``), or a
            non-empty sequence of indices in ``[0, len)`` (``0`` and ``[]``
            are refused).
        **kwargs: Other arguments of mmpretrain's ``BaseDataset``
            (``pipeline``, ``test_mode``...).
    """

    def __init__(self,
                 data_root: str = DEFAULT_FASHION_MNIST_ROOT,
                 split: str = 'train',
                 download: bool = False,
                 indices: Optional[Union[int, Sequence[int]]] = None,
                 **kwargs) -> None:
        if not isinstance(data_root, (str, os.PathLike)):
            raise TypeError('data_root must be a path (str), got '
                            f'{type(data_root).__name__} {data_root!r}')
        check_choice(split, 'split', SPLITS)
        check_bool(download, 'download')
        check_indices(indices)
        super().__init__(
            data_root=str(data_root),
            split=split,
            download=download,
            indices=indices,
            **kwargs)

    def _locate(self, gz_name: str) -> Optional[str]:
        return locate_idx_file(self.data_prefix['root'], gz_name)

    def _check_exists(self) -> bool:
        return all(
            self._locate(name) for name, _ in self.train_list + self.test_list)

    def load_data_list(self) -> List[dict]:
        """Read images (28, 28) uint8 and labels of ``self.split``."""
        if not self._check_exists():
            if not self.download:
                raise FileNotFoundError(
                    f'Fashion-MNIST not found in data_root='
                    f"{self.data_prefix['root']!r}: it needs "
                    'train-images-idx3-ubyte(.gz), '
                    'train-labels-idx1-ubyte(.gz), t10k-images-idx3-ubyte(.gz)'
                    ' and t10k-labels-idx1-ubyte'
                    '(.gz). On Debian/Ubuntu: apt-get install -y '
                    'dataset-fashion-mnist (installs '
                    f'{DEFAULT_FASHION_MNIST_ROOT})'
                    ', or set download=True with internet access.')
            self._download()
        files = self.train_list if self.split == 'train' else self.test_list
        images, labels = self._read_checked(
            self._locate(files[0][0]), self._locate(files[1][0]))
        check_indices_in_range(self._indices, len(labels))
        return [
            dict(img=img, gt_label=int(label))
            for img, label in zip(images, labels)
        ]

    @staticmethod
    def _read_checked(image_path: str, label_path: str):
        """Images (N, 28, 28) and labels (N,) in 0..9, or a clear error."""
        images = read_idx_ubyte(image_path, ndim=3)
        labels = read_idx_ubyte(label_path, ndim=1)
        if images.shape[1:] != IMAGE_SHAPE:
            raise CorruptDataError(
                image_path, f'images of shape {images.shape[1:]}, expected '
                f'{IMAGE_SHAPE}')
        if len(images) != len(labels):
            raise CorruptDataError(
                label_path, f'{len(labels)} labels for the {len(images)} '
                f'images of {image_path!r}')
        bad = labels >= NUM_CLASSES
        if bad.any():
            raise CorruptDataError(
                label_path, f'{int(bad.sum())} label(s) out of range (e.g. '
                f'{int(labels[bad][0])} at index {int(bad.argmax())}); '
                f'allowed 0..{NUM_CLASSES - 1}')
        return images, labels


def locate_idx_file(root: str, gz_name: str) -> Optional[str]:
    """``root/gz_name`` decompressed if that file exists, else gzipped if
    that exists, else None."""
    for name in (gz_name[:-len('.gz')], gz_name):
        if osp.isfile(osp.join(root, name)):
            return osp.join(root, name)
    return None


def read_split(data_root: str, split: str):
    """Images (N, 28, 28) uint8 and labels (N,) of one split, checked.

    Args:
        data_root: Folder with the IDX files (``.gz`` or not).
        split: ``'train'`` or ``'test'``.

    Returns:
        ``(images, labels)``, read-only uint8 arrays.

    Raises:
        FileNotFoundError: Naming the folder and how to get the files.
        CorruptDataError: For a damaged file (see :func:`read_idx_ubyte`).
    """
    check_choice(split, 'split', SPLITS)
    files = (
        FashionMNIST.train_list
        if split == 'train' else FashionMNIST.test_list)
    paths = [locate_idx_file(data_root, name) for name, _ in files]
    if None in paths:
        raise FileNotFoundError(
            f'Fashion-MNIST {split} split not found in data_root='
            f'{data_root!r}: it needs {files[0][0]} and {files[1][0]} '
            '(or their decompressed forms). On Debian/Ubuntu: apt-get '
            f'install -y dataset-fashion-mnist (installs '
            f'{DEFAULT_FASHION_MNIST_ROOT}).')
    return GzipFashionMNIST._read_checked(*paths)


def check_indices(indices) -> None:
    """Refuse ``indices`` that mmengine would misread (e.g. -3 = last 3)
    or that select no sample (``0``, ``[]``)."""
    if indices is None:
        return
    if isinstance(indices, (list, tuple, range, np.ndarray)):
        if len(indices) == 0:
            raise ValueError(
                f'indices={indices!r} selects no image; use a non-empty '
                'sequence of indices >= 0, a count >= 1 (the first n '
                'images) or None (all)')
        for position, index in enumerate(indices):
            check_int(index, f'indices[{position}]', minimum=0)
        return
    try:
        check_int(indices, 'indices', minimum=0)
    except TypeError:
        raise TypeError('indices must be None, a count >= 1 or a sequence of '
                        f'indices >= 0, got {type(indices).__name__} '
                        f'{indices!r}') from None
    if indices == 0:
        # mmengine reads an int as "the first n samples": 0 is none, and
        # its serialisation then fails with "need at least one array to
        # concatenate".
        raise ValueError(
            'indices=0 selects no image (a count means the first n images); '
            'use a count >= 1, a non-empty sequence of indices or None (all)')


def check_indices_in_range(indices, length: int) -> None:
    """Refuse counts beyond the split and indices past its end."""
    if indices is None:
        return
    if isinstance(indices, (list, tuple, range, np.ndarray)):
        too_large = [int(i) for i in indices if i >= length]
        if too_large:
            raise ValueError(f'indices {too_large[:5]} out of range for a '
                             f'split of {length} images (allowed 0..'
                             f'{length - 1})')
    elif indices > length:
        raise ValueError(f'indices={indices} asks for more than the '
                         f'{length} images of the split')
