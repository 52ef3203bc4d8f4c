from .fashion_mnist import DEFAULT_FASHION_MNIST_ROOT, GzipFashionMNIST
from .fashion_mnist_mosaic import FashionMNISTMosaic
from .transforms import DecodeRandomResizedCrop, LoadImageBytes

__all__ = [
    'DEFAULT_FASHION_MNIST_ROOT', 'GzipFashionMNIST', 'FashionMNISTMosaic',
    'DecodeRandomResizedCrop', 'LoadImageBytes'
]
