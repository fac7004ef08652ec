"""Reading checkpoints: the one place that opens Lightning checkpoints and ``save_pretrained`` folders (its
:func:`read_checkpoint` is :func:`hoformer._io.read_checkpoint`, the package's one ``torch.load``), used by the
tasks' resumes, the CLI, ``hoformer analyze`` / ``forecast`` / ``export`` and the Python API.

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
* :func:`check_model_state`, :func:`check_checkpoint_data` - refuse a restore into another model configuration, or
  onto data other than the checkpoint's (its ``data_signature``).
* :func:`check_data_signature` - the comparison of a stored data signature
  (:meth:`~hoformer.data.SeriesDataModule.data_signature`) with the current one, naming every difference
  (:class:`DataMismatchError`); ``hoformer.data`` exports both too.

The datamodule a checkpoint was trained on is built by :mod:`hoformer.inference` (``checkpoint_datamodule``).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from hoformer._io import CheckpointError, MissingCheckpointError, check_device, read_checkpoint

__all__ = ["CheckpointError", "MissingCheckpointError", "check_device", "read_checkpoint", "read_lightning_checkpoint",
           "model_state", "load_checkpoint", "model_spec", "check_model_state", "data_signature",
           "check_checkpoint_data", "save_data_config", "read_data_config", "DataMismatchError",
           "check_data_signature"]

#: the key under which a task stores its datamodule's ``data_signature()`` in a checkpoint
DATA_SIGNATURE_KEY = "hoformer_data_signature"
#: the file of a ``save_pretrained`` folder that records the data the model was trained on (:func:`save_data_config`)
DATA_CONFIG_NAME = "data.json"


def save_data_config(directory, datamodule) -> Path | None:
    """Write ``directory/data.json``: what forecasting (and any later use) needs of the data a model was trained on,
    beside its ``save_pretrained`` files: the datamodule's class path and init args (a relative ``root`` made
    absolute), its ``data_signature()``, and, when it has one, the fitted scaler (``mean``, ``std``, ``eps``), the
    column names and the lookback / horizon / features. Tied to the weights by ``config.json``'s ``save_id``. Returns
    the path, or ``None`` for a datamodule without hyper-parameters (nothing to record)."""
    import os

    import numpy as np

    from hoformer._io import atomic_write

    hp = dict(getattr(datamodule, "hparams", None) or {})
    if not hp:
        return None
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text())
    cls = hp.pop("_class_path", None) or f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"
    args = {k: v for k, v in hp.items() if not k.startswith("_")}
    if isinstance(args.get("root"), str) and not os.path.isabs(args["root"]):
        args["root"] = os.path.abspath(args["root"])
    out: dict[str, Any] = {"save_id": cfg.get("save_id"), "class_path": cls, "init_args": args,
                           "data_signature": data_signature(datamodule)}
    scaler = getattr(datamodule, "scaler", None)
    if scaler is not None and getattr(scaler, "mean", None) is not None:
        out["scaler"] = {"mean": np.asarray(scaler.mean, float).tolist(), "std": np.asarray(scaler.std, float).tolist(),
                         "eps": float(scaler.eps)}
        for key in ("variate_names", "seq_len", "pred_len", "features"):
            if hasattr(datamodule, key):
                out[key] = getattr(datamodule, key)
    text = json.dumps(out, indent=1, default=str)
    atomic_write(d / DATA_CONFIG_NAME, lambda tmp: Path(tmp).write_text(text))
    return d / DATA_CONFIG_NAME


def read_data_config(directory) -> dict | None:
    """``directory/data.json`` (:func:`save_data_config`) as a dict, or ``None`` when there is none; a file of another
    save than the folder's weights (its ``save_id`` differs from ``config.json``'s: written for an earlier model) is
    ignored with a warning naming it, and an unreadable one is an error naming it."""
    d = Path(directory)
    path = d / DATA_CONFIG_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"load_checkpoint: {path} is not readable JSON ({e}); delete it to load the model "
                              "without its data configuration") from e
    saved = json.loads((d / "config.json").read_text()).get("save_id")
    if not isinstance(data, dict) or data.get("save_id") != saved:
        warnings.warn(f"load_checkpoint: {path} belongs to another save than {d / 'config.json'} (save_id "
                      f"{data.get('save_id') if isinstance(data, dict) else None!r} vs {saved!r}); ignored",
                      UserWarning, stacklevel=3)
        return None
    return data


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
        data = read_data_config(p)  # what ExportPretrained recorded of the training data
        stored = {**data["init_args"], "_class_path": data["class_path"]} if data else None
        return model, {"kind": "pretrained", "path": p, "datamodule": stored, "run_dir": p.parent, "states": states,
                       "data_signature": (data or {}).get("data_signature"), "data_config": data}
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
                   "run_dir": run_dir, "states": states, "data_signature": ckpt.get(DATA_SIGNATURE_KEY),
                   "data_config": None}


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


def check_checkpoint_data(saved: dict | None, datamodule, *, where: str = "checkpoint", allow_mismatch: bool = False,
                          override: str = "pass allow_mismatch=True") -> None:
    """Refuse ``datamodule`` when its ``data_signature()`` differs from the signature ``saved`` in a checkpoint
    (:func:`check_data_signature`); nothing to compare (an older checkpoint, a datamodule without a
    signature): no check. ``allow_mismatch`` warns instead; ``override`` names how the caller's user sets it."""
    current = data_signature(datamodule) if saved is not None else None
    if saved is None or current is None:
        return
    with warnings.catch_warnings():  # the differences only; the message below names the checkpoint and the override
        warnings.simplefilter("ignore")
        diffs = check_data_signature(saved, current, allow_mismatch=True)
    if not diffs:
        return
    msg = f"{where} was trained on other data than this run's {type(datamodule).__name__} ({'; '.join(diffs)})"
    if allow_mismatch:
        warnings.warn(f"{msg}: the data differ; used anyway, as asked", stacklevel=2)
        return
    raise CheckpointError(f"{msg}. Use the data the checkpoint was trained on, or, to evaluate it on these data "
                          f"anyway, {override}")


# ------------------------------------------------------------------------------------------------- signature
class DataMismatchError(ValueError):
    """A checkpoint is used on data other than the data it was trained on."""


def _show(v) -> str:
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(repr, v[:3]))}, ... {len(v)} names]"
    return repr(v)


def _differences(saved: dict, current: dict) -> list[str]:
    saved, current = json.loads(json.dumps(saved)), json.loads(json.dumps(current))  # tuples -> lists
    out = []
    for key in saved:
        if key not in current or saved[key] == current[key]:
            continue
        a, b = saved[key], current[key]
        line = f"{key}: trained on {_show(a)}, now {_show(b)}"
        if isinstance(a, list) and isinstance(b, list):
            only_a, only_b = [x for x in a if x not in b], [x for x in b if x not in a]
            if only_a or only_b:
                parts = [f"only in training: {_show(only_a)}" if only_a else "", f"only now: {_show(only_b)}" if only_b
                         else ""]
                line += f" ({'; '.join(p for p in parts if p)})"
            else:
                line += " (the same names in another order)"
        out.append(line)
    return out


def check_data_signature(saved: dict | None, current: dict | None, *, allow_mismatch: bool = False,
                         override: str = "allow_mismatch=True") -> list[str]:
    """Compare the :meth:`~SeriesDataModule.data_signature` stored with a checkpoint (``saved``) with the one of the
    data it is now used on (``current``) -> the list of differences (empty: the same data).

    A difference raises :class:`DataMismatchError` (a ``ValueError``) naming every key that differs (trained on
    what, given what) and how to proceed anyway (``override``: the text of the override, e.g. the CLI flag);
    with ``allow_mismatch=True`` it is a warning instead. Keys present on one side only are not compared, and a
    ``saved`` of ``None`` or ``{}`` (a checkpoint that recorded no signature) checks nothing."""
    if not saved or not current:
        return []
    diffs = _differences(saved, current)
    if diffs:
        msg = ("the checkpoint was trained on other data than the data it is now used on:\n  " + "\n  ".join(diffs))
        if not allow_mismatch:
            raise DataMismatchError(f"{msg}\nUse the data it was trained on, or pass {override} to use it anyway.")
        warnings.warn(f"{msg}\n(used anyway: {override})", stacklevel=2)
    return diffs
