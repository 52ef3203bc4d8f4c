"""Fashion-MNIST read straight from the gzipped IDX files as shipped."""
import os.path as osp
from typing import List, Optional

from mmpretrain.datasets import FashionMNIST
from mmpretrain.datasets.mnist import read_sn3_pascalvincent_tensor
from mmpretrain.registry import DATASETS

#: Where the Debian package ``dataset-fashion-mnist`` installs the files.
DEFAULT_FASHION_MNIST_ROOT = '/usr/share/datasets/fashion-mnist'


@DATASETS.register_module()
class GzipFashionMNIST(FashionMNIST):
    """mmpretrain's ``FashionMNIST`` that also reads the ``.gz`` files.

    mmpretrain's class wants decompressed files (and downloads by default);
    this one finds each IDX file decompressed or gzipped in ``data_root``,
    never writes there (so a read-only system folder works), honours
    ``split`` and, when the files are missing, says how to get them.

    Args:
        data_root: Folder with the four IDX files (``.gz`` or not).
        split: ``'train'`` (60,000 images) or ``'test'`` (10,000).
        download: Download with mmpretrain's downloader when missing.
        **kwargs: Other arguments of mmpretrain's ``BaseDataset``
            (``pipeline``, ``indices``, ``test_mode``...).
    """

    def __init__(self, data_root: str = DEFAULT_FASHION_MNIST_ROOT,
                 split: str = 'train', download: bool = False,
                 **kwargs) -> None:
        super().__init__(data_root=data_root, split=split, download=download,
                         **kwargs)

    def _locate(self, gz_name: str) -> Optional[str]:
        root = self.data_prefix['root']
        for name in (gz_name[:-len('.gz')], gz_name):
            if osp.isfile(osp.join(root, name)):
                return osp.join(root, name)
        return None

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
                    'train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz)'
                    ', t10k-images-idx3-ubyte(.gz) and t10k-labels-idx1-ubyte'
                    '(.gz). On Debian/Ubuntu: apt-get install -y '
                    f'dataset-fashion-mnist (installs {DEFAULT_FASHION_MNIST_ROOT})'
                    ', or set download=True with internet access.')
            self._download()
        files = self.train_list if self.split == 'train' else self.test_list
        # mmpretrain's reader decompresses '.gz' paths on the fly.
        images = read_sn3_pascalvincent_tensor(self._locate(files[0][0]))
        labels = read_sn3_pascalvincent_tensor(self._locate(files[1][0]))
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise ValueError(
                f'Fashion-MNIST files in {self.data_prefix["root"]!r} are '
                f'corrupt: images {tuple(images.shape)}, labels '
                f'{tuple(labels.shape)}')
        images, labels = images.numpy(), labels.numpy()
        return [
            dict(img=img, gt_label=int(label))
            for img, label in zip(images, labels)
        ]
