"""MedMNIST3D datasets."""

__all__: list[str] = []
