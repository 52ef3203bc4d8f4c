from .fashion_mnist import DEFAULT_FASHION_MNIST_ROOT, GzipFashionMNIST

__all__ = ['DEFAULT_FASHION_MNIST_ROOT', 'GzipFashionMNIST']
