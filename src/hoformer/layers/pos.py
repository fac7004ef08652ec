"""Positional encodings."""

__all__: list[str] = []
