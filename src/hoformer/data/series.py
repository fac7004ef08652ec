"""Windowed series: the one data contract of forecasting (LTSF CSVs, a CSV of your own) and traffic (METR-LA /
PEMS-BAY ``.h5``, Los-loop).

Mode order
----------
A series is an array ``(time, *space, channels)``: an LTSF file is ``(T, C)`` (``C`` variates, no space mode), a
traffic series ``(T, N, C)`` (``N`` sensors, ``C`` channels: speed, ``C = 1``). Windows and batches keep that order
behind the batch dimension: ``x (B, P, *space, C)``.

Pipeline
--------
:class:`SeriesDataModule` runs it once, in ``setup``, for every split together:
read (:func:`read_series_table` for CSVs, :func:`check_series_frame` for any table: numeric columns, finite values,
distinct column names, time order) -> :func:`chronological_split` (absolute window starts of each split, and the rows
the training windows cover) -> one :class:`StandardScaler` fitted on those training rows only (observed entries
only) -> the scaled series -> :class:`SeriesWindows` of each split over it. :func:`time_features` gives the calendar
features of the timestamps. :class:`~hoformer.data.LTSFDataModule` and :class:`~hoformer.data.TrafficDataModule`
are configurations of it (which files, which split protocol, which scaler ``eps``, which time features).

Batch format
------------
Every item (and, through PyTorch's default collate, every batch) is a dict:

==============  ==========================  ====================================================================
key             shape                       meaning
==============  ==========================  ====================================================================
``x``           ``(B, P, *space, C)``       inputs on the model's scale (standardised; missing entries 0), float32
``y``           ``(B, Q, *space, C_y)``     targets on the model's scale, float32 (``C_y = C``, or 1: one target
                                            channel, the last input channel, TSLib's ``features="MS"``)
``mean``        ``(B, C_y)``                scaler statistics of the target channels: the original scale is
``std``         ``(B, C_y)``                ``y * std + mean`` (the same for predictions), float32
``mask``        ``(B, P, *space, C)``       observed inputs (bool); only for series with missing values (traffic:
``y_mask``      ``(B, Q, *space, C_y)``     zeros are missing); absent: every entry is observed
``time``        ``(B, P, F)``               time features of the input steps (when asked for and known)
``y_time``      ``(B, Q, F)``               time features of the target steps
``y_known``     ``(B, label_len, C_y)``     the ``label_len`` steps before the horizon (TSLib decoder start; only
                                            when ``label_len > 0``), model scale
==============  ==========================  ====================================================================

A task needs nothing else: metrics on the original scale come from ``mean`` / ``std``, masked metrics from
``y_mask``.

Data signature
--------------
:meth:`SeriesDataModule.data_signature` summarises what a model trained on the data depends on (file, series names,
lookback, horizon, a digest of the scaler); :func:`check_data_signature` compares a stored one with the current one
and names every difference, so a checkpoint is not silently tested on other data.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset, RandomSampler, SequentialSampler

from hoformer._checks import check_int

from ._base import SplitDataModule
from ._utils import SchemaError

__all__ = [
    "StandardScaler",
    "read_series_table",
    "check_series_frame",
    "check_time_order",
    "time_features",
    "window_starts",
    "split_windows",
    "ltsf_borders",
    "chronological_split",
    "SeriesWindows",
    "Series",
    "SeriesDataModule",
    "DataMismatchError",
    "check_data_signature",
    "ROW_PROTOCOLS",
    "WINDOW_PROTOCOLS",
]

#: protocols that split the rows (Time-Series-Library): validation / test start ``window`` rows before their border
ROW_PROTOCOLS = ("etth", "ettm", "custom", "solar")
#: protocols that split the windows (DCRNN, torch-spatiotemporal)
WINDOW_PROTOCOLS = ("dcrnn", "tsl")
#: each protocol in the words of ``hoformer fit``'s data line (:meth:`SeriesDataModule.split_summary`)
PROTOCOL_NAMES = {
    "etth": "12/4/4 months of hourly rows (ETTh protocol)",
    "ettm": "12/4/4 months of 15-minute rows (ETTm protocol)",
    "custom": "70/10/20 of all rows (custom CSV protocol)",
    "solar": "70/10/20 of all rows (solar protocol: 10 % validation rows, the last 20 % test)",
    "dcrnn": "DCRNN protocol",
    "tsl": "torch-spatiotemporal protocol",
}
SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------------ scaler
class StandardScaler:
    """Per-channel standardisation ``(x - mean) / (std + eps)`` over every axis but the last.

    Fitted on the training rows only, on observed entries only when a ``mask`` is given (Weaver eqs 62-63); the
    population standard deviation, with a channel that is constant on the training rows keeping ``std = 1``
    (Time-Series-Library / scikit-learn). ``eps``: 0 for complete LTSF files (TSLib's numbers), ``1e-8`` for traffic
    (DCRNN / torch-spatiotemporal). Statistics are float64 ``(C,)``; :attr:`scale` is ``std + eps``.
    """

    def __init__(self, eps: float = 0.0) -> None:
        self.eps = float(eps)
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    def fit(self, values: np.ndarray, mask: np.ndarray | None = None) -> "StandardScaler":
        axes = tuple(range(values.ndim - 1))
        if mask is None:
            self.mean, std = values.mean(axes), values.std(axes)
        else:
            m = mask.astype(np.float64)
            n = m.sum(axes)
            if (n == 0).any():
                raise ValueError("StandardScaler.fit: a channel has no observed value in the training rows")
            self.mean = (values * m).sum(axes) / n
            std = np.sqrt((m * (values - self.mean) ** 2).sum(axes) / n)
        self.std = np.where(std == 0, 1.0, std)
        return self

    @property
    def scale(self) -> np.ndarray:
        return self.std + self.eps

    def channels(self, index) -> "StandardScaler":
        """The scaler of the channels ``index`` (a slice or index list), e.g. ``channels(slice(-1, None))``: the
        target of ``features="MS"``."""
        out = StandardScaler(self.eps)
        out.mean, out.std = np.atleast_1d(self.mean[index]), np.atleast_1d(self.std[index])
        return out

    def _check_width(self, values, what: str) -> None:
        if values.shape[-1] != len(self.mean):
            raise ValueError(f"StandardScaler.{what}: expected a last dimension of {len(self.mean)} (the channels "
                             f"it was fitted on), got shape {tuple(values.shape)}; channels(...) gives the scaler "
                             "of a subset")

    def transform(self, values, mask: np.ndarray | None = None):
        """Standardised ``values`` (numpy: float64; torch: its dtype and device; last dim = channels); entries
        outside ``mask`` are 0."""
        self._check_width(values, "transform")
        if isinstance(values, torch.Tensor):
            kw = dict(dtype=values.dtype, device=values.device)
            return (values - torch.as_tensor(self.mean, **kw)) / torch.as_tensor(self.scale, **kw)
        out = (values - self.mean) / self.scale
        return out if mask is None else out * mask

    def inverse_transform(self, values):
        """The original scale of standardised ``values`` (numpy or torch, last dim = channels)."""
        self._check_width(values, "inverse_transform")
        if isinstance(values, torch.Tensor):
            return values * torch.as_tensor(self.scale, dtype=values.dtype, device=values.device) + torch.as_tensor(
                self.mean, dtype=values.dtype, device=values.device)
        return values * self.scale + self.mean

    def digest(self) -> str:
        """A short digest of the statistics (9 significant digits, so that the same data fitted on another machine
        gives the same digest)."""
        text = ",".join(f"{v:.9g}" for v in np.concatenate([np.ravel(self.mean), np.ravel(self.scale)]))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------------ reader
def _decode_error(path: str, encoding: str) -> str | None:
    """``"line N (byte 0x.. at column k)"`` of the first line of ``path`` that does not decode as ``encoding``."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode(encoding)
            except UnicodeDecodeError as e:
                return f"line {n} (byte 0x{line[e.start]:02x} at column {e.start + 1})"
    return None


def _repeated(names, source: str, first_column: int = 1) -> None:
    """SchemaError naming the first column name that appears twice (pandas would rename the second ``a.1``)."""
    seen: dict[str, int] = {}
    for j, name in enumerate(names):
        key = str(name).strip()
        if key in seen:
            raise SchemaError(f"{source}: column name {key!r} is repeated in the header (columns #{seen[key]} and "
                              f"#{j + first_column}); expected one distinct name per column: rename or drop one")
        seen[key] = j + first_column


def check_series_frame(df, source: str, where: Callable[[int], str], *, first_column: int = 1,
                       complete_hint: str = "", dtype=np.float64) -> np.ndarray:
    """The values of a table of series (a ``pandas.DataFrame``, one column per series) as a ``(T, C)`` array of
    ``dtype``, after the checks every series file gets: distinct column names, at least one row, numeric columns,
    finite values. Each error is a :class:`SchemaError` naming ``source``, the column (name and 1-based number
    ``#j``, counted from ``first_column``) and the row (``where(i)`` of the 0-based row ``i``, e.g. its file line)."""
    import pandas as pd

    _repeated(list(df.columns), source, first_column)
    if len(df) == 0 or df.shape[1] == 0:
        raise SchemaError(f"{source}: no data rows" if df.shape[1] else f"{source}: no data columns")
    for j, c in enumerate(df.columns):
        col = df.iloc[:, j]
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            num = pd.to_numeric(col, errors="coerce")
            bad = np.flatnonzero(num.isna().to_numpy() & col.notna().to_numpy())
            i = int(bad[0]) if bad.size else 0
            raise SchemaError(f"{source}: column {c!r} (#{j + first_column}) must be numeric, got {col.iloc[i]!r} "
                              f"at {where(i)}")
    values = np.asarray(df.to_numpy(), dtype=dtype)
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        i, j = bad[0]
        raise SchemaError(f"{source}: missing or non-finite value (NaN or inf) in column {df.columns[j]!r} "
                          f"(#{j + first_column}) at {where(int(i))} ({len(bad)} such cells){complete_hint}")
    return values


def check_time_order(dates: np.ndarray, source: str, where: Callable[[int], str], hint: str = "") -> None:
    """SchemaError when timestamps go back in time (a newest-first or shuffled export would be windowed out of
    order); repeated timestamps are allowed (the Weather file repeats one)."""
    back = np.flatnonzero(np.diff(np.asarray(dates).astype("datetime64[ns]").astype("int64")) < 0)
    if back.size:
        import pandas as pd

        i = int(back[0]) + 1
        raise SchemaError(f"{source}: timestamps go back in time at {where(i)} ({pd.Timestamp(dates[i - 1])} then "
                          f"{pd.Timestamp(dates[i])}; {back.size} such step(s)); the rows must be in time order, "
                          f"oldest first{hint}")


def read_series_table(path, header: bool = True, *, dated: bool | None = None, encoding: str = "utf-8"):
    """Parse and schema-check a CSV of series -> ``(dates datetime64[ns] | None, values float64 (T, C), columns)``;
    arrays are read-only and cached per (path, mtime, size, options), so every user of one file parses it once.

    ``header=True``: a header line of column names (each name once); ``dated`` (default: ``header``): the first
    column is ``date`` (the LTSF layout ``date,<series_1>,...``), whose timestamps must not go back in time (repeated
    ones are allowed; UTC offsets are converted to naive UTC). ``header=False``: bare comma-separated values (solar,
    an adjacency matrix), columns named ``0, 1, ...``. Every other column must be numeric and finite
    (:func:`check_series_frame`). A line that does not decode as ``encoding`` is an error naming it."""
    dated = header if dated is None else dated
    if dated and not header:
        raise ValueError("read_series_table: a `date` column needs a header (dated=True, header=False)")
    st = Path(path).stat()
    return _read_table(str(path), header, dated, encoding, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_table(path: str, header: bool, dated: bool, encoding: str, _mtime_ns: int, _size: int):
    import pandas as pd

    try:
        if header:
            df = pd.read_csv(path, encoding=encoding, skipinitialspace=True)
            names = pd.read_csv(path, encoding=encoding, skipinitialspace=True, header=None, nrows=1).iloc[0].tolist()
        else:  # solar_AL.txt, an adjacency: comma-separated values, no header, no date column
            df = pd.read_csv(path, header=None, encoding=encoding)
            names = list(df.columns)
    except UnicodeDecodeError as e:
        where = _decode_error(path, encoding) or f"byte offset {e.start}"
        raise SchemaError(f"{path}: {where} is not valid {encoding} text ({e.reason}); pass the file's encoding, "
                          "e.g. encoding='latin-1'") from e
    except LookupError as e:
        raise ValueError(f"{path}: unknown encoding {encoding!r} ({e})") from e
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise SchemaError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from e
    _repeated(names, path)
    columns = [str(c).strip() for c in df.columns]
    first_row = 2 if header else 1  # file line number of the first data row
    line = lambda i: f"line {i + first_row}"  # noqa: E731
    dates = None
    if dated:
        if not columns or columns[0] != "date":
            raise SchemaError(f"{path}: expected the LTSF layout 'date,<variate_1>,...,<variate_C>' with a 'date' "
                              f"first column, got columns {columns[:6]}{' ...' if len(columns) > 6 else ''}")
        if len(columns) < 2:
            raise SchemaError(f"{path}: expected at least one variate column after 'date', got none")
        # utc=True: timestamps with UTC offsets (mixed across DST, as pandas writes tz-aware series) become naive UTC;
        # naive ones are unchanged
        parsed = pd.to_datetime(df.iloc[:, 0], errors="coerce", utc=True).dt.tz_localize(None)
        bad = np.flatnonzero(parsed.isna().to_numpy())
        if bad.size:
            raise SchemaError(f"{path}: unparsable 'date' value {df.iloc[bad[0], 0]!r} at {line(bad[0])}")
        dates = parsed.to_numpy(dtype="datetime64[ns]")
        check_time_order(dates, path, line, hint=": sort the file by its 'date' column")
        dates.setflags(write=False)  # cached: shared by every user of the file
        df, columns = df.iloc[:, 1:], columns[1:]
    if header:
        df = df.set_axis(columns, axis=1)
    values = check_series_frame(df, path, line, first_column=2 if dated else 1,
                                complete_hint="; series files must be complete")
    values.setflags(write=False)
    return dates, values, tuple(columns)


# ----------------------------------------------------------------------------------------------- time features
_CALENDAR_SETS = {"s": ["second", "minute", "hour", "dow", "dom", "doy"], "t": ["minute", "hour", "dow", "dom", "doy"],
                  "h": ["hour", "dow", "dom", "doy"], "d": ["dow", "dom", "doy"], "b": ["dow", "dom", "doy"],
                  "w": ["dom", "woy"], "m": ["moy"]}


def time_features(timestamps, freq: str = "h", *, encoding: str = "calendar") -> np.ndarray:
    """Time features of ``(T,)`` timestamps.

    ``encoding="calendar"``: Time-Series-Library ``timeenc=1`` features in [-0.5, 0.5], float32 ``(T, F)``; ``freq``
    "h" hour / day-of-week / day-of-month / day-of-year, "t" (minutes) adds minute-of-hour, "s" adds
    second-of-minute, "d" / "b" day-of-week / month / year, "w" day-of-month / week-of-year, "m" month-of-year.

    ``encoding="daily"``: ``[minute of day, day of week (Mon = 0)]`` int16 ``(T, 2)`` (the traffic models' cyclic
    encoding computes in float32 from these integers, so a ``bf16-true`` run cannot round minute 1435 to 1432);
    ``freq`` is not used.
    """
    import pandas as pd

    idx = pd.DatetimeIndex(timestamps)
    if encoding == "daily":
        return np.stack([idx.hour * 60 + idx.minute, idx.dayofweek], axis=-1).astype(np.int16)
    if encoding != "calendar":
        raise ValueError(f"time_features: `encoding` must be 'calendar' or 'daily', got {encoding!r}")
    feats = {
        "second": lambda: idx.second / 59.0 - 0.5,
        "minute": lambda: idx.minute / 59.0 - 0.5,
        "hour": lambda: idx.hour / 23.0 - 0.5,
        "dow": lambda: idx.dayofweek / 6.0 - 0.5,
        "dom": lambda: (idx.day - 1) / 30.0 - 0.5,
        "doy": lambda: (idx.dayofyear - 1) / 365.0 - 0.5,
        "moy": lambda: (idx.month - 1) / 11.0 - 0.5,
        "woy": lambda: (np.asarray(idx.isocalendar().week, dtype=np.float64) - 1) / 52.0 - 0.5,
    }
    key = freq.lower().lstrip("0123456789")
    key = "t" if key == "min" else key  # "10min", "15min" -> "min" above
    if key not in _CALENDAR_SETS:
        raise ValueError(f"freq must be one of {sorted(_CALENDAR_SETS)} (or 'min'), got {freq!r}")
    return np.stack([np.asarray(feats[k](), dtype=np.float64) for k in _CALENDAR_SETS[key]], -1).astype(np.float32)


# ------------------------------------------------------------------------------------------ splits and windows
def window_starts(num_steps: int, window: int, horizon: int, stride: int = 1) -> np.ndarray:
    """Start indices of every ``window + horizon`` slice of a ``num_steps`` series."""
    for name, v in (("window", window), ("horizon", horizon), ("stride", stride)):
        check_int("window_starts", name, v, note=" (time steps)")
    last = num_steps - window - horizon
    if last < 0:
        raise ValueError(f"window_starts: series of {num_steps} steps is shorter than window + horizon "
                         f"= {window + horizon}")
    return np.arange(0, last + 1, stride)


def split_windows(num_windows: int, val_ratio: float = 0.1, test_ratio: float = 0.2, *, protocol: str = "dcrnn",
                  gap: int = 12):
    """Chronological 70/10/20 split of window indices -> ``(train, val, test)`` index arrays.

    ``protocol="dcrnn"`` (Li et al. 2018's ``generate_training_data.py``): ``round(n * test_ratio)`` test and
    ``round(n * (1 - val_ratio - test_ratio))`` training windows, the rest validation, contiguous.
    ``protocol="tsl"`` (torch-spatiotemporal's ``TemporalSplitter``, used by the Weaver paper): ``int(n *
    test_ratio)`` test windows, ``int((n - n_test) * val_ratio)`` validation windows before them, and the ``gap``
    windows (TSL's ``samples_offset`` = the input window length) before each boundary dropped, so no training target
    reaches into a validation target and no validation target into a test target.
    """
    if not (0 <= val_ratio < 1 and 0 < test_ratio < 1 and val_ratio + test_ratio < 1):
        raise ValueError(f"split_windows: need 0 <= val_ratio, 0 < test_ratio, sum < 1; got {val_ratio}, {test_ratio}")
    if protocol not in WINDOW_PROTOCOLS:
        raise ValueError(f"split_windows: `protocol` must be 'dcrnn' or 'tsl', got {protocol!r}")
    idx = np.arange(num_windows)
    if protocol == "dcrnn":
        n_test = round(num_windows * test_ratio)
        n_train = round(num_windows * (1 - val_ratio - test_ratio))
        n_val = num_windows - n_test - n_train
        return idx[:n_train], idx[n_train:n_train + n_val], idx[n_train + n_val:]
    if gap < 0:
        raise ValueError(f"split_windows: `gap` must be >= 0, got {gap}")
    test_start = num_windows - int(test_ratio * num_windows)
    val_start = test_start - int(val_ratio * test_start)
    if val_start - gap < 1 or test_start - gap <= val_start:
        raise ValueError(f"split_windows: {num_windows} windows are too few for the 'tsl' split with gap {gap}")
    return idx[:val_start - gap], idx[val_start:test_start - gap], idx[test_start:]


def ltsf_borders(protocol: str, n_rows: int, seq_len: int) -> tuple[list[int], list[int]]:
    """Row borders ``(border1s, border2s)`` of train / val / test for a file of ``n_rows`` rows (Time-Series-Library):
    ETTh 12/4/4 months of hourly rows, ETTm the same at 15 minutes, every other file 70/10/20 % of the rows (solar:
    ``int(0.1 n)`` validation rows); validation and test start ``seq_len`` rows before their border."""
    if protocol in ("etth", "ettm"):
        m = 30 * 24 * (4 if protocol == "ettm" else 1)
        b2 = [12 * m, 16 * m, 20 * m]
        if n_rows < b2[2]:
            raise SchemaError(f"the {protocol.upper()} protocol (12/4/4 months) needs at least {b2[2]} rows, the file "
                              f"has {n_rows}")
        b1 = [0, b2[0] - seq_len, b2[1] - seq_len]
    elif protocol in ("custom", "solar"):
        num_train, num_test = int(n_rows * 0.7), int(n_rows * 0.2)
        num_val = int(n_rows * 0.1) if protocol == "solar" else n_rows - num_train - num_test
        b1 = [0, num_train - seq_len, n_rows - num_test - seq_len]
        b2 = [num_train, num_train + num_val, n_rows]
    else:
        raise ValueError(f"protocol must be one of {ROW_PROTOCOLS + WINDOW_PROTOCOLS}, got {protocol!r}")
    if b1[1] < 0:  # the validation lookback would start before the first row (a negative index wraps around)
        raise ValueError(f"seq_len={seq_len} is longer than the training slice ({b2[0]} rows of {n_rows})")
    return b1, b2


def chronological_split(protocol: str, num_steps: int, window: int, horizon: int, *, val_ratio: float = 0.1,
                        test_ratio: float = 0.2) -> tuple[dict[str, np.ndarray], int]:
    """The one chronological splitter: ``({split: window starts (absolute rows)}, training rows)``.

    Row protocols (:data:`ROW_PROTOCOLS`, :func:`ltsf_borders`): every window whose input and target lie inside a
    split's rows. Window protocols (:data:`WINDOW_PROTOCOLS`, :func:`split_windows` of ``val_ratio`` / ``test_ratio``,
    the ``tsl`` gap = ``window``). ``training rows``: the scaler is fitted on rows ``[0, training rows)``.
    """
    if protocol in ROW_PROTOCOLS:
        b1, b2 = ltsf_borders(protocol, num_steps, window)
        out = {}
        for i, s in enumerate(SPLITS):
            n = b2[i] - b1[i] - window - horizon + 1
            if n < 1:
                raise ValueError(f"the {s} slice has {b2[i] - b1[i]} rows (incl. the {window if i else 0}-row "
                                 f"lookback), too few for seq_len={window} + pred_len={horizon}")
            out[s] = b1[i] + np.arange(n)
        return out, b2[0]
    if protocol not in WINDOW_PROTOCOLS:
        raise ValueError(f"protocol must be one of {ROW_PROTOCOLS + WINDOW_PROTOCOLS}, got {protocol!r}")
    starts = window_starts(num_steps, window, horizon)
    idx = split_windows(len(starts), val_ratio, test_ratio, protocol=protocol, gap=window)
    out = dict(zip(SPLITS, (starts[i] for i in idx)))
    return out, int(out["train"][-1]) + window + horizon


# ------------------------------------------------------------------------------------------------------ windows
class SeriesWindows(Dataset):
    """Windows of a scaled series ``(T, *space, C)``: item ``i`` reads input rows ``[s, s + window)`` and target rows
    ``[s + window, s + window + horizon)`` of ``s = starts[i]``, as a dict in the batch format of the module doc.

    Args:
        data: scaled series (float32 tensor or array).
        starts: window start rows (absolute rows of ``data``).
        window, horizon: ``P`` and ``Q``.
        mean, std: scaler statistics ``(C,)`` (``std`` with the scaler's ``eps`` added); for the target channels.
        mask: observed entries of ``data`` (bool), or ``None`` (complete).
        time: time features ``(T, F)`` of the rows, or ``None``.
        label_len: known steps before the horizon returned as ``y_known``.
        target_last: the target is the last channel only (``y (Q, *space, 1)``).
        columns: names of the series (LTSF: the variates, the channel mode; traffic: the sensors).
    """

    def __init__(self, data, starts, window: int, horizon: int, mean, std, *, mask=None, time=None,
                 label_len: int = 0, target_last: bool = False, columns=()) -> None:
        self.data = torch.as_tensor(data)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.window, self.horizon, self.label_len, self.target_last = window, horizon, label_len, target_last
        mean, std = torch.as_tensor(np.asarray(mean), dtype=torch.float32), torch.as_tensor(np.asarray(std),
                                                                                             dtype=torch.float32)
        self.target_mean, self.target_std = (mean[-1:], std[-1:]) if target_last else (mean, std)
        self.mask = None if mask is None else torch.as_tensor(mask)
        self.time = None if time is None else torch.as_tensor(time)
        self.columns = list(columns)

    @property
    def num_variates(self) -> int:
        """Channels ``C`` of ``x``."""
        return self.data.shape[-1]

    def __len__(self) -> int:
        return len(self.starts)

    def to(self, device) -> "SeriesWindows":
        """A copy whose tensors (series, mask, time features, statistics, window starts) are on ``device``; the
        windows of :meth:`batch` are then gathered there."""
        out = copy.copy(self)
        for name in ("data", "mask", "time", "target_mean", "target_std"):
            value = getattr(self, name)
            setattr(out, name, None if value is None else value.to(device))
        return out

    def batch(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Items ``index`` (a 1-D integer tensor) as one batch dict, gathered on the series' device with one indexing
        operation per key: equal to PyTorch's default collate of ``[self[i] for i in index]``."""
        device = self.data.device
        s = torch.as_tensor(self.starts, device=device)[index.to(device)]  # (B,)
        steps_p = s[:, None] + torch.arange(self.window, device=device)  # (B, P) rows of the inputs
        steps_q = s[:, None] + self.window + torch.arange(self.horizon, device=device)  # (B, Q) rows of the targets
        c = slice(-1, None) if self.target_last else slice(None)
        b = len(s)
        out = {"x": self.data[steps_p], "y": self.data[steps_q][..., c],
               "mean": self.target_mean.expand(b, -1).clone(), "std": self.target_std.expand(b, -1).clone()}
        if self.mask is not None:
            out["mask"], out["y_mask"] = self.mask[steps_p], self.mask[steps_q][..., c]
        if self.time is not None:
            out["time"], out["y_time"] = self.time[steps_p], self.time[steps_q]
        if self.label_len:
            out["y_known"] = self.data[s[:, None] + self.window - self.label_len
                                       + torch.arange(self.label_len, device=device)][..., c]
        return out

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        s = int(self.starts[index])
        e = s + self.window
        p, q = slice(s, e), slice(e, e + self.horizon)
        c = slice(-1, None) if self.target_last else slice(None)
        item = {"x": self.data[p], "y": self.data[q][..., c], "mean": self.target_mean, "std": self.target_std}
        if self.mask is not None:
            item["mask"], item["y_mask"] = self.mask[p], self.mask[q][..., c]
        if self.time is not None:
            item["time"], item["y_time"] = self.time[p], self.time[q]
        if self.label_len:
            item["y_known"] = self.data[e - self.label_len:e][..., c]
        return item


class WindowBatches:
    """Batches of :class:`SeriesWindows` gathered where the windows are (:meth:`SeriesWindows.batch`): a loader for
    series that fit in the accelerator's memory, without DataLoader workers or a host-to-device copy per batch.

    The order comes from ``sampler`` (a ``RandomSampler`` over the windows when ``shuffle``, drawn when the first
    batch is asked for, so a task's per-epoch reseeding of ``sampler.generator`` makes it exact on resume; else the
    given sampler or the windows in order), in batches of ``batch_size``, the last one partial: the batches of a
    ``DataLoader`` with the same sampler and PyTorch's default collate.
    """

    def __init__(self, windows: SeriesWindows, batch_size: int, *, shuffle: bool = False, sampler=None) -> None:
        self.dataset, self.batch_size = windows, batch_size
        self.sampler = RandomSampler(windows) if shuffle else (sampler or SequentialSampler(windows))
        self.batch_sampler = None  # the DataLoader attributes Lightning reads to tell a shuffled loader

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        order = torch.as_tensor(list(self.sampler), dtype=torch.long)
        for i in range(0, len(order), self.batch_size):
            yield self.dataset.batch(order[i:i + self.batch_size])


# ------------------------------------------------------------------------------------------------- datamodule
@dataclass(frozen=True)
class Series:
    """A series as read, on the original scale: ``values (T, *space, C)``; ``columns`` the names of the series (LTSF:
    the ``C`` variates; traffic: the ``N`` sensors); ``source`` the file (or generator) it came from; ``dates (T,)``
    datetime64 or ``None``; ``mask`` the observed entries (bool, like ``values``) or ``None`` (complete)."""
    values: np.ndarray
    columns: tuple[str, ...]
    source: str
    dates: np.ndarray | None = None
    mask: np.ndarray | None = None


class SeriesDataModule(SplitDataModule):
    """The one windowed-series datamodule: a subclass says how to read its data (:meth:`read_series`), this class
    does the rest once, in ``setup``, for all three splits: :func:`chronological_split` of the absolute window
    starts, one :class:`StandardScaler` fitted on the training rows (:attr:`scaler`), the scaled series, the
    :class:`SeriesWindows` of each split, time features, and the batches of the module doc.

    Args:
        window, horizon: lookback ``P`` and horizon ``Q`` (checked by the subclass, which names them).
        protocol: split protocol (:data:`ROW_PROTOCOLS` or :data:`WINDOW_PROTOCOLS`); ``val_ratio`` /
            ``test_ratio`` for the window protocols.
        scale: standardise (``False``: the model sees the original values; ``mean`` 0, ``std`` 1, no :attr:`scaler`).
        scaler_eps: the scaler's ``eps``.
        label_len: ``y_known`` steps; ``target_last``: the target is the last channel (``features="MS"``).
        time_encoding: ``None``, ``"calendar"`` (:func:`time_features` of ``freq``; zeros ``(T, 1)`` without
            timestamps) or ``"daily"``.
        drop_empty_windows: drop windows whose target is entirely missing (series with a mask).
        batch_size, num_workers, pin_memory, eval_batch_size: the loaders (:class:`SplitDataModule`).
        on_device: keep the scaled series on the trainer's device and gather each batch there
            (:class:`WindowBatches`: no DataLoader workers, no copy per batch; the same batches, in the same order, as
            the DataLoaders). For series that fit in the device's memory, such as the LTSF and traffic benchmarks on a
            GPU, where per-batch loading otherwise dominates the step of a small model. Needs ``num_workers=0``.
    """

    def __init__(self, *, window: int, horizon: int, protocol: str, val_ratio: float = 0.1, test_ratio: float = 0.2,
                 scale: bool = True, scaler_eps: float = 0.0, label_len: int = 0, target_last: bool = False,
                 time_encoding: str | None = None, freq: str = "h", drop_empty_windows: bool = False,
                 batch_size: int = 32, num_workers: int = 0, pin_memory: bool = False,
                 eval_batch_size: int | None = None, on_device: bool = False) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                         eval_batch_size=eval_batch_size)
        if not isinstance(on_device, (bool, np.bool_)):
            named = ""
            if isinstance(on_device, (str, torch.device)):  # a device name: say whether this machine has it
                from hoformer._io import check_device

                try:
                    check_device(on_device, type(self).__name__)
                except ValueError as e:
                    named = f"; {str(e).split(': ', 1)[-1].split(';')[0]}"
            raise TypeError(f"{type(self).__name__}: `on_device` must be True or False (True: keep the series on the "
                            "trainer's device, which Trainer(accelerator=..., devices=...) chooses), got "
                            f"{on_device!r}{named}")
        if on_device and num_workers:
            raise ValueError(f"{type(self).__name__}: on_device=True gathers the batches on the device, without "
                             f"DataLoader workers; got num_workers={num_workers} (set it to 0)")
        self.on_device = bool(on_device)
        self._on: dict[tuple[str, str], SeriesWindows] = {}
        if protocol not in ROW_PROTOCOLS + WINDOW_PROTOCOLS:
            raise ValueError(f"{type(self).__name__}: protocol must be one of {ROW_PROTOCOLS + WINDOW_PROTOCOLS}, "
                             f"got {protocol!r}")
        if time_encoding not in (None, "calendar", "daily"):
            raise ValueError(f"{type(self).__name__}: time_encoding must be None, 'calendar' or 'daily', got "
                             f"{time_encoding!r}")
        self.window, self.horizon, self.protocol = window, horizon, protocol
        self.val_ratio, self.test_ratio = val_ratio, test_ratio
        self.scale, self.scaler_eps, self.label_len, self.target_last = scale, scaler_eps, label_len, target_last
        self.time_encoding, self.freq, self.drop_empty_windows = time_encoding, freq, drop_empty_windows
        self.series: Series | None = None
        self.scaler: StandardScaler | None = None

    # ---------------------------------------------------------------------------------------------- hook
    def read_series(self) -> Series:
        """Read (and check) the data: a :class:`Series` on the original scale."""
        raise NotImplementedError(f"{type(self).__name__} must override read_series()")

    # ------------------------------------------------------------------------------------------- building
    def _make_splits(self, names) -> dict[str, SeriesWindows]:
        """All three splits at once, whichever ``names`` were asked for: one read, one split, one scaler."""
        series = self.read_series()
        for array in (series.values, series.dates, series.mask):  # shared by every split and user: read-only
            if array is not None:
                array.setflags(write=False)
        values, mask = series.values, series.mask
        try:
            starts, train_rows = chronological_split(self.protocol, len(values), self.window, self.horizon,
                                                     val_ratio=self.val_ratio, test_ratio=self.test_ratio)
        except ValueError as e:  # SchemaError (too few rows for the protocol) stays one
            raise type(e)(f"{type(self).__name__} ({series.source}): {e}") from e
        c = values.shape[-1]
        if self.scale:
            scaler = StandardScaler(self.scaler_eps).fit(values[:train_rows],
                                                         None if mask is None else mask[:train_rows])
            data, mean, std = scaler.transform(values, mask), scaler.mean, scaler.scale
        else:
            scaler, mean, std = None, np.zeros(c), np.ones(c)
            data = values if mask is None else values * mask
        x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
        time = None
        if self.time_encoding == "daily":
            time = torch.from_numpy(time_features(series.dates, encoding="daily"))
        elif self.time_encoding == "calendar":
            time = torch.from_numpy(time_features(series.dates, self.freq) if series.dates is not None
                                    else np.zeros((len(values), 1), np.float32))  # no timestamps (solar)
        mask_t = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
        out = {}
        for name in SPLITS:
            s = starts[name]
            if self.drop_empty_windows and mask is not None:
                has = np.array([mask[i + self.window:i + self.window + self.horizon].any() for i in s], dtype=bool)
                s = s[has]
                if len(s) == 0:
                    raise ValueError(f"{type(self).__name__} ({series.source}): the {name} split has no window with "
                                     "an observed target")
            out[name] = SeriesWindows(x, s, self.window, self.horizon, mean, std, mask=mask_t, time=time,
                                      label_len=self.label_len, target_last=self.target_last, columns=series.columns)
        self.series, self.scaler = series, scaler
        return out

    def _loader(self, split: str, train: bool):
        if not self.on_device:
            return super()._loader(split, train)
        from hoformer.compat import trainer_eval_sampler

        self._ensure((split,))
        trainer = getattr(self, "trainer", None)
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        key = (split, str(device))
        if key not in self._on:
            self._on[key] = self.datasets[split].to(device)
        windows = self._on[key]
        if train:
            return WindowBatches(windows, self.batch_size, shuffle=True)
        return WindowBatches(windows, self.eval_batch_size, sampler=trainer_eval_sampler(windows, trainer))

    def _built(self) -> Series:
        self._ensure(SPLITS)
        return self.series

    sample_unit = "windows"

    def _split_protocol(self) -> str:
        """``"<file>, split <how>"``: the file read and the protocol that split it (:data:`PROTOCOL_NAMES`)."""
        p = self.protocol
        if p in WINDOW_PROTOCOLS:
            train = round(100 * (1 - self.val_ratio - self.test_ratio))
            how = (f"{train}/{round(100 * self.val_ratio)}/{round(100 * self.test_ratio)} of the windows "
                   f"({PROTOCOL_NAMES[p]}" + (f", {self.window} windows dropped before each border)" if p == "tsl"
                                              else ")"))
        else:
            how = PROTOCOL_NAMES[p]
        source = self.series.source if self.series is not None else "?"
        return f"{Path(source).name if '(' not in source else source}, split {how}"

    @property
    def columns(self) -> list[str]:
        """Names of the series (reads the data)."""
        return list(self._built().columns)

    # ------------------------------------------------------------------------------------------ signature
    def data_signature(self) -> dict:
        """What a model trained on this data depends on, as a JSON-able dict: ``data`` (the file name or generator),
        ``columns`` (the series' names, in the model's order), ``num_series``, ``targets`` (the forecast series),
        ``lookback``, ``horizon`` and ``scaler`` (a digest of the training statistics, ``None`` unscaled). Store it
        with a checkpoint; :func:`check_data_signature` compares it with the data a checkpoint is later used on."""
        series = self._built()
        columns = list(series.columns)
        return {"data": Path(series.source).name, "columns": columns, "num_series": len(columns),
                "targets": columns[-1:] if self.target_last else columns, "lookback": self.window,
                "horizon": self.horizon, "scaler": None if self.scaler is None else self.scaler.digest()}


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
