"""Traffic speed forecasting data: METR-LA / PEMS-BAY (DCRNN ``.h5`` + ``adj_mx.pkl``) and Los-loop (T-GCN CSV).

Protocol (DCRNN / torch-spatiotemporal, Weaver section 6.1): zeros are missing values; windows of ``P`` history
and ``Q`` horizon steps with stride 1; chronological 70/10/20 split of the windows; a per-channel standard
scaler fitted on the *observed* values of the time steps covered by the training windows (eqs 62-63); missing
inputs are 0 after scaling; every sample carries its observation masks. Targets stay on the original scale.

File formats
------------
* ``metr-la.h5`` / ``pems-bay.h5``: a pandas HDF store with one DataFrame (key ``df``), a 5-minute
  ``DatetimeIndex`` and one column per sensor id; ``0`` = missing.
* ``adj_mx.pkl``: pickle ``(sensor_ids, sensor_id_to_ind, adj (N, N) float32)`` (``encoding="latin1"``).
* Los-loop: ``los_speed.csv`` (header = 207 METR-LA sensor ids, 2016 rows, no timestamps: 5-minute steps from
  ``start``, default 2012-03-01 00:00) and ``los_adj.csv`` (no header, ``N x N``).
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ._base import SplitDataModule

__all__ = [
    "read_traffic_h5",
    "load_adj_pkl",
    "load_los_loop",
    "time_features",
    "StandardScaler",
    "window_starts",
    "split_windows",
    "TrafficWindows",
    "TrafficDataModule",
]


def _check_values(values: np.ndarray, source: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2 or values.size == 0:
        raise ValueError(f"{source}: expected a non-empty (time, nodes) table, got shape {values.shape}")
    bad = ~np.isfinite(values)
    if bad.any():
        t, n = np.argwhere(bad)[0]
        raise ValueError(f"{source}: {int(bad.sum())} NaN/inf values (first at row {t}, column {n}); "
                         "missing readings must be stored as 0 in this format")
    return values


def read_traffic_h5(path: str | os.PathLike, key: str | None = None):
    """Read a DCRNN-format ``.h5`` -> ``(values (T, N) float32, timestamps (T,) datetime64, sensor_ids list[str])``."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_traffic_h5: {path} not found (METR-LA: metr-la.h5, PEMS-BAY: pems-bay.h5)")
    df = pd.read_hdf(path, key=key)
    if not isinstance(df, pd.DataFrame) or not isinstance(df.index, pd.DatetimeIndex):
        raise ValueError(f"read_traffic_h5: {path} must hold a DataFrame with a DatetimeIndex, got "
                         f"{type(df).__name__} indexed by {type(getattr(df, 'index', None)).__name__}")
    values = _check_values(df.to_numpy(), str(path))
    return values, df.index.to_numpy(), [str(c) for c in df.columns]


def load_adj_pkl(path: str | os.PathLike):
    """Read a DCRNN ``adj_mx.pkl`` -> ``(sensor_ids list[str], sensor_id_to_ind dict, adj (N, N) float32)``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_adj_pkl: {path} not found")
    with open(path, "rb") as f:
        obj = pickle.load(f, encoding="latin1")
    if not (isinstance(obj, (tuple, list)) and len(obj) == 3):
        raise ValueError(f"load_adj_pkl: {path} must hold (sensor_ids, sensor_id_to_ind, adj), got {type(obj).__name__}")
    ids, id2ind, adj = obj
    adj = np.asarray(adj, dtype=np.float32)
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1] or adj.shape[0] != len(ids):
        raise ValueError(f"load_adj_pkl: adjacency {adj.shape} does not match {len(ids)} sensor ids in {path}")
    return [str(i) for i in ids], {str(k): int(v) for k, v in id2ind.items()}, adj


def load_los_loop(root: str | os.PathLike):
    """Los-loop -> ``(values (2016, 207) float32, sensor_ids, adj (207, 207) float32)`` from ``root/los_loop``."""
    import pandas as pd

    d = Path(root) / "los_loop" if (Path(root) / "los_loop").is_dir() else Path(root)
    speed, adj_path = d / "los_speed.csv", d / "los_adj.csv"
    for p in (speed, adj_path):
        if not p.is_file():
            raise FileNotFoundError(f"load_los_loop: {p} not found")
    df = pd.read_csv(speed)
    values = _check_values(df.to_numpy(), str(speed))
    adj = _check_values(pd.read_csv(adj_path, header=None).to_numpy(), str(adj_path))
    return values, [str(c) for c in df.columns], adj


def time_features(timestamps) -> np.ndarray:
    """``(T,)`` datetime64 -> ``(T, 2)`` float32 ``[minute of day, day of week (Mon = 0)]``."""
    import pandas as pd

    idx = pd.DatetimeIndex(timestamps)
    return np.stack([idx.hour * 60 + idx.minute, idx.dayofweek], axis=-1).astype(np.float32)


class StandardScaler:
    """Per-channel standardisation fitted on observed entries only (eqs 62-63): ``(x - mu) / (sigma + eps)``."""

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps, self.mean, self.std = eps, None, None

    def fit(self, values: np.ndarray, mask: np.ndarray) -> "StandardScaler":
        """``values, mask (T, N, C)``; statistics over axes (0, 1) of the observed entries."""
        m = mask.astype(np.float64)
        n = m.sum(axis=(0, 1))
        if (n == 0).any():
            raise ValueError("StandardScaler.fit: a channel has no observed value in the training split")
        self.mean = ((values * m).sum(axis=(0, 1)) / n).astype(np.float32)
        self.std = np.sqrt((m * (values - self.mean) ** 2).sum(axis=(0, 1)) / n).astype(np.float32)
        return self

    def transform(self, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return (mask * (values - self.mean) / (self.std + self.eps)).astype(np.float32)

    def inverse_transform(self, values):
        return values * (self.std + self.eps) + self.mean


def window_starts(num_steps: int, window: int, horizon: int, stride: int = 1) -> np.ndarray:
    """Start indices of every ``window + horizon`` slice of a ``num_steps`` series."""
    last = num_steps - window - horizon
    if last < 0:
        raise ValueError(f"window_starts: series of {num_steps} steps is shorter than window + horizon "
                         f"= {window + horizon}")
    return np.arange(0, last + 1, stride)


def split_windows(num_windows: int, val_ratio: float = 0.1, test_ratio: float = 0.2):
    """Chronological split of window indices -> ``(train, val, test)`` index arrays (DCRNN / TSL 70/10/20)."""
    if not (0 <= val_ratio < 1 and 0 < test_ratio < 1 and val_ratio + test_ratio < 1):
        raise ValueError(f"split_windows: need 0 <= val_ratio, 0 < test_ratio, sum < 1; got {val_ratio}, {test_ratio}")
    n_test = round(num_windows * test_ratio)
    n_val = round(num_windows * val_ratio)
    n_train = num_windows - n_val - n_test
    idx = np.arange(num_windows)
    return idx[:n_train], idx[n_train:n_train + n_val], idx[n_train + n_val:]


class TrafficWindows(Dataset):
    """Windows of a ``(T, N, C)`` series. Each item is a dict:

    ``x (P, N, C)`` scaled input (missing = 0), ``mask (P, N, C)`` bool input observations, ``time (P, 2)``,
    ``y (Q, N, C)`` original-scale target, ``y_mask (Q, N, C)`` bool target observations, ``mean``/``std (C,)``
    scaler statistics (so a task can invert predictions without the datamodule).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray, time: np.ndarray, starts: np.ndarray,
                 window: int, horizon: int, scaler: StandardScaler) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.mask, self.time = torch.from_numpy(mask), torch.from_numpy(time)
        self.starts, self.window, self.horizon = np.asarray(starts), window, horizon
        self.mean, self.std = torch.from_numpy(scaler.mean), torch.from_numpy(scaler.std + scaler.eps)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s = int(self.starts[i])
        p, q = slice(s, s + self.window), slice(s + self.window, s + self.window + self.horizon)
        return {"x": self.x[p], "mask": self.mask[p], "time": self.time[p], "y": self.y[q],
                "y_mask": self.mask[q], "mean": self.mean, "std": self.std}


def _default_root() -> Path:
    env = os.environ.get("HOFORMER_DATA")
    return (Path(env) if env else Path("../shared/data")) / "traffic"


class TrafficDataModule(SplitDataModule):
    """METR-LA / PEMS-BAY / Los-loop datamodule (usable from a LightningCLI ``data: class_path``).

    Args:
        dataset: ``"metr_la"``, ``"pems_bay"`` or ``"los_loop"``.
        root: directory with the files (default ``$HOFORMER_DATA/traffic``): ``metr-la.h5``, ``pems-bay.h5``,
            ``sensor_graph/adj_mx.pkl``, ``sensor_graph/adj_mx_bay.pkl``, ``los_loop/los_{speed,adj}.csv``.
        data_path, adj_path: override the file locations.
        window, horizon: ``P`` and ``Q`` (12 -> 12).
        val_ratio, test_ratio: chronological split of the windows (0.1, 0.2).
        drop_empty_windows: drop windows whose target is entirely missing (their loss is undefined).
        start: first timestamp of Los-loop (the CSV has none).
        num_nodes: if given, checked against the data and the graph.

    The three splits are built together (the scaler is fitted on the training windows) and kept in :attr:`splits`
    (``{"train" | "val" | "test": TrafficWindows}``, the base class's ``datasets``). ``dataset`` is the dataset's
    name here, not the base class's ``dataset(split)`` accessor.
    """

    def __init__(self, dataset: str = "los_loop", root: str | None = None, data_path: str | None = None,
                 adj_path: str | None = None, window: int = 12, horizon: int = 12, val_ratio: float = 0.1,
                 test_ratio: float = 0.2, batch_size: int = 32, eval_batch_size: int | None = None,
                 num_workers: int = 0, drop_empty_windows: bool = True, start: str = "2012-03-01 00:00:00",
                 num_nodes: int | None = None) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, eval_batch_size=eval_batch_size)
        if dataset not in ("metr_la", "pems_bay", "los_loop"):
            raise ValueError(f"TrafficDataModule: `dataset` must be 'metr_la', 'pems_bay' or 'los_loop', got {dataset!r}")
        self.dataset, self.root = dataset, Path(root) if root else _default_root()
        self.data_path, self.adj_path = data_path, adj_path
        self.window, self.horizon = window, horizon
        self.val_ratio, self.test_ratio = val_ratio, test_ratio
        self.drop_empty_windows, self.start, self.expected_nodes = drop_empty_windows, start, num_nodes

    @property
    def splits(self) -> dict[str, TrafficWindows]:
        """The built splits by name (the same dict as ``datasets``)."""
        return self.datasets

    def _load(self):
        import pandas as pd

        if self.dataset == "los_loop":
            root = Path(self.data_path).parent if self.data_path else self.root
            values, ids, adj = load_los_loop(root)
            stamps = pd.date_range(self.start, periods=len(values), freq="5min").to_numpy()
            return values, stamps, ids, adj
        h5 = {"metr_la": "metr-la.h5", "pems_bay": "pems-bay.h5"}[self.dataset]
        pkl = {"metr_la": "adj_mx.pkl", "pems_bay": "adj_mx_bay.pkl"}[self.dataset]
        values, stamps, ids = read_traffic_h5(self.data_path or self.root / h5)
        g_ids, _, adj = load_adj_pkl(self.adj_path or self.root / "sensor_graph" / pkl)
        if len(g_ids) != len(ids):
            raise ValueError(f"TrafficDataModule: data has {len(ids)} sensors but the graph has {len(g_ids)}")
        if g_ids != ids:
            if set(g_ids) != set(ids):
                raise ValueError("TrafficDataModule: sensor ids of the data and of the graph differ")
            values = values[:, [ids.index(i) for i in g_ids]]  # reorder to graph order
            ids = g_ids
        return values, stamps, ids, adj

    def _make_splits(self, names) -> dict[str, TrafficWindows]:
        """All three splits at once, whichever ``names`` were asked for."""
        values, stamps, ids, adj = self._load()
        n = values.shape[1]
        if adj.shape != (n, n):
            raise ValueError(f"TrafficDataModule: data has {n} nodes but the graph adjacency is {adj.shape}")
        if self.expected_nodes is not None and self.expected_nodes != n:
            raise ValueError(f"TrafficDataModule: `num_nodes`={self.expected_nodes} but {self.dataset} has {n} nodes")
        self.num_nodes, self.sensor_ids, self.adj = n, ids, adj
        data = values[..., None]  # (T, N, C=1)
        mask = data != 0
        starts = window_starts(len(data), self.window, self.horizon)
        tr, va, te = split_windows(len(starts), self.val_ratio, self.test_ratio)
        train_end = int(starts[tr[-1]]) + self.window + self.horizon
        self.scaler = StandardScaler().fit(data[:train_end], mask[:train_end])
        x = self.scaler.transform(data, mask)
        tf = time_features(stamps)
        out = {}
        for name, idx in (("train", tr), ("val", va), ("test", te)):
            s = starts[idx]
            if self.drop_empty_windows:
                has = np.array([mask[i + self.window:i + self.window + self.horizon].any() for i in s], dtype=bool)
                s = s[has]
            if len(s) == 0:
                raise ValueError(f"TrafficDataModule: the {name} split has no window with an observed target")
            out[name] = TrafficWindows(x, data, mask, tf, s, self.window, self.horizon, self.scaler)
        return out
