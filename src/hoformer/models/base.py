"""Base class of every registered model: safetensors + JSON weights, never pickle."""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from hoformer._io import atomic_write, fsync_dir, mkdir, stage

__all__ = ["HoformerModel", "from_pretrained", "atomic_write"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
#: safetensors metadata key / config key pairing the two files of one ``save_pretrained`` call
SAVE_ID_KEY = "save_id"


# --------------------------------------------------------------------------- constructor-call recording
_CALLS = threading.local()


@contextlib.contextmanager
def _record_constructions() -> Iterator[list]:
    """Collect ``(instance, args, kwargs)`` of every :class:`HoformerModel` constructed in the block (this thread).

    Used by :func:`~hoformer.models.registry.create_model` to learn which class a ``**kwargs``-forwarding factory
    built and which constructor arguments it passed itself.
    """
    outer = getattr(_CALLS, "log", None)
    log: list = []
    _CALLS.log = log
    try:
        yield log
    finally:
        _CALLS.log = outer
        if outer is not None:  # a factory calling create_model: the outer call also sees these constructions
            outer.extend(log)


class HoformerModel(nn.Module):
    """Mixin-style base: ``config`` is set by :func:`create_model`."""

    config: dict[str, Any]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # keep inspect.signature(cls) = the constructor's signature (Python 3.10 would report __new__'s *args, **kwargs)
        sig = inspect.signature(cls.__init__)
        cls.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        log = getattr(_CALLS, "log", None)
        if log is not None:
            log.append((obj, args, kwargs))
        return obj

    def example_inputs(self, batch_size: int = 2) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a valid ``forward`` call; drives the registry-wide tests."""
        raise NotImplementedError(f"{type(self).__name__} must implement example_inputs(batch_size)")

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``model.safetensors`` and ``config.json`` into ``directory``.

        Crash safety: both files are first written and fsynced as hidden temporary files next to their targets, then
        renamed (weights, then config) and the directory is fsynced. Both files carry the same random ``save_id``
        (safetensors metadata / config key), so the only torn state a crash can leave -- new weights beside the
        previous config, between the two renames -- is refused by :func:`from_pretrained` with a clear error instead
        of silently loading mismatched weights. A failure before the renames leaves the previous save untouched.
        """
        from safetensors.torch import save_file

        cfg = getattr(self, "config", None)
        if not cfg:
            raise ValueError("save_pretrained: model has no `config`; build it with hoformer.models.create_model")
        save_id = uuid.uuid4().hex
        # serialise first: a config JSON cannot hold must fail before any file is touched
        payload = json.dumps({"hoformer_version": _version(), **cfg, SAVE_ID_KEY: save_id}, indent=2,
                             sort_keys=True, default=_json_default)
        directory = Path(directory)
        mkdir(directory)
        # safetensors refuses shared storage; clone so tied weights round-trip.
        state = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        w_path, c_path = directory / WEIGHTS_NAME, directory / CONFIG_NAME
        staged: list[str] = []
        try:
            staged.append(stage(w_path, lambda p: save_file(state, p, metadata={"format": "pt",
                                                                                 SAVE_ID_KEY: save_id})))
            staged.append(stage(c_path, lambda p: Path(p).write_text(payload)))
            os.replace(staged[0], w_path)
            os.replace(staged[1], c_path)
        finally:
            for tmp in staged:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        fsync_dir(directory)
        return directory


def hf_config(directory: str | os.PathLike) -> dict | None:
    """The ``config.json`` of a Hugging Face model directory (it has a ``model_type``; a :meth:`save_pretrained`
    one has ``name`` / ``kwargs`` instead), or ``None`` for anything else."""
    try:
        cfg = json.loads((Path(directory) / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) and "model_type" in cfg and "kwargs" not in cfg else None


#: Hugging Face model types whose learned positions start at ``pad_token_id + 1`` (RoBERTa's embeddings)
_PAD_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "roberta-prelayernorm", "camembert",
                               "longformer", "data2vec-text", "ibert", "mpnet", "luke", "markuplm", "xmod", "lilt"})
#: Hugging Face model types whose positions start at a fixed row
_FIXED_OFFSET_TYPES = {"nystromformer": 2, "yoso": 2, "mra": 2}


def hf_position_offset(cfg: dict) -> int:
    """First row of a Hugging Face config's learned position table that position 0 uses: ``pad_token_id + 1`` for
    the RoBERTa family (:data:`_PAD_OFFSET_TYPES`, ``pad_token_id`` 1 when unset), a fixed row for a few others
    (:data:`_FIXED_OFFSET_TYPES`), 0 for BERT and the rest."""
    kind = cfg.get("model_type")
    if kind in _FIXED_OFFSET_TYPES:
        return _FIXED_OFFSET_TYPES[kind]
    if kind not in _PAD_OFFSET_TYPES:
        return 0
    pad = cfg.get("pad_token_id")
    return (1 if pad is None else int(pad)) + 1


def _version() -> str:
    from hoformer import __version__

    return __version__


def _json_default(obj: Any):
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"save_pretrained: config value {obj!r} of type {type(obj).__name__} is not JSON-serialisable")


def from_pretrained(directory: str | os.PathLike, *, map_location: str | torch.device = "cpu", strict: bool = True):
    """Rebuild a model saved by :meth:`HoformerModel.save_pretrained` (safetensors, no unpickling).

    The model is built directly on ``map_location`` (a device string or :class:`torch.device`), loaded there and
    returned in eval mode (dropout off), like Hugging Face's ``from_pretrained``; call ``.train()`` to fine-tune.
    A config written by another hoformer version triggers a warning naming both versions.
    """
    from safetensors import safe_open

    from .registry import create_model

    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"from_pretrained: `map_location` must be a device string or torch.device, "
                         f"got {map_location!r}") from e
    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"from_pretrained: expected {p.name} in {directory}, not found")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"from_pretrained: {cfg_path} is not valid JSON ({e})") from e
    if not isinstance(cfg, dict) or "name" not in cfg or "kwargs" not in cfg:
        raise ValueError(f"from_pretrained: {cfg_path} lacks the 'name'/'kwargs' keys written by save_pretrained")
    try:
        with safe_open(str(w_path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"from_pretrained: cannot read weights {w_path}: {e}") from e
    cfg_id, w_id = cfg.get(SAVE_ID_KEY), meta.get(SAVE_ID_KEY)
    if (cfg_id is not None or w_id is not None) and cfg_id != w_id:
        raise ValueError(
            f"from_pretrained: {w_path.name} and {cfg_path.name} in {directory} come from different save_pretrained "
            f"calls (save_id {w_id!r} vs {cfg_id!r}): an interrupted save? Save the model again. If you replaced "
            f"{w_path.name} on purpose, delete the {SAVE_ID_KEY!r} key of {cfg_path.name}."
        )
    saved_version, installed = cfg.get("hoformer_version"), _version()
    if saved_version is not None and saved_version != installed:
        warnings.warn(
            f"from_pretrained: {cfg_path} was saved with hoformer {saved_version}, but hoformer {installed} is "
            f"installed; the model is rebuilt from the saved constructor arguments, check that it behaves as expected",
            UserWarning, stacklevel=2,
        )
    try:
        with device:  # build directly on the target device (no CPU copy first)
            model = create_model(cfg["name"], **cfg["kwargs"])
    except TypeError as e:  # an argument this version of the model no longer takes (renamed / removed)
        raise ValueError(f"from_pretrained: {cfg_path} holds constructor arguments that {cfg['name']!r} of hoformer "
                         f"{installed} does not accept ({e}); saved with hoformer {saved_version}") from e
    model.to(device)  # any tensor a constructor placed explicitly elsewhere
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches: the weights belong to another configuration
        raise ValueError(f"from_pretrained: weights in {w_path} do not fit model {cfg['name']!r} built from "
                         f"{cfg_path}: {e}") from e
    if strict and (missing or unexpected):
        raise ValueError(
            f"from_pretrained: weights in {w_path} do not match model {cfg['name']!r} built from config: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    return model.eval()
