from .token_pooling import (POOLINGS, TokenPoolingNeck, check_pooling,
                            pool_tokens)

__all__ = ['POOLINGS', 'TokenPoolingNeck', 'check_pooling', 'pool_tokens']
