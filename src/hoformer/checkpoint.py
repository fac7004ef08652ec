"""Reading checkpoints: the one place that opens Lightning checkpoints (``torch.load``) and ``save_pretrained``
folders, used by the tasks' resumes, the CLI, ``hoformer analyze`` / ``forecast`` / ``export`` and the Python API.

* :func:`read_checkpoint` - ``torch.load(..., weights_only=True)`` always (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot
  turn it off: an explicit ``weights_only=True`` wins over it); a missing, truncated or unreadable file, a device
  that does not exist (``map_location``) and a pickle payload raise errors naming the file or the argument.
* :func:`read_lightning_checkpoint` - :func:`read_checkpoint` of a file that must be a Lightning checkpoint
  (``state_dict`` and ``pytorch-lightning_version``).
* :func:`model_state` - a task's model weights (the ``model.`` entries of its ``state_dict``).
* :func:`load_checkpoint` - ``(model, info)`` from a Lightning ``.ckpt`` of a :class:`~hoformer.train.TaskModule` or
  a ``save_pretrained`` folder.
* :func:`model_spec` - the registered model name and constructor arguments a checkpoint's hyper-parameters record.
  Every layout hoformer has written is read: ``model_name`` / ``model_kwargs`` (tasks configured by registry name)
  and ``model_config`` (tasks given a model instance: its ``config``, ``{"name", "kwargs"}``).
* :func:`build_datamodule`, :func:`checkpoint_datamodule` - the datamodule a checkpoint was trained on (from a
  config, resolved as ``hoformer fit`` resolves it, a class path, or what the checkpoint / its run folder stored).
* :func:`check_checkpoint_data` - refuse data other than the checkpoint's (its ``data_signature``).
"""
from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "MissingCheckpointError", "read_checkpoint", "read_lightning_checkpoint", "model_state", "load_checkpoint", "model_spec",
           "build_datamodule", "checkpoint_datamodule", "check_checkpoint_data", "find_run_file"]

class CheckpointError(ValueError):
    """A checkpoint that cannot serve the request: unreadable, not a Lightning checkpoint, of another model
    configuration, trained on other data, or not there (``--ckpt_path best`` of a run that saved none)."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No checkpoint where one was asked for."""


#: the key under which a task stores its datamodule's ``data_signature()`` in a checkpoint
DATA_SIGNATURE_KEY = "hoformer_data_signature"


def check_device(map_location: Any, fn: str) -> None:
    """A ``map_location`` / ``--device`` that names a device this machine lacks (``"cuda:7"`` on a one-GPU or CPU-only
    machine) raises a ``ValueError`` naming the argument, before any file is read (torch would blame the file)."""
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict / function / None: torch's own semantics
    try:
        dev = torch.device(map_location)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{fn}: device {str(map_location)!r} is not a device name (expected 'cpu', 'cuda', "
                         f"'cuda:0', 'mps', ...): {e}") from e
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index is not None and dev.index >= n):
            have = "no CUDA device" if n == 0 else f"{n} CUDA device(s) (cuda:0..cuda:{n - 1})"
            raise ValueError(f"{fn}: device {str(map_location)!r} does not exist on this machine, which has {have}; "
                             "pass 'cpu' or an existing device")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{fn}: device {str(map_location)!r} is not available on this machine; pass 'cpu'")


def read_checkpoint(path, map_location: Any = "cpu", *, fn: str = "read_checkpoint", what: str = "checkpoint",
                    mmap: bool = False) -> Any:
    """``torch.load(path, map_location, weights_only=True)`` with errors that name the file: ``FileNotFoundError``
    (missing), ``IsADirectoryError`` (a directory), ``ValueError`` (empty, truncated or not a PyTorch file; a device
    that does not exist) and ``pickle.UnpicklingError`` (a pickle that needs more than tensors and plain containers:
    refused, never run). ``what`` names the kind of file in the messages."""
    p = Path(os.fspath(path))
    if not p.exists():
        raise MissingCheckpointError(f"{fn}: {what} file {str(p)!r} not found")
    if p.is_dir():
        raise IsADirectoryError(f"{fn}: {what} {str(p)!r} is a directory; expected a .ckpt file (a "
                                "save_pretrained folder loads with hoformer.models.from_pretrained)")
    check_device(map_location, fn)
    size = p.stat().st_size
    try:
        return torch.load(p, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # refusals name the global; bad bytes ("Unsupported operand"): wrong file
            raise CheckpointError(f"{fn}: cannot read {what} {str(p)!r} ({size} bytes): it is not a PyTorch file "
                             f"(UnpicklingError: {str(e).splitlines()[0][:200]})") from e
        raise pickle.UnpicklingError(
            f"{fn}: {what} {str(p)!r} holds objects other than tensors and plain containers; it is refused "
            f"(weights_only=True; only load files you trust with a plain torch.load): {e}") from e
    except Exception as e:  # noqa: BLE001 - torch raises many types (RuntimeError, EOFError, KeyError...) on bad bytes
        detail = str(e).split(". ")[0]  # torch's miniz errors run on for several sentences
        raise CheckpointError(f"{fn}: cannot read {what} {str(p)!r} ({size} bytes): the file is empty, truncated or "
                         f"not a PyTorch file ({type(e).__name__}: {detail})") from e


def read_lightning_checkpoint(path, map_location: Any = "cpu", *, fn: str = "read_checkpoint",
                              restore: bool = False) -> dict:
    """:func:`read_checkpoint` of a file that must be a Lightning checkpoint: a dict with a ``state_dict`` (and, to
    ``restore`` a Trainer from it, ``pytorch-lightning_version``); a ``ValueError`` naming the file and the keys found
    otherwise, e.g. for a bare ``torch.save(model.state_dict())``."""
    ckpt = read_checkpoint(path, map_location, fn=fn)
    need = ("state_dict", "pytorch-lightning_version") if restore else ("state_dict",)
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in need):
        found = sorted(map(str, ckpt))[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        hint = (" (it looks like a bare state_dict: load it with model.load_state_dict, or save_pretrained it)"
                if isinstance(ckpt, dict) and ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()) else "")
        raise CheckpointError(f"{fn}: {str(path)!r} is a PyTorch file but not a Lightning checkpoint: expected the keys "
                         f"{list(need)}, found {found}{hint}")
    return ckpt


def model_state(ckpt: dict, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The weights of a task's model from a Lightning checkpoint dict (its ``state_dict`` entries under ``prefix``,
    the prefix removed)."""
    return {k[len(prefix):]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}


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
    Path | None, "states": {datamodule class name: state_dict}, "data_signature": dict | None}`` (the states restore
    e.g. a text datamodule's tokenizer; the signature is what the data determined at training,
    :func:`check_checkpoint_data`)."""
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
        check_device(map_location, "load_checkpoint")
        model = from_pretrained(p, map_location=map_location)
        tok = p / "tokenizer.json"  # TextClassificationTask.save_pretrained: the vocabulary the model was trained with
        states = {"TextDataModule": {"tokenizer": tok.read_text()}} if tok.is_file() else {}
        return model, {"kind": "pretrained", "path": p, "datamodule": None, "run_dir": p.parent, "states": states,
                       "data_signature": None}
    ckpt = read_lightning_checkpoint(p, map_location, fn="load_checkpoint")
    hp = dict(ckpt.get("hyper_parameters") or {})
    name, kwargs = model_spec(hp, str(p))
    kwargs = {**kwargs, **dict(model_args or {})}
    model = model_from_config({"name": name, "kwargs": kwargs})
    state = model_state(ckpt)
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
                   "run_dir": run_dir, "states": states, "data_signature": ckpt.get(DATA_SIGNATURE_KEY)}


def check_model_state(checkpoint: dict, task, where: str) -> None:
    """Refuse to restore ``checkpoint`` into ``task`` when the weights of its model do not fit (another model
    configuration: a resume with a changed config), naming the first differing tensors and the model arguments that
    differ, instead of torch's list of size mismatches."""
    saved = checkpoint.get("state_dict") or {}
    own = task.state_dict()
    keys = lambda d: {k for k in d if k.startswith("model.")}  # noqa: E731
    shapes = [f"{k}: {tuple(saved[k].shape)} in the checkpoint, {tuple(own[k].shape)} here"
              for k in sorted(keys(saved) & keys(own))
              if hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape)]
    missing, unexpected = sorted(keys(own) - keys(saved)), sorted(keys(saved) - keys(own))
    if not (shapes or missing or unexpected):
        return
    try:
        old = model_spec(dict(checkpoint.get("hyper_parameters") or {}))
    except ValueError:
        old = None
    new = (task.model.config.get("name"), dict(task.model.config.get("kwargs") or {})) \
        if isinstance(getattr(getattr(task, "model", None), "config", None), dict) else None
    diff = ""
    if old is not None and new is not None:
        if old[0] != new[0]:
            diff = f"; the checkpoint holds model {old[0]!r}, this run builds {new[0]!r}"
        else:
            d = {k: (old[1].get(k), new[1].get(k)) for k in sorted(old[1].keys() | new[1].keys())
                 if old[1].get(k) != new[1].get(k)}
            if d:
                diff = "; model arguments that differ (checkpoint vs this run): " + ", ".join(
                    f"{k}={a!r} vs {b!r}" for k, (a, b) in list(d.items())[:8])
    what = "; ".join(filter(None, [", ".join(shapes[:3]) + (f" (+{len(shapes) - 3} more)" if len(shapes) > 3 else ""),
                                   f"missing here: {missing[:3]}" if missing and not shapes else "",
                                   f"not in this model: {unexpected[:3]}" if unexpected and not shapes else ""]))
    raise CheckpointError(f"{where} does not fit this run's model: {what}{diff}. Resume / test with the config the "
                     "checkpoint was trained with (its run folder's config.yaml), or start a new run")


def data_signature(datamodule) -> dict | None:
    """``datamodule.data_signature()`` (what the data determine: file, columns, number of series, lookback, horizon,
    scaler statistics digest), or ``None`` for a datamodule without one."""
    fn = getattr(datamodule, "data_signature", None)
    return fn() if callable(fn) else None


def _compare_signatures(saved: dict, current: dict, *, allow_mismatch: bool = False) -> None:
    """Fallback of ``hoformer.data.check_data_signature`` (same contract: ``ValueError`` naming the differing
    entries, a warning instead with ``allow_mismatch``), used only while ``hoformer.data`` does not provide it.
    TODO(data): delete once ``hoformer.data.check_data_signature`` exists."""
    import warnings

    diff = {k: (saved.get(k), current.get(k)) for k in sorted(saved.keys() | current.keys())
            if saved.get(k) != current.get(k)}
    if not diff:
        return
    msg = "the data differ from the checkpoint's: " + "; ".join(f"{k}: {a!r} at training, {b!r} now"
                                                                 for k, (a, b) in list(diff.items())[:6])
    if allow_mismatch:
        warnings.warn(msg, stacklevel=3)
        return
    raise ValueError(msg)


def check_checkpoint_data(saved: dict | None, datamodule, *, where: str = "checkpoint", allow_mismatch: bool = False,
                          override: str = "pass allow_mismatch=True") -> None:
    """Refuse ``datamodule`` when its ``data_signature()`` differs from the signature ``saved`` in a checkpoint
    (``hoformer.data.check_data_signature``); nothing to compare (an older checkpoint, a datamodule without a
    signature): no check. ``allow_mismatch`` warns instead; ``override`` names how the caller's user sets it."""
    current = data_signature(datamodule) if saved is not None else None
    if saved is None or current is None:
        return
    try:
        from hoformer.data import check_data_signature
    except ImportError:
        check_data_signature = _compare_signatures
    try:
        check_data_signature(saved, current, allow_mismatch=allow_mismatch)
    except ValueError as e:
        raise CheckpointError(f"{where} was trained on other data than this run's {type(datamodule).__name__}: {e}. "
                         f"Use the data the checkpoint was trained on, or, to evaluate it on these data anyway, "
                         f"{override}") from e


def _instantiate(class_path: str, init_args: dict):
    mod, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"build_datamodule: cannot import datamodule class {class_path!r} ({e})") from e
    return cls(**{k: v for k, v in init_args.items() if not k.startswith("_")})


def build_datamodule(*, config=None, data: str | None = None, data_args: dict | None = None,
                     stored: dict | None = None):
    """A datamodule from a LightningCLI YAML ``config`` (its ``data`` section, resolved by
    :func:`hoformer.cli.resolve_config` as ``hoformer fit`` resolves it), a class path ``data`` with ``data_args``, or
    the ``datamodule_hyper_parameters`` stored in a checkpoint (with ``_class_path``)."""
    overrides = dict(data_args or {})
    if config is not None:
        from hoformer.cli import resolve_config

        sec = resolve_config(config, partial=True).get("data")  # the bases it extends included, as `hoformer fit` reads it
        if not isinstance(sec, dict) or not sec.get("class_path"):
            raise ValueError(f"build_datamodule: config {str(config)!r} has no `data: {{class_path: ..., init_args: "
                             "...}` section (nor do the configs it extends)")
        return _instantiate(sec["class_path"], {**(sec.get("init_args") or {}), **overrides})
    if data is not None:
        return _instantiate(data, overrides)
    if stored and stored.get("_class_path"):
        return _instantiate(stored["_class_path"], {**stored, **overrides})
    raise ValueError("build_datamodule: no data given: pass --config CONFIG.yaml (LightningCLI config with a `data` "
                     "section) or --data CLASS_PATH [--data-args JSON]; the checkpoint stores no datamodule class")


def checkpoint_datamodule(info: dict, *, config=None, data: str | None = None, data_args: dict | None = None,
                          allow_data_mismatch: bool = False, override: str = "pass allow_data_mismatch=True"):
    """The datamodule of a checkpoint loaded by :func:`load_checkpoint`: from ``config`` / ``data`` when given, else
    the hyper-parameters stored in a Lightning checkpoint, else the ``config.yaml`` LightningCLI saved in its run
    folder; with the state the checkpoint stored for it (e.g. the tokenizer the model was trained with). Data other
    than the checkpoint's (its ``data_signature``) are refused unless ``allow_data_mismatch`` (then a warning);
    ``override`` names how the caller's user sets it (:func:`check_checkpoint_data`)."""
    stored = info["datamodule"]
    if config is None and data is None and not (stored or {}).get("_class_path"):
        config = find_run_file(info["run_dir"], "config.yaml") if info["kind"] == "ckpt" else None
    dm = build_datamodule(config=config, data=data, data_args=data_args, stored=stored)
    state = info["states"].get(type(dm).__qualname__)
    if state and hasattr(dm, "load_state_dict"):  # before setup
        dm.load_state_dict(state)
    check_checkpoint_data(info.get("data_signature"), dm, where=f"checkpoint {str(info['path'])!r}",
                          allow_mismatch=allow_data_mismatch, override=override)
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


