"""Base class of every registered model: safetensors + JSON weights, never pickle."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["HoformerModel", "from_pretrained", "atomic_write"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def atomic_write(path: str | os.PathLike, write_fn) -> None:
    """Call ``write_fn(tmp_path)`` then atomically rename onto ``path`` (no torn files on crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_fn(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class HoformerModel(nn.Module):
    """Mixin-style base: ``config`` is set by :func:`create_model`."""

    config: dict[str, Any]

    def example_inputs(self, batch_size: int = 2) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a valid ``forward`` call; drives the registry-wide tests."""
        raise NotImplementedError(f"{type(self).__name__} must implement example_inputs(batch_size)")

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        cfg = getattr(self, "config", None)
        if not cfg:
            raise ValueError("save_pretrained: model has no `config`; build it with hoformer.models.create_model")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # safetensors refuses shared storage; clone so tied weights round-trip.
        state = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(state, p, metadata={"format": "pt"}))
        payload = json.dumps({"hoformer_version": _version(), **cfg}, indent=2, sort_keys=True, default=_json_default)
        atomic_write(directory / CONFIG_NAME, lambda p: Path(p).write_text(payload))
        return directory


def _version() -> str:
    from hoformer import __version__

    return __version__


def _json_default(obj: Any):
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"save_pretrained: config value {obj!r} of type {type(obj).__name__} is not JSON-serialisable")


def from_pretrained(directory: str | os.PathLike, *, map_location: str | torch.device = "cpu", strict: bool = True):
    """Rebuild a model saved by :meth:`HoformerModel.save_pretrained` (safetensors, no unpickling)."""
    from safetensors.torch import load_file

    from .registry import create_model

    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"from_pretrained: expected {p.name} in {directory}, not found")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"from_pretrained: {cfg_path} is not valid JSON ({e})") from e
    if "name" not in cfg or "kwargs" not in cfg:
        raise ValueError(f"from_pretrained: {cfg_path} lacks the 'name'/'kwargs' keys written by save_pretrained")
    model = create_model(cfg["name"], **cfg["kwargs"])
    try:
        state = load_file(str(w_path), device=str(map_location))
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"from_pretrained: cannot read weights {w_path}: {e}") from e
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
    return model
