"""HOT Lightning tasks and datamodules."""

__all__: list[str] = []
