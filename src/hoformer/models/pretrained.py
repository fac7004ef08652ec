"""Rebuild a model from a :meth:`~hoformer.models.HoformerModel.save_pretrained` directory (safetensors + JSON)."""
from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from pathlib import Path

import torch

from .base import (CONFIG_NAME, DIGEST_KEY, SAVE_ID_KEY, WEIGHTS_NAME, WEIGHTS_SHA256_KEY, HoformerModel, _sha256,
                   _version, config_digest)
from .registry import create_model, is_model, list_models

__all__ = ["from_pretrained", "model_from_config"]


def model_from_config(config: dict) -> HoformerModel:
    """A new model built from a ``model.config`` (``{"name": ..., "kwargs": {...}}``): ``create_model`` for a
    registered name, the class itself for a class path (see :func:`model_class`)."""
    if not isinstance(config, dict) or not isinstance(config.get("kwargs"), dict) or "name" not in config:
        raise ValueError(f"model_from_config: `config` must be a dict with 'name' and 'kwargs' (a model's "
                         f"`config`), got {config!r}")
    name = config["name"]
    cls = model_class(name)
    kwargs = cls.upgrade_kwargs(dict(config["kwargs"])) if hasattr(cls, "upgrade_kwargs") else config["kwargs"]
    return create_model(name, **kwargs) if is_model(name) else cls(**kwargs)


def model_class(name: str) -> type:
    """The class a configuration ``name`` denotes: a registered model name, or the ``module.QualName`` path of a
    :class:`HoformerModel` subclass (a module outside ``hoformer`` must already be imported: a file never makes
    hoformer import a module)."""
    if is_model(name):
        from .registry import model_entry

        return model_entry(name).cls
    module, _, qual = name.rpartition(".") if isinstance(name, str) else ("", "", "")
    if not module:
        raise ValueError(f"unknown model name {name!r}; expected a registered name {list_models()} or the "
                         f"'module.ClassName' path of a HoformerModel subclass")
    if module not in sys.modules and (module == "hoformer" or module.startswith("hoformer.")):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"model class path {name!r}: cannot import {module!r} ({e})") from e
    obj = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and issubclass(obj, HoformerModel)):
        raise ValueError(f"model class path {name!r} does not name a HoformerModel subclass (registered names: "
                         f"{list_models()}; a class outside hoformer needs its module imported first)")
    return obj


def _device(map_location) -> torch.device:
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"from_pretrained: `map_location` must be a device string or torch.device, "
                         f"got {map_location!r}") from e
    if device.type in ("cpu", "meta"):
        return device
    backend = getattr(torch, device.type, None)
    if device.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    available = backend is not None and callable(getattr(backend, "is_available", None)) and backend.is_available()
    count = backend.device_count() if available and callable(getattr(backend, "device_count", None)) else None
    if not available:
        raise ValueError(f"from_pretrained: `map_location` names device {str(device)!r}, but no {device.type} device "
                         f"is available on this machine (torch.{device.type}.is_available() is False); "
                         f"pass map_location='cpu'")
    if device.index is not None and count is not None and device.index >= count:
        raise ValueError(f"from_pretrained: `map_location` names device {str(device)!r}, but this machine has "
                         f"{count} {device.type} device(s) (indices 0..{count - 1})")
    return device


def _check_finite(state: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse weights holding NaN or infinity, naming the file, the first such tensor and how many there are."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        v = state[bad[0]]
        nan, inf = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
        more = f" (and {len(bad) - 1} more tensors: {bad[1:4]})" if len(bad) > 1 else ""
        raise ValueError(f"from_pretrained: {path} holds non-finite weights: tensor {bad[0]!r} {tuple(v.shape)} has "
                         f"{nan} NaN and {inf} infinite values{more}; expected finite numbers (the model would output "
                         f"NaN). Was it saved from a diverged run? Pass allow_nonfinite=True to load it anyway.")


def from_pretrained(directory: str | os.PathLike, *, map_location: str | torch.device = "cpu", strict: bool = True,
                    trust_edited_config: bool = False, allow_nonfinite: bool = False,
                    verify_weights: bool = True) -> HoformerModel:
    """Rebuild a model saved by :meth:`HoformerModel.save_pretrained` (safetensors, no unpickling).

    The model is built directly on ``map_location`` (a device string or :class:`torch.device` of this machine),
    loaded there and returned in eval mode (dropout off), like Hugging Face's ``from_pretrained``; call ``.train()``
    to fine-tune. A config written by another hoformer version triggers a warning naming both versions.

    The weights carry a digest of the configuration they were saved with: a ``config.json`` edited afterwards (for
    example ``attention`` product -> sum, which still fits the weights' shapes but is another model) is refused.
    ``trust_edited_config=True`` loads it anyway (with a warning), for a deliberate edit. Directories written before
    the digest existed load without the check.

    A weight holding NaN or infinity (a diverged run, a damaged file) is refused, naming the file and the tensor:
    the model would output NaN for every input. ``allow_nonfinite=True`` loads it anyway (to inspect it).

    ``config.json`` records the SHA-256 of ``model.safetensors`` (``weights_sha256``): weights changed after the
    save (a bit flipped by a copy or a disk, which no other check sees: the model just computes slightly different
    numbers) are refused, naming the file. ``verify_weights=False`` loads them anyway. Directories written before the
    digest existed load without the check.
    """
    from safetensors import safe_open

    device = _device(map_location)
    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not directory.is_dir():
        what = "a file" if directory.exists() else "not found"
        raise FileNotFoundError(f"from_pretrained: `directory` must be a save_pretrained directory holding "
                                f"{CONFIG_NAME} and {WEIGHTS_NAME}, got {str(directory)!r} ({what})")
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"from_pretrained: expected {p.name} in {directory}, not found")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"from_pretrained: {cfg_path} is not valid JSON ({e})") from e
    if not isinstance(cfg, dict) or "name" not in cfg or not isinstance(cfg.get("kwargs"), dict):
        raise ValueError(f"from_pretrained: {cfg_path} lacks the 'name'/'kwargs' keys written by save_pretrained")
    try:
        with safe_open(str(w_path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"from_pretrained: cannot read weights {w_path}: {e}") from e
    if not allow_nonfinite:
        _check_finite(state, w_path)
    cfg_id, w_id = cfg.get(SAVE_ID_KEY), meta.get(SAVE_ID_KEY)
    if (cfg_id is not None or w_id is not None) and cfg_id != w_id:
        raise ValueError(
            f"from_pretrained: {w_path.name} and {cfg_path.name} in {directory} come from different save_pretrained "
            f"calls (save_id {w_id!r} vs {cfg_id!r}): an interrupted save? Save the model again. If you replaced "
            f"{w_path.name} on purpose, delete the {SAVE_ID_KEY!r} key of {cfg_path.name}."
        )
    saved_digest = meta.get(DIGEST_KEY)
    if saved_digest is not None:
        try:
            found = config_digest(cfg)
        except (TypeError, ValueError):
            found = None
        if found != saved_digest:
            msg = (f"from_pretrained: {cfg_path} is not the configuration {w_path.name} was saved with (its "
                   f"{DIGEST_KEY!r} metadata is {saved_digest[:12]}..., the file's name/kwargs give "
                   f"{(found or 'no digest')[:12]}...): the file was edited, so the weights would run as another "
                   f"model. Restore the saved config.json, or pass trust_edited_config=True to load the edited one.")
            if not trust_edited_config:
                raise ValueError(msg)
            warnings.warn(msg.replace(", or pass trust_edited_config=True to load the edited one",
                                      "; loading it because trust_edited_config=True"), UserWarning, stacklevel=2)
    saved_version, installed = cfg.get("hoformer_version"), _version()
    if saved_version is not None and saved_version != installed:
        warnings.warn(
            f"from_pretrained: {cfg_path} was saved with hoformer {saved_version}, but hoformer {installed} is "
            f"installed; the model is rebuilt from the saved constructor arguments, check that it behaves as expected",
            UserWarning, stacklevel=2,
        )
    name = cfg["name"]
    try:
        if not is_model(name):
            model_class(name)
    except ValueError as e:
        raise ValueError(f"from_pretrained: {cfg_path}: {e}") from e
    try:
        with device:  # build directly on the target device (no CPU copy first)
            model = model_from_config(cfg)
    except TypeError as e:  # an argument this version of the model no longer takes (renamed / removed)
        raise ValueError(f"from_pretrained: {cfg_path} holds constructor arguments that {name!r} of hoformer "
                         f"{installed} does not accept ({e}); saved with hoformer {saved_version}") from e
    model.to(device)  # any tensor a constructor placed explicitly elsewhere
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches: the weights belong to another configuration
        raise ValueError(f"from_pretrained: weights in {w_path} do not fit model {name!r} built from "
                         f"{cfg_path}: {e}") from e
    if strict and (missing or unexpected):
        raise ValueError(
            f"from_pretrained: weights in {w_path} do not match model {name!r} built from config: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    want = cfg.get(WEIGHTS_SHA256_KEY)
    if verify_weights and want is not None:
        got = _sha256(w_path)
        if got != want:
            raise ValueError(
                f"from_pretrained: {w_path} is not the file save_pretrained wrote: its SHA-256 is {got[:16]}..., "
                f"{cfg_path.name} records {str(want)[:16]}... ({WEIGHTS_SHA256_KEY!r}); the weights were changed or "
                "damaged since (a copy or disk error flips bits that no other check sees). Copy or save the model "
                "again, or pass verify_weights=False to load these weights anyway.")
    return model.eval()
