"""HOBA text models."""

__all__: list[str] = []
