"""Long-term forecasting CSV datasets."""

__all__: list[str] = []
