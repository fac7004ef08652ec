"""Chronological split protocols: the rows of Time-Series-Library (:func:`ltsf_borders`) and the windows of DCRNN /
torch-spatiotemporal (:func:`split_windows`), both behind the one splitter :func:`chronological_split`."""
from __future__ import annotations

import numpy as np

from hoformer._checks import check_int

from .._utils import SchemaError

__all__ = ["window_starts", "split_windows", "ltsf_borders", "chronological_split", "ROW_PROTOCOLS",
           "WINDOW_PROTOCOLS", "PROTOCOL_NAMES", "SPLITS"]

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
                                 f"lookback), too few for seq_len={window} + pred_len={horizon}: give a shorter "
                                 f"lookback or horizon (the datamodule's seq_len / pred_len, on the command line "
                                 f"--data.init_args.seq_len / --data.init_args.pred_len; the model takes both from "
                                 f"the data) or a longer series")
            out[s] = b1[i] + np.arange(n)
        return out, b2[0]
    if protocol not in WINDOW_PROTOCOLS:
        raise ValueError(f"protocol must be one of {ROW_PROTOCOLS + WINDOW_PROTOCOLS}, got {protocol!r}")
    starts = window_starts(num_steps, window, horizon)
    idx = split_windows(len(starts), val_ratio, test_ratio, protocol=protocol, gap=window)
    out = dict(zip(SPLITS, (starts[i] for i in idx)))
    return out, int(out["train"][-1]) + window + horizon

