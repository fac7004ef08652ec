"""Calendar features of timestamps (:func:`time_features`: Time-Series-Library's ``timeenc=1`` features, or the
traffic models' minute-of-day / day-of-week integers)."""
from __future__ import annotations

import numpy as np

__all__ = ["time_features"]

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

