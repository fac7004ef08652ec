"""Traffic datasets."""

__all__: list[str] = []
