"""Attention layers."""

__all__: list[str] = []
