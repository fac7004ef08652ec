"""Using a trained model on data, without Lightning: the datamodule a checkpoint or a config describes, and
``hoformer forecast``.

* :func:`build_datamodule`, :func:`checkpoint_datamodule` - the datamodule of a config, a class path, or a checkpoint
  (what it stored, or its run folder's ``config.yaml``), refused when it is not the data the checkpoint was trained
  on (:func:`hoformer.checkpoint.check_checkpoint_data`); :func:`find_run_file` finds a run folder's files;
  :func:`data_config_scaler` the training scaler a ``save_pretrained`` folder records.
* :func:`forecast_series`, :func:`forecast_checkpoint`, :func:`forecast_main` - ``hoformer forecast``: the steps
  after the end of the data, from a trained forecaster, as a CSV (described below).

Checkpoints are read by :mod:`hoformer.checkpoint`, configs resolved by :mod:`hoformer.config`; deployable files of
a model are written by :mod:`hoformer.export`.

Forecasting
-----------
``hoformer test`` scores windows whose future is known; a user of a forecaster wants the future that is not. Given a
checkpoint (a Lightning ``.ckpt`` of a :class:`~hoformer.train.ForecastingTask` or a ``save_pretrained`` folder) and
its LTSF data (the datamodule stored in the checkpoint, the run's ``config.yaml``, or ``--config``), this reads the
last ``seq_len`` rows of the data file (or of ``--history``, e.g. the same series with newer rows), standardises them
with the training slice's scaler, and writes the ``pred_len`` forecast steps on the original scale, with their
timestamps, to a CSV (atomically). ``--end ROW`` forecasts from an earlier row instead (a backtest).
``--horizon H`` asks for ``H`` steps instead: a model that generates any horizon (its ``forward`` takes ``pred_len``,
e.g. ``hot_causal_forecaster``) forecasts them (with a warning beyond ``HORIZON_WARN_FACTOR`` = 4 times the
trained ``pred_len``: the errors of a generated forecast compound); a direct model (fixed head) only its trained
``pred_len``::

    hoformer forecast --checkpoint runs/hot/ltsf/etth1_96_96_hot_product/checkpoints/last.ckpt --output forecast.csv
    hoformer forecast --checkpoint runs/.../pretrained --config configs/hot/ltsf/etth1_96_96_hot_product.yaml \\
                      --history ETTh1_with_new_rows.csv
    hoformer forecast --checkpoint runs/hot/ltsf_cpu/etth1_96_causal/checkpoints/last.ckpt --horizon 720

The Python forms are :func:`forecast_series` (a model, the scaler and column names of its training data, and the
history) and :func:`forecast_checkpoint` (a checkpoint).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from hoformer._checks import is_int
from hoformer._io import atomic_write
from hoformer.checkpoint import check_checkpoint_data
from hoformer.config import resolve_config
from hoformer.data import LTSFDataModule, StandardScaler, read_series_table, unscale

__all__ = ["build_datamodule", "checkpoint_datamodule", "find_run_file", "data_config_scaler", "forecast_series",
           "forecast_checkpoint", "forecast_main", "HORIZON_WARN_FACTOR"]

#: a generated forecast longer than this multiple of the trained horizon (``pred_len``) is warned about
HORIZON_WARN_FACTOR = 4


# ---------------------------------------------------------------------------------------------- datamodules
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
    :func:`hoformer.config.resolve_config` as ``hoformer fit`` resolves it), a class path ``data`` with
    ``data_args``, or the ``datamodule_hyper_parameters`` stored in a checkpoint (with ``_class_path``)."""
    overrides = dict(data_args or {})
    if config is not None:
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
    """The datamodule of a checkpoint loaded by :func:`hoformer.checkpoint.load_checkpoint`: from ``config`` /
    ``data`` when given, else the hyper-parameters stored in a Lightning checkpoint, else the ``config.yaml``
    LightningCLI saved in its run folder; with the state the checkpoint stored for it (e.g. the tokenizer the model
    was trained with). Data other than the checkpoint's (its ``data_signature``) are refused unless
    ``allow_data_mismatch`` (then a warning); ``override`` names how the caller's user sets it
    (:func:`~hoformer.checkpoint.check_checkpoint_data`)."""
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


def data_config_scaler(data: dict):
    """The :class:`~hoformer.data.StandardScaler` recorded in a :func:`hoformer.checkpoint.read_data_config` dict,
    or ``None``."""
    sc = (data or {}).get("scaler")
    if not sc:
        return None
    scaler = StandardScaler(sc.get("eps", 0.0))
    scaler.mean, scaler.std = np.asarray(sc["mean"], np.float64), np.asarray(sc["std"], np.float64)
    return scaler


# ----------------------------------------------------------------------------------------------- forecasting
def forecast_series(model, scaler, columns, history, *, seq_len: int | None = None, pred_len: int | None = None,
                    features: str = "M", end: int | None = None, horizon: int | None = None):
    """Forecast the ``horizon`` (default ``pred_len``) steps that follow row ``end`` of ``history``, on the
    original scale.

    The model sees the ``seq_len`` rows ``[end - seq_len, end)`` of the ``columns``, standardised with ``scaler``
    (the one the model was trained with), in training's column order.

    Args:
        model: a forecaster ``(1, seq_len, C) -> (1, pred_len, C)`` (e.g. ``hot_forecaster``); it runs in eval
            mode under ``no_grad`` on its own device and dtype, and its training flag is restored.
        scaler: the training data's :class:`~hoformer.data.StandardScaler` (``LTSFDataModule.scaler``; ``None``:
            the model was trained on unscaled values).
        columns: the training column names in the model's order (``LTSFDataModule.variate_names``).
        history: where the lookback comes from: a ``pandas.DataFrame`` with those columns (extra columns ignored;
            timestamps, optional, from a ``date`` column or a ``DatetimeIndex``, their time zone kept), e.g.
            ``LTSFDataModule.history()`` (the training file) or ``LTSFDataModule.history(path)`` (newer data read
            the same way), or a CSV path in the LTSF layout (``date`` first, then named columns). The scaler stays
            the training one.
        seq_len, pred_len: the model's lookback and trained horizon (default: its ``seq_len`` / ``pred_len``
            attributes).
        features: "M" (every column is forecast), "S" (one column) or "MS" (every column in, the last one, the
            target, out: a model giving every column has its last one kept).
        end: 0-based row after the lookback (default: the number of rows, i.e. forecast the unseen future; a
            smaller ``end`` is a backtest whose dates are the history's own as far as it goes).
        horizon: forecast steps (default: ``pred_len``, the horizon the model was trained for). Another horizon
            needs a model that generates any horizon, i.e. whose ``forward`` takes ``pred_len``
            (``hot_causal_forecaster``); a direct model's head has a fixed size and is refused with an error.

    Returns:
        ``pandas.DataFrame`` with ``horizon`` rows: a ``date`` column (extrapolated with the history's inferred
        step past its end; ``step`` 1.. when the data have no timestamps) and the forecast columns (every
        column, or the target, the last one, for ``features="MS"``).
    """
    import pandas as pd

    columns = [str(c) for c in columns]
    seq_len, pred_len = _lengths(model, seq_len, pred_len)
    if features not in ("M", "S", "MS"):
        raise ValueError(f"forecast: `features` must be 'M', 'S' or 'MS', got {features!r}")
    if scaler is not None and len(scaler.mean) != len(columns):
        raise ValueError(f"forecast: the scaler has {len(scaler.mean)} channels but {len(columns)} columns were "
                         f"given ({columns}); pass the training data's scaler and column names")
    values, dates, tz = _history(columns, history)
    if len(values) < seq_len:
        raise ValueError(f"forecast: the history has {len(values)} rows, fewer than seq_len={seq_len}")
    end = len(values) if end is None else end
    if not is_int(end) or not seq_len <= end <= len(values):
        raise ValueError(f"forecast: `end` must be an int in [seq_len={seq_len}, {len(values)}] (rows of "
                         f"the history), got {end!r}")
    steps, kwargs = _horizon(model, pred_len, horizon)
    _check_order(dates, end - seq_len, min(end + steps, len(values)))
    x = torch.from_numpy(np.ascontiguousarray(values[end - seq_len:end], dtype=np.float32))
    if scaler is not None:
        x = scaler.transform(x)
    param = next(iter(model.parameters()), None)
    device, dtype = (param.device, param.dtype) if param is not None else (x.device, x.dtype)
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            pred = model(x[None].to(device=device, dtype=dtype), **kwargs)[0].float().cpu()
    finally:
        model.train(was_training)
    widths = sorted({len(columns), 1} if features != "M" else {len(columns)})  # S / MS: the target
    if pred.ndim != 2 or pred.shape[0] != steps or pred.shape[1] not in widths:
        raise ValueError(f"forecast: the model maps (1, {seq_len}, {len(columns)}) to {(1, *pred.shape)}, expected "
                         f"(1, {steps}, {' or '.join(map(str, widths))}) (pred_len and features={features!r})")
    if features == "MS" and pred.shape[1] > 1:
        pred = pred[:, -1:]  # all variates in, the target (last column) out
    names = columns if pred.shape[1] == len(columns) else columns[-1:]
    if scaler is not None:  # the statistics of the forecast channels, as a batch carries them (float32)
        stats = (scaler if pred.shape[1] == len(columns) else scaler.channels(slice(-1, None))).statistics(pred)
        pred = unscale(pred[None], stats)[0]
    df = pd.DataFrame(pred.numpy(), columns=names)
    when = _future_dates(dates, end, steps, tz)
    df.insert(0, "date" if when is not None else "step", when if when is not None else np.arange(1, steps + 1))
    return df


def _lengths(model, seq_len, pred_len) -> tuple[int, int]:
    """``(seq_len, pred_len)``: the arguments, else the model's attributes."""
    out = []
    for name, v in (("seq_len", seq_len), ("pred_len", pred_len)):
        v = getattr(model, name, None) if v is None else v
        if not is_int(v) or v < 1:
            raise ValueError(f"forecast: `{name}` must be an int >= 1 (pass {name}=..., or a model with a `{name}` "
                             f"attribute), got {v!r}")
        out.append(int(v))
    return out[0], out[1]


def _horizon(model, pred_len: int, horizon) -> tuple[int, dict]:
    """``(steps, forward kwargs)`` of a forecast of ``horizon`` steps (``None``: ``pred_len``). A model whose
    ``forward`` takes ``pred_len`` is asked for the steps; any other model must have been trained for them."""
    if horizon is None:
        return pred_len, {}
    if not is_int(horizon) or horizon < 1:
        raise ValueError(f"forecast: `horizon` must be an int >= 1 (forecast steps), got {horizon!r}")
    try:
        any_horizon = "pred_len" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        any_horizon = False
    if any_horizon:
        if horizon > HORIZON_WARN_FACTOR * pred_len:
            warnings.warn(f"forecast: `horizon`={horizon} is {horizon / pred_len:.0f}x the horizon the model "
                          f"was trained for (pred_len={pred_len}); a generated forecast compounds its errors "
                          f"step by step, so beyond {HORIZON_WARN_FACTOR}x it is mostly the model's own drift",
                          stacklevel=3)
        return int(horizon), {"pred_len": int(horizon)}
    if horizon != pred_len:
        name = getattr(model, "config", {}).get("name", type(model).__name__)
        raise ValueError(f"forecast: `horizon`={horizon} but {name} forecasts the fixed horizon pred_len="
                         f"{pred_len} it was trained for (a direct head); forecasting another horizon needs "
                         f"a model that generates any horizon (its forward takes `pred_len`, e.g. "
                         f"hot_causal_forecaster) or a model trained for {horizon}")
    return int(horizon), {}


def _history(columns: list[str], history) -> tuple[np.ndarray, np.ndarray | None, object]:
    """``(values (T, C) in training's column order, dates (T,) as UTC-naive datetime64 | None, time zone |
    None)`` of the forecast input (a DataFrame's time zone, from its ``date`` column or ``DatetimeIndex``, is kept
    for the output; files are read as naive timestamps, offsets converted to UTC)."""
    import pandas as pd

    tz = None
    if isinstance(history, (str, Path)):
        path = Path(history)
        if not path.is_file():
            raise FileNotFoundError(f"forecast: history file {str(path)!r} not found")
        dates, values, names = read_series_table(path)
        frame = pd.DataFrame(values, columns=list(names))
    elif isinstance(history, pd.DataFrame):
        frame = history.rename(columns=lambda c: str(c).strip())  # a new frame: the caller's is left as it is
        stamps = (_parse_stamps(frame["date"]) if "date" in frame.columns else
                  frame.index if isinstance(frame.index, pd.DatetimeIndex) else None)
        dates = None
        if stamps is not None:
            tz = stamps.tz
            dates = (stamps.tz_convert("UTC").tz_localize(None) if tz is not None else stamps).to_numpy(
                "datetime64[ns]")
    else:
        raise TypeError(f"forecast: `history` must be a pandas.DataFrame or a CSV path, got "
                        f"{type(history).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"forecast: history lacks the training column(s) {missing} (has {list(frame.columns)})")
    try:
        values = frame[columns].to_numpy(np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"forecast: history columns {columns} must be numeric ({e})") from e
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        i, j = bad[0]
        raise ValueError(f"forecast: history has a missing or non-finite value in column {columns[j]!r} at "
                         f"row {i} ({len(bad)} such cells)")
    return values, dates, tz


def _parse_stamps(column):
    """A ``date`` column as a ``DatetimeIndex``: its time zone kept, mixed UTC offsets (a tz-aware series written to
    text across a DST change) read as UTC. pandas 3 refuses mixed offsets, pandas 2 returns objects (with a warning)
    that ``DatetimeIndex`` refuses: either way the column is parsed again with ``utc=True``."""
    import pandas as pd

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return pd.DatetimeIndex(pd.to_datetime(column))
    except (ValueError, TypeError):
        return pd.DatetimeIndex(pd.to_datetime(column, utc=True))


def _check_order(dates, start: int, stop: int) -> None:
    """Refuse timestamps that go back in time within the rows a forecast uses (``[start, stop)``: its lookback and the
    backtest horizon): a newest-first export would feed the lookback reversed. Repeated timestamps are allowed (the
    Weather file repeats one); rows outside the window are not the forecast's business."""
    if dates is None or stop - start < 2:
        return
    back = np.flatnonzero(np.diff(dates[start:stop].astype("int64")) < 0)
    if back.size:
        import pandas as pd

        i = start + int(back[0]) + 1
        raise ValueError(f"forecast: the history's timestamps go back in time at row {i} ({pd.Timestamp(dates[i - 1])}"
                         f" then {pd.Timestamp(dates[i])}); sort it oldest first")


def _future_dates(dates, end: int, n: int, tz=None):
    """Timestamps of the ``n`` rows from row ``end``: the file's own while it has them, past its end its last one
    plus multiples of the step (pandas' inferred frequency of the last rows, so calendar steps like month starts
    work; else their most common difference). ``None`` without timestamps."""
    if dates is None:
        return None
    import pandas as pd

    idx = pd.DatetimeIndex(dates)
    if tz is not None:  # extrapolate in local time: calendar steps (days, months) keep their wall-clock hour
        idx = idx.tz_localize("UTC").tz_convert(tz)
    own = idx[end:end + n]
    if len(own) == n:
        return own
    recent = idx[max(0, len(idx) - 64):]
    if len(recent) < 2:
        raise ValueError("forecast: at least two timestamps are needed to extrapolate the dates")
    with warnings.catch_warnings():  # pandas 3 announces an offset instead of a string: date_range takes both
        warnings.simplefilter("ignore")
        freq = pd.infer_freq(recent) if len(recent) >= 3 else None
    if freq is None:
        steps, counts = np.unique(np.diff(recent.asi8), return_counts=True)
        if steps[counts.argmax()] <= 0:
            raise ValueError("forecast: the history's timestamps do not advance (their most common step is "
                             f"{pd.Timedelta(int(steps[counts.argmax()]), unit='ns')}); cannot extrapolate the dates")
        step = pd.Timedelta(int(steps[counts.argmax()]), unit="ns")
        freq = f"{step.days}D" if tz is not None and step % pd.Timedelta(days=1) == pd.Timedelta(0) else step
    return own.append(pd.date_range(recent[-1], periods=n - len(own) + 1, freq=freq)[1:])




def forecast_checkpoint(checkpoint, *, config=None, data: str | None = None, data_args: dict | None = None,
                        history=None, end: int | None = None, horizon: int | None = None, device: str = "cpu",
                        allow_data_mismatch: bool = False, progress=None):
    """``pandas.DataFrame`` of the forecast of ``checkpoint`` after row ``end`` of ``history`` (a CSV path read as
    the training file is, or a DataFrame; default: the training file itself); see :func:`forecast_series`. The data
    come from ``config``, or the class path ``data`` with ``data_args`` on top of the datamodule hyper-parameters
    the checkpoint stored (a checkpoint of a plain ``Trainer.fit``, e.g. ``hoformer demo``'s, stores them without
    their class), or the checkpoint / its run folder alone: a ``save_pretrained`` folder written at the end of a fit
    carries them (``data.json``, :func:`hoformer.checkpoint.save_data_config`), with the training scaler, so that a
    ``history`` is forecast without reading the training file. A checkpoint trained on other data is refused unless
    ``allow_data_mismatch``. ``progress``: a function called with a line at each step (loading, reading the data)."""
    import time

    from hoformer.checkpoint import load_checkpoint

    say = progress or (lambda line: None)
    t0 = time.time()
    say(f"loading {checkpoint} ...")
    model, info = load_checkpoint(checkpoint, map_location=device)
    name = getattr(model, "config", {}).get("name", type(model).__name__)
    say(f"loaded {name} (lookback {getattr(model, 'seq_len', '?')}, horizon {getattr(model, 'pred_len', '?')}) "
        f"in {time.time() - t0:.1f} s")
    recorded = info.get("data_config") or {}
    scaler = data_config_scaler(recorded)
    if (history is not None and scaler is not None and recorded.get("variate_names") and config is None
            and data is None and not data_args):  # the folder has everything: the training file is not read
        say(f"the training data's scaler and columns from {Path(info['path']) / 'data.json'}")
        return forecast_series(model.to(device), scaler, recorded["variate_names"], history,
                               seq_len=recorded.get("seq_len"), pred_len=recorded.get("pred_len"),
                               features=recorded.get("features", "M"), end=end, horizon=horizon)
    stored = info["datamodule"] or {}
    if data is not None and not stored.get("_class_path"):
        data_args = {**{k: v for k, v in stored.items() if not k.startswith("_")}, **(data_args or {})}
    t1 = time.time()
    say("reading the training data (its scaler and columns) ...")
    dm = checkpoint_datamodule(info, config=config, data=data, data_args=data_args,
                               allow_data_mismatch=allow_data_mismatch, override="pass --allow-data-mismatch")
    if not isinstance(dm, LTSFDataModule):
        raise ValueError(f"forecast: the checkpoint's data ({type(dm).__name__}) is not an LTSF datamodule; pass "
                         "--config with an LTSFDataModule `data` section")
    if history is None or isinstance(history, (str, Path)):
        history = dm.history(history)
    source = dm.series.source if dm.series is not None else "the data"
    say(f"read {source if '(' in source else Path(source).name} in {time.time() - t1:.1f} s")
    return forecast_series(model.to(device), dm.scaler, dm.variate_names, history, seq_len=dm.seq_len,
                           pred_len=dm.pred_len, features=dm.features, end=end, horizon=horizon)


def forecast_main(argv: Sequence[str] | None = None) -> int:
    """``hoformer forecast``: forecast the steps after the end of a series with a trained forecaster (CSV out)."""
    import re

    text = __doc__.split("Forecasting\n-----------\n", 1)[1].split("\n\n")[0].replace("::", ":")
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")  # reST roles and literals as plain text
    p = argparse.ArgumentParser(prog="hoformer forecast", description=text,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "--ckpt", required=True, help="Lightning .ckpt or save_pretrained folder")
    p.add_argument("--config", help="LightningCLI YAML whose `data` section gives the LTSF data (default: the "
                                    "checkpoint's stored datamodule or its run's config.yaml)")
    p.add_argument("--data", help="datamodule class path (e.g. hoformer.data.LTSFDataModule) when the checkpoint "
                                  "stores its hyper-parameters but not its class (a plain Trainer.fit)")
    p.add_argument("--data-args", default="{}", help="JSON overrides of the data's init args (e.g. root)")
    p.add_argument("--history", help="CSV in the LTSF layout to forecast from (default: the training file); its "
                                     "columns must include the training ones")
    p.add_argument("--end", type=int, help="forecast from this 0-based row (default: after the last row)")
    p.add_argument("--horizon", type=int, help="forecast steps (default: the data's pred_len); another horizon "
                                                "needs a model that generates any horizon (hot_causal_forecaster)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--allow-data-mismatch", action="store_true",
                   help="forecast with data other than the checkpoint's own (default: refused)")
    p.add_argument("--output", default="forecast.csv", help="CSV to write (default forecast.csv)")
    a = p.parse_args(argv)
    try:
        data_args = json.loads(a.data_args)
    except json.JSONDecodeError as e:
        p.error(f"--data-args must be a JSON object: {e}")
    if not isinstance(data_args, dict):
        p.error("--data-args must be a JSON object")
    def say(line: str) -> None:
        print(f"hoformer forecast: {line}", file=sys.stderr, flush=True)

    try:
        df = forecast_checkpoint(a.checkpoint, config=a.config, data=a.data, data_args=data_args, history=a.history,
                                 end=a.end, horizon=a.horizon, device=a.device,
                                 allow_data_mismatch=a.allow_data_mismatch, progress=say)
    except (FileNotFoundError, ValueError, TypeError) as e:  # input errors (incl. wrong data args): one line
        print(f"hoformer forecast: error: {e}", file=sys.stderr)
        return 2
    out = Path(a.output)
    try:
        atomic_write(out, lambda tmp: df.to_csv(tmp, index=False))
    except OSError as e:  # a directory, a full disk, no permission: one line naming the file
        print(f"hoformer forecast: error: --output: {e}", file=sys.stderr)
        return 2
    first, last = df.iloc[0, 0], df.iloc[-1, 0]
    print(f"hoformer forecast: {len(df)} steps ({first} .. {last}) x {df.shape[1] - 1} column(s) -> {out}")
    return 0
