"""Traffic speed forecasting data: METR-LA / PEMS-BAY (DCRNN ``.h5`` + ``adj_mx.pkl``) and Los-loop (T-GCN CSV).

Protocol (DCRNN / torch-spatiotemporal, Weaver section 6.1): zeros are missing values; windows of ``P`` history
and ``Q`` horizon steps with stride 1; chronological 70/10/20 split of the windows; a per-channel standard
scaler fitted on the *observed* values of the time steps covered by the training windows (eqs 62-63); missing
entries are 0 after scaling; every sample carries its observation masks and the scaler statistics, so metrics are
computed on the original scale (``y * std + mean``). Splitting, scaling, windows and the batch format are those of
every windowed series (:mod:`hoformer.data.series`; mode order ``(time, sensors, channels)``).

File formats
------------
* ``metr-la.h5`` / ``pems-bay.h5``: a pandas HDF store with one DataFrame (key ``df``), a 5-minute
  ``DatetimeIndex`` and one column per sensor id; ``0`` = missing.
* ``adj_mx.pkl``: pickle ``(sensor_ids, sensor_id_to_ind, adj (N, N) float32)`` (``encoding="latin1"``).
* Los-loop: ``los_speed.csv`` (header = 207 METR-LA sensor ids, 2016 rows, no timestamps: 5-minute steps from
  ``start``, default 2012-03-01 00:00) and ``los_adj.csv`` (no header, ``N x N``).

Integrity: the reference copies of ``los_speed.csv``, ``los_adj.csv`` (lehaifeng/T-GCN) and ``adj_mx.pkl``,
``adj_mx_bay.pkl`` (liyaguang/DCRNN) have known SHA-256 digests (:data:`TRAFFIC_SHA256`), checked before a file is
parsed (``verify=False`` for another copy). A pickle is checked *before* it is unpickled, and is unpickled with an
allow-list of numpy array types only, so even an unverified ``.pkl`` cannot run code. ``metr-la.h5`` /
``pems-bay.h5`` have no pinned digest (no reference copy was available to hash); they are schema-checked only.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from hoformer._checks import check_int

from ._base import SplitDataModule
from .series import SeriesWindows, StandardScaler, chronological_split, time_features
from ._utils import VERIFY_HINT, SchemaError, verify_file

__all__ = [
    "TRAFFIC_SHA256",
    "read_traffic_h5",
    "load_adj_pkl",
    "load_los_loop",
    "TrafficDataModule",
]


# SHA-256 of the reference copies (shared/data/SHA256SUMS; unmodified files of lehaifeng/T-GCN and liyaguang/DCRNN)
TRAFFIC_SHA256: dict[str, str] = {
    "los_speed.csv": "7b732d86ae32b2930595becba28aff39dacbfb2197e250fc0332e1744ce2cbf4",
    "los_adj.csv": "7a6eb41e10677992b5af50f5ab187c6c05c5c3a92cb973950cfddbf857361e76",
    "adj_mx.pkl": "a35687c6e15aa228dc45027b0ed2a0ea0f4ec78f573deb992c595092d12f61b3",
    "adj_mx_bay.pkl": "116275f5704d0d492018e14c047f7ae5004385b450aa907f88424055a4a97370",
}


def _verify(path: Path, known: str, verify: bool) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    if verify:
        verify_file(path, sha256=TRAFFIC_SHA256[known], hint=f"Expected the reference {known}. {VERIFY_HINT}")


def _check_values(values: np.ndarray, source: str) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2 or values.size == 0:
        raise SchemaError(f"{source}: expected a non-empty (time, nodes) table, got shape {values.shape}")
    bad = ~np.isfinite(values)
    if bad.any():
        t, n = np.argwhere(bad)[0]
        raise SchemaError(f"{source}: {int(bad.sum())} NaN/inf values (first at row {t}, column {n}); "
                          "missing readings must be stored as 0 in this format")
    return values


def _require_numeric(df, source: str, where) -> None:
    """SchemaError naming the first non-numeric cell (``where(i)`` -> its position) instead of numpy's bare
    'could not convert string to float'."""
    import pandas as pd

    for j, c in enumerate(df.columns):
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            col = pd.to_numeric(df[c], errors="coerce")
            bad = np.flatnonzero(col.isna().to_numpy() & df[c].notna().to_numpy())
            i = int(bad[0]) if bad.size else 0
            raise SchemaError(f"{source}: column {c!r} (#{j + 1}) must be numeric, got {df[c].iloc[i]!r} at "
                              f"{where(i)}")


def _read_numeric_csv(path: Path, header: bool):
    import pandas as pd

    try:
        df = pd.read_csv(path, header=0 if header else None)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise SchemaError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from e
    first = 2 if header else 1
    _require_numeric(df, str(path), lambda i: f"line {i + first}")
    return df


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the globals a numpy-array pickle needs (DCRNN's ``adj_mx.pkl``: lists, dicts,
    strings and an ndarray), so a tampered pickle cannot import and call arbitrary code."""

    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                *((f"numpy.{core}.multiarray", f) for core in ("core", "_core") for f in ("_reconstruct", "scalar")),
                *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core"))}

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in an adjacency pickle")
        return super().find_class(module, name)


def read_traffic_h5(path: str | os.PathLike, key: str | None = None):
    """Read a DCRNN-format ``.h5`` -> ``(values (T, N) float32, timestamps (T,) datetime64, sensor_ids list[str])``."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_traffic_h5: {path} not found (METR-LA: metr-la.h5, PEMS-BAY: pems-bay.h5)")
    df = pd.read_hdf(path, key=key)
    if not isinstance(df, pd.DataFrame) or not isinstance(df.index, pd.DatetimeIndex):
        raise SchemaError(f"read_traffic_h5: {path} must hold a DataFrame with a DatetimeIndex, got "
                          f"{type(df).__name__} indexed by {type(getattr(df, 'index', None)).__name__}")
    _require_numeric(df, str(path), lambda i: f"row {i} ({df.index[i]})")
    values = _check_values(df.to_numpy(), str(path))
    return values, df.index.to_numpy(), [str(c) for c in df.columns]


def load_adj_pkl(path: str | os.PathLike, sha256: str | None = None):
    """Read a DCRNN ``adj_mx.pkl`` -> ``(sensor_ids list[str], sensor_id_to_ind dict, adj (N, N) float32)``.

    ``sha256``: expected digest, checked *before* unpickling (:data:`TRAFFIC_SHA256` has the reference ones). The
    pickle is loaded with an allow-list of numpy array types, never arbitrary globals."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_adj_pkl: {path} not found")
    if sha256 is not None:
        verify_file(path, sha256=sha256, hint=VERIFY_HINT)
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as e:
        raise SchemaError(f"load_adj_pkl: {path} is not a readable adjacency pickle ({type(e).__name__}: {e})") from e
    if not (isinstance(obj, (tuple, list)) and len(obj) == 3):
        raise SchemaError(f"load_adj_pkl: {path} must hold (sensor_ids, sensor_id_to_ind, adj), got "
                          f"{type(obj).__name__}")
    ids, id2ind, adj = obj
    try:
        adj = np.asarray(adj, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"load_adj_pkl: the adjacency in {path} is not numeric ({e})") from e
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1] or adj.shape[0] != len(ids):
        raise SchemaError(f"load_adj_pkl: adjacency {adj.shape} does not match {len(ids)} sensor ids in {path}")
    return [str(i) for i in ids], {str(k): int(v) for k, v in id2ind.items()}, adj


def load_los_loop(root: str | os.PathLike | None = None, *, speed_path: str | os.PathLike | None = None,
                  adj_path: str | os.PathLike | None = None, verify: bool = True):
    """Los-loop -> ``(values (2016, 207) float32, sensor_ids, adj (207, 207) float32)``.

    The files are ``speed_path`` / ``adj_path`` when given, else ``los_speed.csv`` / ``los_adj.csv`` in
    ``root/los_loop`` (or ``root`` itself). ``verify`` checks each against the reference SHA-256 before parsing."""
    if root is None and (speed_path is None or adj_path is None):
        raise ValueError("load_los_loop: pass root=... or both speed_path and adj_path")
    d = None
    if root is not None:
        d = Path(root) / "los_loop" if (Path(root) / "los_loop").is_dir() else Path(root)
    speed = Path(speed_path) if speed_path is not None else d / "los_speed.csv"
    adj_file = Path(adj_path) if adj_path is not None else d / "los_adj.csv"
    for p in (speed, adj_file):
        if not p.is_file():
            raise FileNotFoundError(f"load_los_loop: {p} not found")
    _verify(speed, "los_speed.csv", verify)
    _verify(adj_file, "los_adj.csv", verify)
    df = _read_numeric_csv(speed, header=True)
    values = _check_values(df.to_numpy(), str(speed))
    adj = _check_values(_read_numeric_csv(adj_file, header=False).to_numpy(), str(adj_file))
    return values, [str(c) for c in df.columns], adj


def _check_steps(fn: str, **steps) -> None:
    for name, v in steps.items():
        check_int(fn, name, v, note=" (time steps)")


def _default_root() -> Path:
    env = os.environ.get("HOFORMER_DATA")
    return (Path(env) if env else Path("../shared/data")) / "traffic"


class TrafficDataModule(SplitDataModule):
    """METR-LA / PEMS-BAY / Los-loop datamodule (usable from a LightningCLI ``data: class_path``).

    Args:
        dataset: ``"metr_la"``, ``"pems_bay"`` or ``"los_loop"``.
        root: directory with the files (default ``$HOFORMER_DATA/traffic``): ``metr-la.h5``, ``pems-bay.h5``,
            ``sensor_graph/adj_mx.pkl``, ``sensor_graph/adj_mx_bay.pkl``, ``los_loop/los_{speed,adj}.csv``.
        data_path, adj_path: override the file locations (each independently; the other file is still looked up
            under ``root``): the ``.h5`` / ``los_speed.csv`` and the ``.pkl`` / ``los_adj.csv``.
        window, horizon: ``P`` and ``Q`` (12 -> 12).
        val_ratio, test_ratio: chronological split of the windows (0.1, 0.2).
        split_protocol: ``"dcrnn"`` (contiguous, DCRNN's counts) or ``"tsl"`` (torch-spatiotemporal's
            ``TemporalSplitter`` as in the Weaver paper: ``window`` windows dropped before the validation and the
            test block); see :func:`split_windows`.
        drop_empty_windows: drop windows whose target is entirely missing (they carry no loss or metric signal:
            the masked metrics are the same either way). ``False`` keeps DCRNN's / TSL's window counts (e.g. the
            6,850 METR-LA test windows when the data has long all-sensor outages).
        start: first timestamp of Los-loop (the CSV has none).
        num_nodes: if given, checked against the data and the graph.
        verify: check ``los_speed.csv``, ``los_adj.csv``, ``adj_mx.pkl`` / ``adj_mx_bay.pkl`` against the
            reference SHA-256 (:data:`TRAFFIC_SHA256`) before reading them; ``False`` for another copy or graph.

    The three splits are built together (the scaler is fitted on the training windows) and kept in :attr:`splits`
    (``{"train" | "val" | "test": SeriesWindows}``, the base class's ``datasets``). ``dataset`` is the dataset's
    name here, not the base class's ``dataset(split)`` accessor.
    """

    def __init__(self, dataset: str = "los_loop", root: str | None = None, data_path: str | None = None,
                 adj_path: str | None = None, window: int = 12, horizon: int = 12, val_ratio: float = 0.1,
                 test_ratio: float = 0.2, batch_size: int = 32, eval_batch_size: int | None = None,
                 num_workers: int = 0, drop_empty_windows: bool = True, start: str = "2012-03-01 00:00:00",
                 num_nodes: int | None = None, verify: bool = True, split_protocol: str = "dcrnn") -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, eval_batch_size=eval_batch_size)
        if dataset not in ("metr_la", "pems_bay", "los_loop"):
            raise ValueError(f"TrafficDataModule: `dataset` must be 'metr_la', 'pems_bay' or 'los_loop', got {dataset!r}")
        self.dataset, self.root = dataset, Path(root) if root else _default_root()
        self.data_path, self.adj_path = data_path, adj_path
        _check_steps(window=window, horizon=horizon, fn="TrafficDataModule")
        self.window, self.horizon = window, horizon
        self.val_ratio, self.test_ratio = val_ratio, test_ratio
        self.drop_empty_windows, self.start, self.expected_nodes = drop_empty_windows, start, num_nodes
        self.verify = verify
        if split_protocol not in ("dcrnn", "tsl"):
            raise ValueError(f"TrafficDataModule: `split_protocol` must be 'dcrnn' or 'tsl', got {split_protocol!r}")
        self.split_protocol = split_protocol

    @property
    def splits(self) -> dict[str, SeriesWindows]:
        """The built splits by name (the same dict as ``datasets``)."""
        return self.datasets

    def _load(self):
        import pandas as pd

        if self.dataset == "los_loop":
            values, ids, adj = load_los_loop(self.root, speed_path=self.data_path, adj_path=self.adj_path,
                                             verify=self.verify)
            stamps = pd.date_range(self.start, periods=len(values), freq="5min").to_numpy()
            return values, stamps, ids, adj
        h5 = {"metr_la": "metr-la.h5", "pems_bay": "pems-bay.h5"}[self.dataset]
        pkl = {"metr_la": "adj_mx.pkl", "pems_bay": "adj_mx_bay.pkl"}[self.dataset]
        values, stamps, ids = read_traffic_h5(self.data_path or self.root / h5)
        g_ids, _, adj = load_adj_pkl(self.adj_path or self.root / "sensor_graph" / pkl,
                                     sha256=TRAFFIC_SHA256[pkl] if self.verify else None)
        if len(g_ids) != len(ids):
            raise ValueError(f"TrafficDataModule: data has {len(ids)} sensors but the graph has {len(g_ids)}")
        if g_ids != ids:
            if set(g_ids) != set(ids):
                raise ValueError("TrafficDataModule: sensor ids of the data and of the graph differ")
            values = values[:, [ids.index(i) for i in g_ids]]  # reorder to graph order
            ids = g_ids
        return values, stamps, ids, adj

    def _make_splits(self, names) -> dict[str, SeriesWindows]:
        """All three splits at once, whichever ``names`` were asked for."""
        values, stamps, ids, adj = self._load()
        n = values.shape[1]
        if adj.shape != (n, n):
            raise ValueError(f"TrafficDataModule: data has {n} nodes but the graph adjacency is {adj.shape}")
        if self.expected_nodes is not None and self.expected_nodes != n:
            raise ValueError(f"TrafficDataModule: `num_nodes`={self.expected_nodes} but {self.dataset} has {n} nodes")
        back = np.flatnonzero(np.diff(np.asarray(stamps).astype("datetime64[ns]").astype("int64")) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise SchemaError(f"TrafficDataModule: the {self.dataset} timestamps go back in time at row {i} "
                              f"({stamps[i - 1]} then {stamps[i]}); the rows must be in time order, oldest first")
        self.num_nodes, self.sensor_ids, self.adj = n, ids, adj
        data = values[..., None]  # (T, N, C=1)
        mask = data != 0
        starts, train_rows = chronological_split(self.split_protocol, len(data), self.window, self.horizon,
                                                 val_ratio=self.val_ratio, test_ratio=self.test_ratio)
        self.scaler = StandardScaler(eps=1e-8).fit(data[:train_rows], mask[:train_rows])
        x = torch.from_numpy(self.scaler.transform(data, mask).astype(np.float32))
        tf = torch.from_numpy(time_features(stamps, encoding="daily"))
        mask_t = torch.from_numpy(mask)
        out = {}
        for name in ("train", "val", "test"):
            s = starts[name]
            if self.drop_empty_windows:
                has = np.array([mask[i + self.window:i + self.window + self.horizon].any() for i in s], dtype=bool)
                s = s[has]
            if len(s) == 0:
                raise ValueError(f"TrafficDataModule: the {name} split has no window with an observed target")
            out[name] = SeriesWindows(x, s, self.window, self.horizon, self.scaler.mean, self.scaler.scale,
                                      mask=mask_t, time=tf)
        return out
