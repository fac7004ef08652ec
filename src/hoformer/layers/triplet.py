"""HOBA layers."""

__all__: list[str] = []
