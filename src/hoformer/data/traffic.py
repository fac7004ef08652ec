"""Traffic speed forecasting data: METR-LA / PEMS-BAY (DCRNN ``.h5`` + ``adj_mx.pkl``) and Los-loop (T-GCN CSV).

Protocol (DCRNN / torch-spatiotemporal, Weaver section 6.1): zeros are missing values; windows of ``P`` history
and ``Q`` horizon steps with stride 1; chronological 70/10/20 split of the windows; a per-channel standard
scaler fitted on the *observed* values of the time steps covered by the training windows (eqs 62-63); missing
entries are 0 after scaling; every sample carries its observation masks and the scaler statistics, so metrics are
computed on the original scale (:func:`~hoformer.data.unscale`). Splitting, scaling, windows and the batch format
are those of every windowed series (:mod:`hoformer.data.series`; mode order ``(time, sensors, channels)``).

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
from hoformer._checks import check_int

from .series import Series, SeriesDataModule, SeriesWindows, check_series_frame, check_time_order, read_series_table
from ._utils import VERIFY_HINT, SchemaError, require_file, resolve_root, verify_file

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


_ZERO_HINT = "; missing readings must be stored as 0 in this format"


def _verify(path: Path, known: str, verify: bool) -> None:
    if verify:
        verify_file(path, sha256=TRAFFIC_SHA256[known], hint=f"Expected the reference {known}. {VERIFY_HINT}")


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
    """Read a DCRNN-format ``.h5`` -> ``(values (T, N) float32, timestamps (T,) datetime64, sensor_ids list[str])``,
    schema-checked as every series file (:func:`~hoformer.data.series.check_series_frame`: distinct numeric sensor
    columns, finite values; timestamps in time order)."""
    import pandas as pd

    path = require_file(path, "read_traffic_h5", hint="(METR-LA: metr-la.h5, PEMS-BAY: pems-bay.h5)")
    df = pd.read_hdf(path, key=key)
    if not isinstance(df, pd.DataFrame) or not isinstance(df.index, pd.DatetimeIndex):
        raise SchemaError(f"read_traffic_h5: {path} must hold a DataFrame with a DatetimeIndex, got "
                          f"{type(df).__name__} indexed by {type(getattr(df, 'index', None)).__name__}")
    values = check_series_frame(df, str(path), lambda i: f"row {i} ({df.index[i]})", dtype=np.float32,
                                complete_hint=_ZERO_HINT)
    stamps = df.index.to_numpy()
    check_time_order(stamps, str(path), lambda i: f"row {i}")
    return values, stamps, [str(c) for c in df.columns]


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
        require_file(p, "load_los_loop")
    _verify(speed, "los_speed.csv", verify)
    _verify(adj_file, "los_adj.csv", verify)
    _, values, ids = read_series_table(speed, header=True, dated=False)
    _, adj, _ = read_series_table(adj_file, header=False)
    return values.astype(np.float32), list(ids), adj.astype(np.float32)


class TrafficDataModule(SeriesDataModule):
    """METR-LA / PEMS-BAY / Los-loop datamodule (usable from a LightningCLI ``data: class_path``).

    Args:
        dataset: ``"metr_la"``, ``"pems_bay"`` or ``"los_loop"``.
        root: directory with the files (default ``$HOFORMER_DATA/traffic``, or ``../shared/data/traffic``; not read
            when ``data_path`` and ``adj_path`` are both given): ``metr-la.h5``, ``pems-bay.h5``,
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
        on_device: keep the scaled series on the trainer's device and gather the batches there (no workers; see
            :class:`~hoformer.data.series.SeriesDataModule`).

    A configuration of :class:`~hoformer.data.series.SeriesDataModule`: the files are read, the windows split and the
    scaler fitted on the observed values of the training windows' rows (``eps = 1e-8``) once, for every split; batches
    carry the observation masks and the daily time features (minute of day, day of week). The splits are kept in
    :attr:`splits` (``{"train" | "val" | "test": SeriesWindows}``, the base class's ``datasets``); after ``setup``:
    :attr:`scaler`, :attr:`sensor_ids` (the graph's order), :attr:`adj` and :meth:`data_signature`. ``dataset`` is
    the dataset's name here, not the base class's ``dataset(split)`` accessor.
    """

    def __init__(self, dataset: str = "los_loop", root: str | None = None, data_path: str | None = None,
                 adj_path: str | None = None, window: int = 12, horizon: int = 12, val_ratio: float = 0.1,
                 test_ratio: float = 0.2, batch_size: int = 32, eval_batch_size: int | None = None,
                 num_workers: int = 0, drop_empty_windows: bool = True, start: str = "2012-03-01 00:00:00",
                 num_nodes: int | None = None, verify: bool = True, split_protocol: str = "dcrnn",
                 on_device: bool = False) -> None:
        fn = type(self).__name__
        if dataset not in ("metr_la", "pems_bay", "los_loop"):
            raise ValueError(f"{fn}: `dataset` must be 'metr_la', 'pems_bay' or 'los_loop', got {dataset!r}")
        for name, v in (("window", window), ("horizon", horizon)):
            check_int(fn, name, v, note=" (time steps)")
        if split_protocol not in ("dcrnn", "tsl"):
            raise ValueError(f"{fn}: `split_protocol` must be 'dcrnn' or 'tsl', got {split_protocol!r}")
        super().__init__(window=window, horizon=horizon, protocol=split_protocol, val_ratio=val_ratio,
                         test_ratio=test_ratio, scaler_eps=1e-8, time_encoding="daily",
                         drop_empty_windows=drop_empty_windows, batch_size=batch_size, num_workers=num_workers,
                         eval_batch_size=eval_batch_size, on_device=on_device)
        if data_path is not None and adj_path is not None:  # both files named: the root is not read
            self.root = Path(root) if root else None
        else:
            self.root = resolve_root(root, "traffic", f"traffic dataset {dataset!r}")
        self.dataset = dataset
        self.data_path, self.adj_path = data_path, adj_path
        self.start, self.expected_nodes, self.verify = start, num_nodes, verify
        self.split_protocol = split_protocol
        self._num_nodes = self.sensor_ids = self.adj = None

    @property
    def num_nodes(self) -> int:
        """Sensors ``N`` (reads the data)."""
        if self._num_nodes is None:
            self.setup()
        return self._num_nodes

    @property
    def in_channels(self) -> int:
        """Channels ``C`` of the series (speed: 1)."""
        return 1

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
            return values, stamps, ids, adj, str(self.data_path or "los_speed.csv")
        h5 = self.data_path or self.root / {"metr_la": "metr-la.h5", "pems_bay": "pems-bay.h5"}[self.dataset]
        pkl = {"metr_la": "adj_mx.pkl", "pems_bay": "adj_mx_bay.pkl"}[self.dataset]
        values, stamps, ids = read_traffic_h5(h5)
        g_ids, _, adj = load_adj_pkl(self.adj_path or self.root / "sensor_graph" / pkl,
                                     sha256=TRAFFIC_SHA256[pkl] if self.verify else None)
        if len(g_ids) != len(ids):
            raise ValueError(f"TrafficDataModule: data has {len(ids)} sensors but the graph has {len(g_ids)}")
        if g_ids != ids:
            if set(g_ids) != set(ids):
                raise ValueError("TrafficDataModule: sensor ids of the data and of the graph differ")
            values = values[:, [ids.index(i) for i in g_ids]]  # reorder to graph order
            ids = g_ids
        return values, stamps, ids, adj, str(h5)

    def read_series(self) -> Series:
        """The speeds ``(T, N, 1)`` in graph order; zeros are missing (the mask)."""
        values, stamps, ids, adj, source = self._load()
        n = values.shape[1]
        if adj.shape != (n, n):
            raise ValueError(f"TrafficDataModule: data has {n} nodes but the graph adjacency is {adj.shape}")
        if self.expected_nodes is not None and self.expected_nodes != n:
            raise ValueError(f"TrafficDataModule: `num_nodes`={self.expected_nodes} but {self.dataset} has {n} nodes")
        self._num_nodes, self.sensor_ids, self.adj = n, ids, adj
        data = values[..., None]  # (T, N, C=1)
        return Series(data, tuple(ids), source, np.asarray(stamps), mask=data != 0)
