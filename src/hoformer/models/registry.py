"""timm-style model registry: ``register_model``, ``create_model``, ``list_models``.

A registered entry is a callable (class or factory) returning a :class:`~hoformer.models.base.HoformerModel`.
``create_model`` records the name and the *fully bound* constructor arguments on the instance (``model.config``) so
that ``save_pretrained`` / ``from_pretrained`` can rebuild it without pickling, and so that a checkpoint keeps
rebuilding the same model when a default changes later.

What is recorded (see :func:`_bound_kwargs`):

* every keyword-bindable parameter of the registered class or factory: the value passed, else its default;
* for a factory taking ``**kwargs`` (``def traffic_hot(num_layers=2, **kwargs): return TrafficTransformer(...)``):
  the extra keyword arguments passed, plus the defaults of every parameter of the class it built that the factory
  neither passed to that class itself nor names as its own parameter (learned by recording the constructor call of
  the returned model);
* limits: a default that JSON cannot hold exactly is left out (rebuilt from the then-current default); tuples are
  stored as lists; the parameters behind a ``**kwargs`` of the *class* itself (forwarded to a base class) and those
  of a factory that returns a model it did not construct during the call are recorded only when passed explicitly.
"""
from __future__ import annotations

import copy
import fnmatch
import inspect
import json
from typing import Any, Callable

from .base import _record_constructions

__all__ = ["register_model", "create_model", "list_models", "is_model"]

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_model(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Decorator registering a model class or factory under ``name`` (default: the function's name).

    Registering the same callable twice under one name is a no-op; another callable under a taken name is a
    ``ValueError``.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"register_model: `name` must be a str, got {type(name).__name__}")
    if name == "":
        raise ValueError("register_model: `name` must be a non-empty str, got ''")

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError(f"register_model: expected a model class or factory, got {type(f).__name__}")
        key = name or getattr(f, "__name__")
        if key in _REGISTRY and _REGISTRY[key] is not f:
            raise ValueError(f"register_model: a model named {key!r} is already registered")
        _REGISTRY[key] = f
        return f

    return deco(fn) if fn is not None else deco


def is_model(name: str) -> bool:
    """Whether ``name`` is a registered model name (False for anything that is not a str)."""
    return isinstance(name, str) and name in _REGISTRY


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered model names matching the shell-style ``pattern`` (case-sensitive)."""
    if not isinstance(pattern, str):
        raise TypeError(f"list_models: `pattern` must be a str (shell-style, e.g. 'hot_*'), "
                        f"got {type(pattern).__name__}")
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def create_model(name: str, **kwargs: Any):
    """Build the registered model ``name`` with ``kwargs``; the fully bound call (passed arguments plus the defaults in
    force, see the module docstring) is recorded in ``model.config = {"name": ..., "kwargs": {...}}``."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"create_model: unknown model name {name!r}; available: {list_models()}")
    fn = _REGISTRY[name]
    with _record_constructions() as built:
        model = fn(**kwargs)
    model.config = {"name": name, "kwargs": _bound_kwargs(fn, kwargs, model, built)}
    return model


_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples -> lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _jsonable(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == _plain(value)
    except (TypeError, ValueError):
        return False


def _signature(obj: Any) -> inspect.Signature | None:
    """Call signature of a factory, or of a class's ``__init__`` without ``self`` (not ``inspect.signature(cls)``:
    before Python 3.11 that prefers ``HoformerModel.__new__(*args, **kwargs)``)."""
    try:
        if isinstance(obj, type):
            sig = inspect.signature(obj.__init__)
            return sig.replace(parameters=list(sig.parameters.values())[1:])
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _bound_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any], model: Any, built: list) -> dict[str, Any]:
    """The keyword arguments that rebuild ``model = fn(**kwargs)`` independently of later default changes."""
    sig = _signature(fn)
    if sig is None:
        return dict(kwargs)
    out: dict[str, Any] = {}
    var_kw: dict[str, Any] | None = None
    for pname, p in sig.parameters.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = {k: v for k, v in kwargs.items() if k not in sig.parameters or
                      sig.parameters[k].kind not in _KEYWORD_KINDS}
        elif p.kind in _KEYWORD_KINDS:
            if pname in kwargs:
                out[pname] = kwargs[pname]
            elif p.default is not p.empty and _jsonable(p.default):
                out[pname] = copy.deepcopy(p.default)
    if var_kw is None:
        return out
    call = next(((a, kw) for obj, a, kw in built if obj is model), None)
    cls_sig = _signature(type(model)) if call is not None and fn is not type(model) else None
    explicit: set[str] | None = None
    if cls_sig is not None:
        try:
            explicit = set(cls_sig.bind(*call[0], **call[1]).arguments)
        except TypeError:
            explicit = None
    if explicit is not None:
        for pname, p in cls_sig.parameters.items():
            # passed by the factory itself (e.g. positionally), or shadowed by a factory parameter of the same name
            if pname in explicit or pname in out or pname in var_kw or p.kind not in _KEYWORD_KINDS:
                continue
            if p.default is not p.empty and _jsonable(p.default):
                var_kw[pname] = copy.deepcopy(p.default)
    out.update(var_kw)
    return out
