"""Triplet (3D) block attention (HOBA)."""

__all__: list[str] = []
