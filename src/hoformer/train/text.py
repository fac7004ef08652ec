"""Text training task and distillation."""

__all__: list[str] = []
