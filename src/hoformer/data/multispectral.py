"""Multispectral segmentation datasets."""

__all__: list[str] = []
