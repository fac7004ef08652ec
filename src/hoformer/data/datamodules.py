"""Lightning datamodules for the HOT tasks."""

__all__: list[str] = []
