"""Base class of every model: its constructor's arguments are its configuration; weights are safetensors + JSON, never
pickle.

However a model is built -- ``create_model("hot_forecaster", dim=64)``, ``HOTForecaster(dim=64)`` in Python or by
jsonargparse from a ``class_path`` / ``init_args`` config -- it carries ``model.config = {"name": ..., "kwargs":
{...}}``: the registered name (see :mod:`hoformer.models.registry`; the class path for a class that is not
registered) and every constructor argument, defaults applied, as JSON values. That is what
:meth:`HoformerModel.save_pretrained` writes and :func:`~hoformer.models.from_pretrained` rebuilds from, so a saved
model keeps its architecture when a later release changes a default.

A model records it explicitly: its ``__init__`` calls ``self.record_config(locals())`` right after
``super().__init__(...)``, while ``locals()`` holds exactly the arguments. Constructors keep plain signatures (named,
type-annotated parameters, no ``*args``), which is what jsonargparse reads. A ``**kwargs`` is the parent's arguments,
forwarded: ``super().__init__(..., **kwargs)`` (how the HOT models share :class:`~hoformer.models.hot.HOTModel`'s
encoder settings). jsonargparse resolves such a signature the same way: :func:`constructor_signature`.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hoformer._io import explain_write_error, fsync_dir, mkdir, stage

__all__ = ["HoformerModel", "config_digest", "check_batch_input"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
#: safetensors metadata key / config key pairing the two files of one ``save_pretrained`` call
SAVE_ID_KEY = "save_id"
#: safetensors metadata key binding the weights to the configuration they were saved with (:func:`config_digest`)
DIGEST_KEY = "config_digest"
#: the ``config.json`` key of the SHA-256 of the tensor data of ``model.safetensors`` (hex, :func:`_sha256`), checked by
#: ``from_pretrained``
WEIGHTS_SHA256_KEY = "weights_sha256"


def _sha256(path) -> str:
    """SHA-256 (hex) of the tensor data of a safetensors file: the bytes after its JSON header. The header itself is
    not hashed: safetensors writes its metadata in no fixed order, so the same tensors give other header bytes; a
    damaged header fails to parse, or names shapes or dtypes that the load refuses."""
    import struct

    h = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) == 8:
            f.seek(8 + struct.unpack("<Q", head)[0])
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
#: class attribute (in the class's own ``__dict__``) listing ``(name, preset)`` registrations of that class
REGISTRATIONS_ATTR = "_hoformer_registrations"


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples -> lists); values JSON cannot hold are kept (refused when saved)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def constructor_signature(cls: type) -> inspect.Signature:
    """The parameters of ``cls(...)``: ``cls.__init__``'s without ``self``, where a ``**kwargs`` is forwarded to the
    parent's constructor (``super().__init__(..., **kwargs)``) and stands for the parent's parameters that the
    constructor does not name itself (keyword-only, with the parent's defaults; resolved up the MRO as jsonargparse
    does). A ``**kwargs`` left when no parent constructor takes named parameters stays in the signature."""
    return _resolve(cls)[0]


def _resolve(cls: type) -> tuple[inspect.Signature, tuple[str, ...]]:
    """(:func:`constructor_signature`, the names of the forwarded ``**kwargs`` along the way)."""
    params: dict[str, inspect.Parameter] = {}
    forwarded: list[str] = []
    var_kw: inspect.Parameter | None = None
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        own = list(inspect.signature(init).parameters.values())[1:]
        if klass is not cls and all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in own):
            break  # nn.Module / object: nothing named to forward to
        var_kw = None
        for p in own:
            if p.kind is p.VAR_KEYWORD:
                var_kw = p
            elif p.name not in params:
                params[p.name] = p if klass is cls or p.kind is p.VAR_POSITIONAL else p.replace(kind=p.KEYWORD_ONLY)
        if var_kw is None:
            break
        forwarded.append(var_kw.name)
    if var_kw is not None:  # forwarded to nothing that names its parameters
        forwarded.pop()
        params[var_kw.name] = var_kw
    order = sorted(params.values(), key=lambda p: p.kind)  # stable: each kind keeps the MRO order
    return inspect.Signature(order), tuple(forwarded)


def registered_name(cls: type, kwargs: dict[str, Any]) -> str:
    """The registered name of ``cls(**kwargs)``: the registration of ``cls`` whose preset arguments all equal the
    bound ones (the most specific one when several do), else the class path ``module.QualName``."""
    best: tuple[int, str] | None = None
    for name, preset in cls.__dict__.get(REGISTRATIONS_ATTR, ()):
        if all(k in kwargs and kwargs[k] == _plain(v) for k, v in preset.items()):
            if best is None or len(preset) > best[0]:
                best = (len(preset), name)
    return best[1] if best is not None else f"{cls.__module__}.{cls.__qualname__}"


def config_digest(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a model configuration's ``name`` and ``kwargs`` (sorted keys, no spaces, values
    as JSON reads them back): what :meth:`HoformerModel.save_pretrained` stores beside the weights so that
    :func:`~hoformer.models.from_pretrained` can tell an edited ``config.json`` from the one the weights were
    trained with."""
    canon = json.dumps({"name": config["name"], "kwargs": config["kwargs"]}, sort_keys=True, separators=(",", ":"),
                       ensure_ascii=True, allow_nan=False, default=_json_default)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


class HoformerModel(nn.Module):
    """Base of every task model: ``config`` (recorded by the constructor), ``example_inputs``, ``save_pretrained``.

    Subclasses take named, type-annotated constructor parameters with JSON-representable values (numbers, strings,
    bools, ``None``, lists / tuples and dicts of those), no ``*args`` (a ``**kwargs`` is forwarded to the parent's
    constructor, see :func:`constructor_signature`), and call ``self.record_config(locals())`` right after
    ``super().__init__(...)``.
    """

    config: dict[str, Any]

    @classmethod
    def upgrade_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The constructor arguments of a configuration saved by an earlier hoformer version, in today's names (a
        model whose arguments were renamed overrides this; :func:`~hoformer.models.model_from_config` calls it).
        Returns ``kwargs`` unchanged by default."""
        return kwargs

    def record_config(self, arguments: dict[str, Any]) -> None:
        """Set ``self.config`` from the constructor's ``arguments`` (its ``locals()`` before any other local is
        made): ``{"name": <registered name>, "kwargs": <every parameter of type(self)'s constructor>}``. Forwarded
        ``**kwargs`` count as the parent's parameters they name; a forwarded parameter not passed is recorded with
        its default (:func:`constructor_signature`).

        The configuration is that of ``type(self)``'s constructor: called from a parent's constructor that a subclass's
        runs (``super().__init__(...)``), whose ``arguments`` lack some of the subclass's parameters, it records
        nothing (the subclass records its own after)."""
        cls = type(self)
        signature, forwarded = _resolve(cls)
        given = {k: v for k, v in arguments.items() if k not in forwarded}
        for name in forwarded:
            given.update(arguments.get(name) or {})
        own = list(inspect.signature(cls.__init__).parameters)[1:]
        if not set(own) - set(forwarded) <= set(given):
            return
        kwargs: dict[str, Any] = {}
        for name, p in signature.parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}: a model's configuration is its named constructor arguments; "
                                f"`{'*' if p.kind is p.VAR_POSITIONAL else '**'}{name}` cannot be recorded")
            kwargs[name] = _plain(given[name] if name in given else p.default)
        self.config = {"name": registered_name(cls, kwargs), "kwargs": kwargs}

    def example_inputs(self, batch_size: int = 2) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a valid ``forward`` call; drives the registry-wide tests."""
        raise NotImplementedError(f"{type(self).__name__} must implement example_inputs(batch_size)")

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``model.safetensors`` and ``config.json`` into ``directory`` (created if missing).

        The weights' metadata carries :func:`config_digest` of the configuration, so that
        :func:`~hoformer.models.from_pretrained` refuses a ``config.json`` edited afterwards; ``config.json`` carries
        the SHA-256 of ``model.safetensors`` (``weights_sha256``), so that it refuses weights changed afterwards (a
        bit flipped by a copy, a truncated transfer).

        Crash safety: both files are first written and fsynced as hidden temporary files next to their targets, then
        renamed (weights, then config) and the directory is fsynced. Both files carry the same random ``save_id``
        (safetensors metadata / config key), so the only torn state a crash can leave -- new weights beside the
        previous config, between the two renames -- is refused by :func:`from_pretrained` with a clear error instead
        of silently loading mismatched weights. A failure before the renames leaves the previous save untouched.
        """
        from safetensors.torch import save_file

        cfg = getattr(self, "config", None)
        if not isinstance(cfg, dict) or "name" not in cfg or "kwargs" not in cfg:
            raise ValueError(f"save_pretrained: {type(self).__name__} has no `config` with 'name' and 'kwargs' "
                             f"(its constructor records it: call self.record_config(locals()) right after "
                             f"super().__init__(); got {cfg!r})")
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise FileExistsError(f"save_pretrained: `directory` must be a directory (or a path that does not exist "
                                  f"yet), got the existing file {str(directory)!r}")
        save_id = uuid.uuid4().hex
        # serialise first: a config JSON cannot hold must fail before any file is touched
        payload = json.dumps({"hoformer_version": _version(), **cfg, SAVE_ID_KEY: save_id}, indent=2,
                             sort_keys=True, default=_json_default)
        digest = config_digest(json.loads(payload))
        mkdir(directory)
        # safetensors refuses shared storage; clone so tied weights round-trip.
        state = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        w_path, c_path = directory / WEIGHTS_NAME, directory / CONFIG_NAME
        meta = {"format": "pt", SAVE_ID_KEY: save_id, DIGEST_KEY: digest}
        staged: list[str] = []
        try:
            for path, write in ((w_path, lambda p: save_file(state, p, metadata=meta)),
                                (c_path, lambda p: Path(p).write_text(payload))):
                try:
                    staged.append(stage(path, write))
                except Exception as e:  # noqa: BLE001 - a full disk, a file-size limit: named with the file
                    raise explain_write_error(path, e) from e
                if path == w_path:  # the weights' SHA-256, checked by from_pretrained (a bit flipped on a copy)
                    payload = json.dumps({**json.loads(payload), WEIGHTS_SHA256_KEY: _sha256(staged[0])}, indent=2,
                                         sort_keys=True)
            os.replace(staged[0], w_path)
            os.replace(staged[1], c_path)
        finally:
            for tmp in staged:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        fsync_dir(directory)
        return directory


def check_batch_input(model: nn.Module, x: torch.Tensor, fn: str, arg: str = "x", legend: str = "") -> None:
    """The model-level checks of a floating-point input batch ``x`` (shape checks are the caller's): at least one
    sample, and the dtype of the model's weights (outside autocast, which casts per operation)."""
    if x.ndim and x.shape[0] == 0:
        raise ValueError(f"{fn}: `{arg}` has an empty batch (B = 0); expected at least one sample{legend}, "
                         f"got shape {tuple(x.shape)}")
    if torch.is_autocast_enabled(x.device.type):
        return
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is not None and x.dtype != weight.dtype:
        raise TypeError(f"{fn}: `{arg}` is {x.dtype} but the model's weights are {weight.dtype}; convert one to the "
                        f"other: x.to({weight.dtype}) or model.to({x.dtype})")


def _version() -> str:
    from hoformer import __version__

    return __version__


def _json_default(obj: Any):
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"save_pretrained: config value {obj!r} of type {type(obj).__name__} is not JSON-serialisable")
