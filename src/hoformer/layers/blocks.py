"""Blocks, MLPs, patch embeddings."""

__all__: list[str] = []
