"""timm-style model registry: ``register_model``, ``create_model``, ``list_models``.

A registered entry is a callable (class or factory) returning a :class:`~hoformer.models.base.HoformerModel`.
``create_model`` records the name and keyword arguments on the instance (``model.config``) so that
``save_pretrained`` / ``from_pretrained`` can rebuild it without pickling.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable

__all__ = ["register_model", "create_model", "list_models", "is_model"]

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_model(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Decorator registering a model class or factory under ``name`` (default: the function's name)."""

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        key = name or getattr(f, "__name__")
        if key in _REGISTRY and _REGISTRY[key] is not f:
            raise ValueError(f"register_model: a model named {key!r} is already registered")
        _REGISTRY[key] = f
        return f

    return deco(fn) if fn is not None else deco


def is_model(name: str) -> bool:
    return name in _REGISTRY


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered model names matching the shell-style ``pattern``."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def create_model(name: str, **kwargs: Any):
    """Build the registered model ``name`` with ``kwargs``; the call is recorded in ``model.config``."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"create_model: unknown model name {name!r}; available: {list_models()}")
    model = _REGISTRY[name](**kwargs)
    model.config = {"name": name, "kwargs": dict(kwargs)}
    return model
