"""Traffic training task."""

__all__: list[str] = []
