from .fast_crop_decode import DecodeRandomResizedCrop, LoadImageBytes

__all__ = ['DecodeRandomResizedCrop', 'LoadImageBytes']
