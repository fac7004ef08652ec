"""Metrics."""

__all__: list[str] = []
