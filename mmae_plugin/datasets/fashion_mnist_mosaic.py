"""Mosaics of Fashion-MNIST items: a task that needs many directions."""
import os
from typing import List, Optional, Sequence, Union

import numpy as np
from mmpretrain.datasets import BaseDataset, FashionMNIST
from mmpretrain.registry import DATASETS

from mmae_plugin.utils.validation import check_choice, check_int
from .fashion_mnist import (DEFAULT_FASHION_MNIST_ROOT, IMAGE_SHAPE, SPLITS,
                            check_indices, check_indices_in_range, read_split)

#: Seed-sequence keys of the two splits: their item tables are independent.
SPLIT_KEYS = {'train': 0, 'test': 1}


def mosaic_items(num_items: int, num_mosaics: int, cells: int, seed: int,
                 split: str) -> np.ndarray:
    """Which item of the split fills each cell of each mosaic.

    Row ``i`` depends only on ``(seed, split, i)``: the table of ``n``
    mosaics is the first ``n`` rows of any longer one.

    Args:
        num_items: Items in the split.
        num_mosaics: Rows of the table.
        cells: Cells per mosaic (``grid ** 2``).
        seed: The dataset's seed.
        split: ``'train'`` or ``'test'``.

    Returns:
        int64 array (num_mosaics, cells), items drawn uniformly with
        replacement, cells in row-major order.
    """
    rng = np.random.default_rng([seed, SPLIT_KEYS[split]])
    return rng.integers(0, num_items, size=(num_mosaics, cells))


def compose_mosaic(images: np.ndarray, items: Sequence[int],
                   grid: int) -> np.ndarray:
    """The ``grid x grid`` image of ``items`` placed row by row.

    Args:
        images: All items of the split (N, h, w).
        items: ``grid ** 2`` item indices, row-major.
        grid: Cells per side.

    Returns:
        (grid * h, grid * w) array of ``images``' dtype.
    """
    tiles = images[np.asarray(items)]
    h, w = tiles.shape[1:]
    return tiles.reshape(grid, grid, h,
                         w).transpose(0, 2, 1, 3).reshape(grid * h, grid * w)


@DATASETS.register_module()
class FashionMNISTMosaic(BaseDataset):
    """``grid x grid`` mosaics of independent Fashion-MNIST items.

    Mosaic ``i`` holds ``grid ** 2`` items of ``split`` drawn uniformly with
    replacement by a generator of ``(seed, split)``, fixed per index. Its
    ``gt_label`` is one class per cell, row-major; ``cell_items`` names the
    items. The ``(28 grid, 28 grid)`` uint8 image is composed when a sample is
    read. See docs/mosaic.md. Example::

        train_dataloader = dict(dataset=dict(
            type='FashionMNISTMosaic', split='train', grid=2,
            pipeline=[dict(type='PackInputs')]))

    Args:
        data_root: Folder with the Fashion-MNIST IDX files (``.gz`` or not).
        split: ``'train'`` or ``'test'``.
        grid: Cells per side (>= 1).
        num_mosaics: Mosaics in the dataset (>= 1); default the number of
            items in the split (60,000 / 10,000).
        seed: Seed of the item table (>= 0).
        indices: As in :class:`~.GzipFashionMNIST` (a count >= 1 or a
            non-empty sequence of mosaic indices).
        **kwargs: Other arguments of mmpretrain's ``BaseDataset``
            (``pipeline``, ``test_mode``, ...).
    """
    METAINFO = {'classes': FashionMNIST.METAINFO['classes']}

    def __init__(self,
                 data_root: str = DEFAULT_FASHION_MNIST_ROOT,
                 split: str = 'train',
                 grid: int = 2,
                 num_mosaics: Optional[int] = None,
                 seed: int = 0,
                 indices: Optional[Union[int, Sequence[int]]] = None,
                 **kwargs) -> None:
        if not isinstance(data_root, (str, os.PathLike)):
            raise TypeError('data_root must be a path (str), got '
                            f'{type(data_root).__name__} {data_root!r}')
        check_choice(split, 'split', SPLITS)
        self.grid = check_int(grid, 'grid', minimum=1)
        if num_mosaics is not None:
            check_int(num_mosaics, 'num_mosaics', minimum=1)
        self.num_mosaics = num_mosaics
        self.seed = check_int(seed, 'seed', minimum=0)
        self.split = split
        check_indices(indices)
        for name in ('data_prefix', 'ann_file'):
            if name in kwargs:
                raise TypeError(f'FashionMNISTMosaic takes no {name} '
                                f'(got {kwargs[name]!r}): it reads the '
                                'IDX files of data_root')
        super().__init__(
            ann_file='',
            data_root=str(data_root),
            data_prefix=dict(root=''),
            indices=indices,
            **kwargs)

    def load_data_list(self) -> List[dict]:
        """One entry per mosaic: its items and cell labels."""
        images, labels = read_split(self.data_prefix['root'], self.split)
        self._images = images
        num_mosaics = self.num_mosaics or len(images)
        items = mosaic_items(
            len(images), num_mosaics, self.grid**2, self.seed, self.split)
        check_indices_in_range(self._indices, num_mosaics)
        cell_labels = labels[items].astype(np.int64)
        return [
            dict(cell_items=row, gt_label=row_labels)
            for row, row_labels in zip(items, cell_labels)
        ]

    def get_data_info(self, idx: int) -> dict:
        """The entry of mosaic ``idx`` with its composed ``img``."""
        info = super().get_data_info(idx)
        info['img'] = compose_mosaic(self._images, info['cell_items'],
                                     self.grid)
        return info

    @property
    def image_shape(self) -> tuple:
        """``(height, width)`` of every mosaic."""
        return tuple(self.grid * side for side in IMAGE_SHAPE)

    def get_gt_labels(self) -> np.ndarray:
        """Cell classes of every mosaic, (len, grid ** 2) int64 (read from
        the item table; no image is composed)."""
        return np.stack([
            super(FashionMNISTMosaic, self).get_data_info(i)['gt_label']
            for i in range(len(self))
        ])

    def get_cat_ids(self, idx: int) -> List[int]:
        """The distinct classes in mosaic ``idx``."""
        labels = super().get_data_info(idx)['gt_label']
        return sorted({int(label) for label in labels})

    def extra_repr(self) -> List[str]:
        return [
            f'Split: \t{self.split}', f'Grid: \t{self.grid} x {self.grid}',
            f'Seed: \t{self.seed}'
        ]
