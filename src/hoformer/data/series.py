"""Windowed series: the one data contract of forecasting (LTSF CSVs, a CSV of your own) and traffic (METR-LA /
PEMS-BAY ``.h5``, Los-loop).

Mode order
----------
A series is an array ``(time, *space, channels)``: an LTSF file is ``(T, C)`` (``C`` variates, no space mode), a
traffic series ``(T, N, C)`` (``N`` sensors, ``C`` channels: speed, ``C = 1``). Windows and batches keep that order
behind the batch dimension: ``x (B, P, *space, C)``.

Pipeline
--------
read -> :func:`chronological_split` (window starts of each split, and the rows the training windows cover) ->
:class:`StandardScaler` fitted on those training rows only (observed entries only) -> scaled series ->
:class:`SeriesWindows` of each split. :func:`time_features` gives the calendar features of the timestamps.

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
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from hoformer._checks import check_int

from ._utils import SchemaError

__all__ = [
    "StandardScaler",
    "time_features",
    "window_starts",
    "split_windows",
    "ltsf_borders",
    "chronological_split",
    "SeriesWindows",
    "ROW_PROTOCOLS",
    "WINDOW_PROTOCOLS",
]

#: protocols that split the rows (Time-Series-Library): validation / test start ``window`` rows before their border
ROW_PROTOCOLS = ("etth", "ettm", "custom", "solar")
#: protocols that split the windows (DCRNN, torch-spatiotemporal)
WINDOW_PROTOCOLS = ("dcrnn", "tsl")
SPLITS = ("train", "val", "test")


# ------------------------------------------------------------------------------------------------------ scaler
class StandardScaler:
    """Per-channel standardisation ``(x - mean) / (std + eps)`` over every axis but the last.

    Fitted on the training rows only, on observed entries only when a ``mask`` is given (Weaver eqs 62-63); the
    population standard deviation, with a channel that is constant on the training rows keeping ``std = 1``
    (Time-Series-Library / scikit-learn). ``eps``: 0 for complete LTSF files (TSLib's numbers), ``1e-8`` for traffic
    (DCRNN / torch-spatiotemporal). Statistics are float64; :attr:`scale` is ``std + eps``.
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

    def transform(self, values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Standardised values (float64); entries outside ``mask`` are 0."""
        out = (values - self.mean) / self.scale
        return out if mask is None else out * mask

    def inverse_transform(self, values):
        """The original scale of standardised ``values`` (numpy or torch, last dim = channels)."""
        if isinstance(values, torch.Tensor):
            return values * torch.as_tensor(self.scale, dtype=values.dtype, device=values.device) + torch.as_tensor(
                self.mean, dtype=values.dtype, device=values.device)
        return values * self.scale + self.mean


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
        starts: window start rows (in ``data``).
        window, horizon: ``P`` and ``Q``.
        mean, std: scaler statistics ``(C,)`` (``std`` with the scaler's ``eps`` added); for the target channels.
        mask: observed entries of ``data`` (bool), or ``None`` (complete).
        time: time features ``(T, F)`` of the rows, or ``None``.
        label_len: known steps before the horizon returned as ``y_known``.
        target_last: the target is the last channel only (``y (Q, *space, 1)``).
    """

    def __init__(self, data, starts, window: int, horizon: int, mean, std, *, mask=None, time=None,
                 label_len: int = 0, target_last: bool = False) -> None:
        self.data = torch.as_tensor(data)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.window, self.horizon, self.label_len, self.target_last = window, horizon, label_len, target_last
        mean, std = torch.as_tensor(np.asarray(mean), dtype=torch.float32), torch.as_tensor(np.asarray(std),
                                                                                             dtype=torch.float32)
        self.target_mean, self.target_std = (mean[-1:], std[-1:]) if target_last else (mean, std)
        self.mask = None if mask is None else torch.as_tensor(mask)
        self.time = None if time is None else torch.as_tensor(time)

    def __len__(self) -> int:
        return len(self.starts)

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
