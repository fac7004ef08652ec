"""Weaver layers."""

__all__: list[str] = []
