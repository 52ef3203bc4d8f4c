from .representation_statistics import RepresentationStatistics

__all__ = ['RepresentationStatistics']
