"""timm-style model registry: ``register_model``, ``create_model``, ``list_models``, ``is_model``.

A registered model is a :class:`~hoformer.models.base.HoformerModel` subclass plus preset constructor arguments (as
:data:`hoformer.layers.ATTENTION_TYPES` pairs a layer class with its arguments): ``hot_forecaster`` is
``HOTForecaster`` with no preset, ``traffic_hot`` is ``TrafficTransformer`` with ``layout="kronecker"``.
``create_model(name, **kwargs)`` calls ``cls(**preset, **kwargs)``; the model's constructor records its
configuration (``self.record_config(locals())``, :mod:`hoformer.models.base`), named ``name``.
"""
from __future__ import annotations

import difflib
import fnmatch
from typing import Any, NamedTuple

from .base import REGISTRATIONS_ATTR, HoformerModel, constructor_signature

__all__ = ["register_model", "create_model", "list_models", "is_model", "model_entry", "ModelEntry"]


class ModelEntry(NamedTuple):
    """A registered model: its class and the constructor arguments the name fixes."""

    cls: type
    preset: dict[str, Any]


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(cls: type | None = None, *, name: str | None = None, preset: dict[str, Any] | None = None):
    """Register the :class:`~hoformer.models.base.HoformerModel` subclass ``cls`` under ``name`` (default: the class
    name) with the constructor arguments ``preset`` fixed. Usable as a decorator (``@register_model(name="x")``) or
    called (``register_model(TrafficTransformer, name="traffic_hot", preset={"layout": "kronecker"})``); returns
    ``cls``.

    Registering the same class and preset twice under one name is a no-op; anything else under a taken name is a
    ``ValueError``.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"register_model: `name` must be a str, got {type(name).__name__}")
    if name == "":
        raise ValueError("register_model: `name` must be a non-empty str, got ''")
    if preset is not None and not (isinstance(preset, dict) and all(isinstance(k, str) for k in preset)):
        raise TypeError(f"register_model: `preset` must be a dict of constructor arguments, got {preset!r}")

    def deco(c: type) -> type:
        if not (isinstance(c, type) and issubclass(c, HoformerModel)):
            raise TypeError(f"register_model: expected a HoformerModel subclass (a model class; fixed arguments go in "
                            f"`preset`), got {c!r}")
        params = constructor_signature(c).parameters
        unknown = sorted(set(preset or {}) - set(params))
        if unknown:
            raise ValueError(f"register_model: `preset` names {unknown}, which {c.__name__} does not take; "
                             f"its parameters: {list(params)}")
        key = name or c.__name__
        entry = ModelEntry(c, dict(preset or {}))
        if key in _REGISTRY:
            if _REGISTRY[key] != entry:
                raise ValueError(f"register_model: a model named {key!r} is already registered")
            return c
        _REGISTRY[key] = entry
        # the class lists its own registrations, so that a model built directly from the class knows its name
        setattr(c, REGISTRATIONS_ATTR, c.__dict__.get(REGISTRATIONS_ATTR, ()) + ((key, entry.preset),))
        return c

    return deco(cls) if cls is not None else deco


def is_model(name: str) -> bool:
    """Whether ``name`` is a registered model name (False for anything that is not a str)."""
    return isinstance(name, str) and name in _REGISTRY


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered model names matching the shell-style ``pattern`` (case-sensitive)."""
    if not isinstance(pattern, str):
        raise TypeError(f"list_models: `pattern` must be a str (shell-style, e.g. 'hot_*'), "
                        f"got {type(pattern).__name__}")
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def model_entry(name: str) -> ModelEntry:
    """The class and preset arguments registered under ``name``."""
    if not is_model(name):
        close = difflib.get_close_matches(str(name), list_models(), n=3)
        raise ValueError(f"create_model: unknown model name {name!r}"
                         + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "")
                         + f"; available: {list_models()}")
    return _REGISTRY[name]


def create_model(name: str, **kwargs: Any) -> HoformerModel:
    """Build the registered model ``name``: ``cls(**preset, **kwargs)``. ``kwargs`` may repeat a preset argument with
    the preset's value (a saved configuration lists every argument) but not change it. ``model.config`` is
    ``{"name": name, "kwargs": <every constructor argument, defaults applied>}``."""
    cls, preset = model_entry(name)
    clash = {k: v for k, v in kwargs.items() if k in preset and _same(v, preset[k]) is False}
    if clash:
        raise ValueError(f"create_model: {name!r} is {cls.__name__} with {preset}; it cannot take {clash} "
                         f"(build {cls.__module__}.{cls.__name__} directly for other values)")
    params = constructor_signature(cls).parameters  # without self
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            names = list(params)
            said = [f"{k!r}" + (f" (did you mean {h[0]!r}?)" if (h := difflib.get_close_matches(k, names, n=1)) else "")
                    for k in unknown]
            raise TypeError(f"create_model: {name!r} ({cls.__name__}) has no argument {', '.join(said)}; its "
                            f"arguments: {names}")
    model = cls(**{**preset, **kwargs})
    if not isinstance(getattr(model, "config", None), dict):
        raise TypeError(f"create_model: {cls.__name__} recorded no configuration: its __init__ must call "
                        f"self.record_config(locals()) right after super().__init__()")
    model.config["name"] = name
    return model


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (a tuple equals the list with the same items)."""
    norm = (lambda v: [norm(x) for x in v] if isinstance(v, (list, tuple)) else v)  # noqa: E731
    return norm(a) == norm(b)
