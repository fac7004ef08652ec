"""Loading trained models and their data: the one place that reads Lightning checkpoints and ``save_pretrained``
folders (used by ``hoformer analyze``, ``hoformer forecast``, ``hoformer test`` and the Python API).

* :func:`load_checkpoint` - ``(model, info)`` from a Lightning ``.ckpt`` of a :class:`~hoformer.train.TaskModule` or a
  ``save_pretrained`` folder; Lightning checkpoints load with ``weights_only=True`` (nothing is unpickled).
* :func:`model_spec` - the registered model name and constructor arguments a checkpoint's hyper-parameters record.
  Every layout hoformer has written is read: ``model_name`` / ``model_kwargs`` (tasks configured by registry name)
  and ``model_config`` (tasks given a model instance: its ``config``, ``{"name", "kwargs"}``).
* :func:`build_datamodule`, :func:`checkpoint_datamodule` - the datamodule a checkpoint was trained on (from a
  config, a class path, or what the checkpoint / its run folder stored).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

__all__ = ["load_checkpoint", "model_spec", "build_datamodule", "checkpoint_datamodule", "find_run_file"]


def model_spec(hparams: dict, where: str = "checkpoint") -> tuple[str, dict]:
    """``(registered model name, constructor kwargs)`` recorded in a task's hyper-parameters."""
    cfg = hparams.get("model_config")
    if isinstance(cfg, dict) and "name" in cfg:
        return str(cfg["name"]), dict(cfg.get("kwargs") or {})
    if "model_name" in hparams:
        return str(hparams["model_name"]), dict(hparams.get("model_kwargs") or {})
    raise ValueError(f"load_checkpoint: {where} records no model (no 'model_config' or 'model_name' "
                     f"hyper-parameter: was it written by a hoformer TaskModule?); found {sorted(hparams)[:10]}")


def load_checkpoint(path, map_location: str = "cpu", model_args: dict | None = None
                    ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``(model, info)`` from a Lightning ``.ckpt`` (``hyper_parameters`` with ``model_name`` / ``model_kwargs``) or a
    ``save_pretrained`` folder. ``model_args`` override the checkpoint's ``model_kwargs`` (e.g. a constructor default
    that changed since training; ``.ckpt`` only). ``info``: ``{"kind", "path", "datamodule": dict | None, "run_dir":
    Path | None, "states": {datamodule class name: state_dict}}`` (the states restore e.g. a text datamodule's tokenizer)."""
    from hoformer.models import from_pretrained, model_from_config

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"load_checkpoint: checkpoint {str(p)!r} does not exist (expected a Lightning .ckpt "
                                "file or a save_pretrained folder with config.json and model.safetensors)")
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"load_checkpoint: folder {str(p)!r} is not a save_pretrained folder (no config.json); "
                             "pass a .ckpt file or the folder written by save_pretrained / ExportPretrained")
        if model_args:
            raise ValueError(f"load_checkpoint: --model-args {model_args} cannot apply to the save_pretrained folder "
                             f"{str(p)!r}: its config.json fixes the model (edit it, or pass the Lightning .ckpt "
                             "instead)")
        model = from_pretrained(p, map_location=map_location)
        tok = p / "tokenizer.json"  # TextClassificationTask.save_pretrained: the vocabulary the model was trained with
        states = {"TextDataModule": {"tokenizer": tok.read_text()}} if tok.is_file() else {}
        return model, {"kind": "pretrained", "path": p, "datamodule": None, "run_dir": p.parent, "states": states}
    try:
        ckpt = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for non-checkpoints
        raise ValueError(f"load_checkpoint: cannot read {str(p)!r} as a Lightning checkpoint "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"load_checkpoint: {str(p)!r} is not a Lightning checkpoint (no 'state_dict')")
    hp = dict(ckpt.get("hyper_parameters") or {})
    name, kwargs = model_spec(hp, str(p))
    kwargs = {**kwargs, **dict(model_args or {})}
    model = model_from_config({"name": name, "kwargs": kwargs})
    state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
        problem = f"missing={missing[:5]} unexpected={unexpected[:5]}" if missing or unexpected else ""
    except RuntimeError as e:  # shape mismatches
        problem = str(e).replace("\n", " ")
    if problem:
        raise ValueError(f"load_checkpoint: weights in {str(p)!r} do not match model {name!r} built with "
                         f"{kwargs}: {problem} (if a constructor default changed since training, pass the old value "
                         "with --model-args)")
    # the run folder (config.yaml, metrics.csv) only for Lightning's layout <run>/checkpoints/*.ckpt: a checkpoint
    # copied elsewhere (e.g. /tmp) must not pick up some other run's files from its neighbours
    run_dir = p.parent.parent if p.parent.name == "checkpoints" else None
    # Lightning stores a datamodule's state_dict under its class name (TextDataModule: the trained tokenizer)
    states = {k: v for k, v in ckpt.items() if isinstance(v, dict) and k[:1].isupper()}
    return model, {"kind": "ckpt", "path": p, "datamodule": ckpt.get("datamodule_hyper_parameters"),
                   "run_dir": run_dir, "states": states}


def _instantiate(class_path: str, init_args: dict):
    mod, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"build_datamodule: cannot import datamodule class {class_path!r} ({e})") from e
    return cls(**{k: v for k, v in init_args.items() if not k.startswith("_")})


def build_datamodule(*, config=None, data: str | None = None, data_args: dict | None = None,
                     stored: dict | None = None):
    """A datamodule from a LightningCLI YAML ``config`` (its ``data`` section), a class path ``data`` with
    ``data_args``, or the ``datamodule_hyper_parameters`` stored in a checkpoint (with ``_class_path``)."""
    overrides = dict(data_args or {})
    if config is not None:
        import yaml

        cp = Path(config)
        if not cp.is_file():
            raise FileNotFoundError(f"build_datamodule: config {str(cp)!r} does not exist")
        cfg = yaml.safe_load(cp.read_text()) or {}
        sec = cfg.get("data")
        if not isinstance(sec, dict) or "class_path" not in sec:
            raise ValueError(f"build_datamodule: config {str(cp)!r} has no `data: {{class_path: ..., init_args: ...}}` "
                             "section")
        return _instantiate(sec["class_path"], {**(sec.get("init_args") or {}), **overrides})
    if data is not None:
        return _instantiate(data, overrides)
    if stored and stored.get("_class_path"):
        return _instantiate(stored["_class_path"], {**stored, **overrides})
    raise ValueError("build_datamodule: no data given: pass --config CONFIG.yaml (LightningCLI config with a `data` "
                     "section) or --data CLASS_PATH [--data-args JSON]; the checkpoint stores no datamodule class")


def checkpoint_datamodule(info: dict, *, config=None, data: str | None = None, data_args: dict | None = None):
    """The datamodule of a checkpoint loaded by :func:`load_checkpoint`: from ``config`` / ``data`` when given, else
    the hyper-parameters stored in a Lightning checkpoint, else the ``config.yaml`` LightningCLI saved in its run
    folder; with the state the checkpoint stored for it (e.g. the tokenizer the model was trained with)."""
    stored = info["datamodule"]
    if config is None and data is None and not (stored or {}).get("_class_path"):
        config = find_run_file(info["run_dir"], "config.yaml") if info["kind"] == "ckpt" else None
    dm = build_datamodule(config=config, data=data, data_args=data_args, stored=stored)
    state = info["states"].get(type(dm).__qualname__)
    if state and hasattr(dm, "load_state_dict"):  # before setup
        dm.load_state_dict(state)
    return dm


def find_run_file(run_dir: Path | None, name: str, accept=None) -> Path | None:
    """Newest ``name`` under a run folder (LightningCLI writes ``config.yaml`` and CSVLogger ``metrics.csv`` into
    ``<run>/logs/version_*``) for which ``accept(path)`` holds."""
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    found = [f for depth in range(4) for f in Path(run_dir).glob("/".join(["*"] * depth + [name]))]
    found = [f for f in found if accept is None or accept(f)]
    found.sort(key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


