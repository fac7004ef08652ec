"""Weaver models and traffic baselines."""

__all__: list[str] = []
