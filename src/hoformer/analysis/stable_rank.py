"""Stable ranks."""

__all__: list[str] = []
