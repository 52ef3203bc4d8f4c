"""GzipFashionMNIST on the real files shipped by dataset-fashion-mnist."""
import gzip
import shutil

import numpy as np
import pytest
from mmpretrain.registry import DATASETS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.datasets import DEFAULT_FASHION_MNIST_ROOT

FILES = [
    'train-images-idx3-ubyte', 'train-labels-idx1-ubyte',
    't10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'
]


def build(**kwargs):
    return DATASETS.build(dict(type='GzipFashionMNIST', **kwargs))


def test_splits_have_the_published_sizes_and_labels():
    test = build(split='test')
    assert len(test) == 10000
    labels = np.array(
        [test.get_data_info(i)['gt_label'] for i in range(len(test))])
    assert np.bincount(labels).tolist() == [1000] * 10  # balanced test set
    sample = test.get_data_info(0)
    assert sample['img'].shape == (28, 28) and sample['img'].dtype == np.uint8
    assert len(test.metainfo['classes']) == 10
    assert len(build(split='train', indices=300)) == 300


def test_gzipped_and_decompressed_files_give_the_same_data(tmp_path):
    for name in FILES:
        with gzip.open(f'{DEFAULT_FASHION_MNIST_ROOT}/{name}.gz') as src, \
                open(tmp_path / name, 'wb') as dst:
            shutil.copyfileobj(src, dst)
    plain = build(data_root=str(tmp_path), split='test', indices=50)
    gz = build(split='test', indices=50)
    for i in range(50):
        a, b = plain.get_data_info(i), gz.get_data_info(i)
        assert np.array_equal(a['img'], b['img'])
        assert a['gt_label'] == b['gt_label']


def test_train_split_differs_from_test_split():
    # mmpretrain's own class picks the split from test_mode only.
    train, test = build(
        split='train', indices=5), build(
            split='test', indices=5)
    assert not np.array_equal(
        train.get_data_info(0)['img'],
        test.get_data_info(0)['img'])


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(
            FileNotFoundError,
            match=r"data_root='.*'.*apt-get install -y "
            r'dataset-fashion-mnist'):
        build(data_root=str(tmp_path))
