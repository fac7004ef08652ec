"""HOT task models."""

__all__: list[str] = []
