"""Weaver building blocks: phase dictionary, ATk-pooling."""

__all__: list[str] = []
