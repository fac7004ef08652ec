"""Long-term time-series forecasting (LTSF) datasets with the Time-Series-Library / iTransformer protocol.

Protocol (``thuml/Time-Series-Library`` ``data_provider/data_loader.py``, also used by iTransformer and the HOT
paper):

* ETTh1/ETTh2: 12/4/4 months of hourly rows -> train ``[0, 8640)``, val ``[8640, 11520)``, test ``[11520, 14400)``;
  ETTm1/ETTm2: the same months at 15 minutes (x4: 34560/11520/11520 rows).
* every other CSV (weather, electricity/ECL, traffic, exchange_rate, national_illness/ILI): 70/10/20 % of the rows
  in time order (``int(0.7 n)`` train, ``int(0.2 n)`` test, the rest validation); solar (TSLib's ``Dataset_Solar``):
  ``int(0.7 n)`` train, ``int(0.1 n)`` validation, the last ``int(0.2 n)`` rows test (a row between validation and
  test can go unused).
* validation and test slices start ``seq_len`` rows before their border, so the first validation target starts right
  after the last training row and *no* test time step goes unscored.
* a StandardScaler (mean / population std, std 0 -> 1) is fitted on the training rows only and applied everywhere.
* window ``s``: ``x = data[s : s+seq_len]``, ``y = data[s+seq_len : s+seq_len+pred_len]`` (and, with ``label_len``,
  ``y_known = data[s+seq_len-label_len : s+seq_len]``); ``len = rows_in_slice - seq_len - pred_len + 1`` (ETTh1 at
  96/96: 8449 / 2785 / 2785).

Splitting, scaling, windows and the batch format are those of every windowed series (:mod:`hoformer.data.series`).

Conventional horizons: lookback 96 with ``pred_len`` in {96, 192, 336, 720}; for ILI the literature uses lookback 36
with ``pred_len`` in {24, 36, 48, 60} (not forced here).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hoformer._checks import check_int, is_int
from hoformer._io import atomic_write

from .series import SeriesWindows, StandardScaler, chronological_split, ltsf_borders
from .series import time_features as time_features_of
from ._utils import (VERIFY_HINT, SchemaError, cache_dir, default_data_root, download_url, resolve_root,
                     verify_file)

__all__ = [
    "LTSFSpec",
    "LTSF_DATASETS",
    "LTSFDataset",
    "SyntheticLTSF",
    "default_ltsf_root",
    "read_series_table",
    "synthetic_multiway_series",
    "write_synthetic_ltsf_csv",
]

_ETT_URL = "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/{}.csv"
_BUNDLE_HINT = ("It is part of the Autoformer / Time-Series-Library dataset bundle "
                "(https://github.com/thuml/Time-Series-Library, 'Data preparation'); unpack it so that the file is at "
                "this path.")


@dataclass(frozen=True)
class LTSFSpec:
    """A known LTSF dataset: ``path`` relative to the LTSF root, split ``protocol`` ("etth" | "ettm" | "custom" |
    "solar"), time-feature ``freq``, ``sha256`` of the reference copy where known, canonical ``url`` where one
    exists, and the number of variates ``channels``."""
    path: str
    protocol: str
    freq: str
    channels: int
    sha256: str | None = None
    url: str | None = None


LTSF_DATASETS: dict[str, LTSFSpec] = {
    "ETTh1": LTSFSpec("ETT-small/ETTh1.csv", "etth", "h", 7,
                      "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066", _ETT_URL.format("ETTh1")),
    # ETTh2 / ETTm2: no checksum pinned. Only ETTh1 / ETTm1 of ETDataset are in the project's reference data
    # (shared/data/SHA256SUMS), so no reference copy of these two could be hashed and checked against the canonical
    # source; a guessed digest would reject every correct download. They are downloaded and read unverified (the
    # layout is still schema-checked by _read_table).
    "ETTh2": LTSFSpec("ETT-small/ETTh2.csv", "etth", "h", 7, None, _ETT_URL.format("ETTh2")),
    "ETTm1": LTSFSpec("ETT-small/ETTm1.csv", "ettm", "t", 7,
                      "6ce1759b1a18e3328421d5d75fadcb316c449fcd7cec32820c8dafda71986c9e", _ETT_URL.format("ETTm1")),
    "ETTm2": LTSFSpec("ETT-small/ETTm2.csv", "ettm", "t", 7, None, _ETT_URL.format("ETTm2")),
    "weather": LTSFSpec("weather/weather.csv", "custom", "t", 21,
                        "34ee981d07313e51da2a50bb600072c8ae4a69cb4b0651f4cb93a069d7a2ba63"),
    "electricity": LTSFSpec("electricity/electricity.csv", "custom", "h", 321),
    "traffic": LTSFSpec("traffic/traffic.csv", "custom", "h", 862),
    "exchange_rate": LTSFSpec("exchange_rate/exchange_rate.csv", "custom", "d", 8),
    "solar": LTSFSpec("Solar/solar_AL.txt", "solar", "t", 137),
    "national_illness": LTSFSpec("illness/national_illness.csv", "custom", "w", 7,
                                 "8594cecb98c6f2f9dc014eca11c4d5d1e38ad5ce6ed0592d4abe65b146fce395"),
}
_ALIASES = {"ecl": "electricity", "exchange": "exchange_rate", "ili": "national_illness",
            "illness": "national_illness", "solar_al": "solar", "solar-energy": "solar"}
_LOOKUP = {**{k.lower(): k for k in LTSF_DATASETS}, **_ALIASES}
_SPLITS = ("train", "val", "test")


def _decode_error(path: str, encoding: str) -> str | None:
    """``"line N (byte 0x.. at column k)"`` of the first line of ``path`` that does not decode as ``encoding``."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode(encoding)
            except UnicodeDecodeError as e:
                return f"line {n} (byte 0x{line[e.start]:02x} at column {e.start + 1})"
    return None


def read_series_table(path: str, header: bool = True, *, encoding: str = "utf-8"):
    """Parse and schema-check an LTSF-layout file -> ``(dates datetime64[ns] | None, values float64 (T, C),
    columns)``; arrays are read-only and cached per (path, mtime, size, encoding), so the three splits of one file
    parse it once.

    ``header=True``: ``date,<variate_1>,...`` with a header line; ``False``: bare comma-separated values (solar).
    The timestamps must not go back in time (a newest-first or shuffled export would be windowed out of order);
    repeated timestamps are allowed. A line that does not decode as ``encoding`` is an error naming it."""
    st = Path(path).stat()
    return _read_table(str(path), header, encoding, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_table(path: str, header: bool, encoding: str, _mtime_ns: int, _size: int):
    import pandas as pd

    try:
        if header:
            df = pd.read_csv(path, encoding=encoding, skipinitialspace=True)
        else:  # solar_AL.txt: comma-separated values, no header, no date column
            df = pd.read_csv(path, header=None, encoding=encoding)
    except UnicodeDecodeError as e:
        where = _decode_error(path, encoding) or f"byte offset {e.start}"
        raise SchemaError(f"{path}: {where} is not valid {encoding} text ({e.reason}); pass the file's encoding, "
                          "e.g. encoding='latin-1'") from e
    except LookupError as e:
        raise ValueError(f"{path}: unknown encoding {encoding!r} ({e})") from e
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise SchemaError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from e
    columns = [str(c).strip() for c in df.columns]
    dates = None
    first_row = 2 if header else 1  # file line number of the first data row
    if header:
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
            raise SchemaError(f"{path}: unparsable 'date' value {df.iloc[bad[0], 0]!r} at line {bad[0] + first_row}")
        dates = parsed.to_numpy(dtype="datetime64[ns]")
        back = np.flatnonzero(np.diff(dates.astype("int64")) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise SchemaError(f"{path}: timestamps go back in time at line {i + first_row} ({df.iloc[i - 1, 0]!s} "
                              f"then {df.iloc[i, 0]!s}; {back.size} such step(s)); the rows must be in time order, "
                              "oldest first: sort the file by its 'date' column")
        dates.setflags(write=False)  # cached: shared by every split of the file
        df, columns = df.iloc[:, 1:], columns[1:]
    if len(df) == 0:
        raise SchemaError(f"{path}: no data rows")
    for j, c in enumerate(df.columns):
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            col = pd.to_numeric(df[c], errors="coerce")
            bad = np.flatnonzero(col.isna().to_numpy() & df[c].notna().to_numpy())
            i = bad[0] if bad.size else 0
            raise SchemaError(f"{path}: column {columns[j]!r} must be numeric, got {df[c].iloc[i]!r} at line "
                              f"{i + first_row}")
    values = df.to_numpy(dtype=np.float64)
    nan = np.argwhere(~np.isfinite(values))
    if nan.size:
        i, j = nan[0]
        raise SchemaError(f"{path}: missing or non-finite value in column {columns[j]!r} at line {i + first_row} "
                          f"({len(nan)} such cells); LTSF files must be complete")
    values.setflags(write=False)
    return dates, values, tuple(columns)


def _resolve(root, name: str, download: bool = False) -> tuple[str, LTSFSpec, Path]:
    key = _LOOKUP.get(str(name).lower())
    if key is not None:
        spec = LTSF_DATASETS[key]
        if root is None:
            root = default_ltsf_root(key, download)
        return key, spec, Path(root).expanduser() / spec.path
    path = Path(name) if root is None else Path(root) / name
    if path.suffix.lower() in (".csv", ".txt") or path.is_file():  # any other CSV in the LTSF layout: 70/10/20
        return path.stem, LTSFSpec(str(name), "custom", "h", -1), path
    raise ValueError(f"name must be one of {sorted(LTSF_DATASETS)} (case-insensitive; aliases {sorted(_ALIASES)}) "
                     f"or a CSV path relative to root, got {name!r}")


def default_ltsf_root(name: str, download: bool = False) -> Path:
    """Root of a known LTSF dataset when none is given: ``$HOFORMER_DATA/ltsf`` (or ``../shared/data/ltsf``); with
    ``download=True`` that root only if it already holds the file, else the writable cache
    ``~/.cache/hoformer/ltsf`` (``$HOFORMER_CACHE/ltsf``), so a fresh machine can download."""
    if not download:
        return resolve_root(None, "ltsf", f"LTSF dataset {name!r}")
    base = default_data_root()
    key = _LOOKUP.get(str(name).lower())
    if base is not None and key is not None and (base / "ltsf" / LTSF_DATASETS[key].path).is_file():
        return base / "ltsf"
    return cache_dir("ltsf")


class LTSFDataset(SeriesWindows):
    """Sliding windows over one LTSF file, split and scaled with the TSLib / iTransformer protocol, in the
    windowed-series batch format of :mod:`hoformer.data.series`.

    Args:
        root: directory laid out like ``shared/data/ltsf`` (``ETT-small/ETTh1.csv``, ``weather/weather.csv``,
            ``illness/national_illness.csv``, ``electricity/electricity.csv``, ``traffic/traffic.csv``,
            ``exchange_rate/exchange_rate.csv``, ``Solar/solar_AL.txt``); ``None`` = ``$HOFORMER_DATA/ltsf``, or with
            ``download=True`` (file not there) the cache ``~/.cache/hoformer/ltsf`` (``$HOFORMER_CACHE``); a
            missing ``root`` is created by a download.
        name: a known dataset (case-insensitive: ETTh1, ETTh2, ETTm1, ETTm2, weather, electricity/ECL, traffic,
            exchange_rate, solar, national_illness/ILI) or a CSV path relative to ``root`` (70/10/20 protocol).
        split: "train" | "val" | "test".
        seq_len, pred_len: lookback and horizon; ``label_len`` known steps before the horizon, returned as
            ``y_known`` (TSLib's decoder start tokens; 0 by default).
        scale: standardise with the train-slice statistics.
        features: "M" all variates in and out; "S" the ``target`` variate only; "MS" all in, ``target`` out
            (``y`` is then ``(pred_len, 1)``).
        target: target column for S/MS (moved to the last column, as in TSLib); default "OT".
        time_features: also return the calendar features (:func:`~hoformer.data.series.time_features`) of the input
            and target steps as ``time`` / ``y_time``.
        freq: calendar-feature frequency (default: the dataset's own, e.g. "h" for ETTh, "t" for ETTm/weather, as in
            Informer; TSLib's run scripts leave ``--freq h`` for every dataset: pass ``freq="h"`` to get their 4
            features). The hoformer models do not read the marks.
        verify: check the file's SHA-256 when the reference copy's is known (``False`` for other copies).
        encoding: text encoding of the file (default UTF-8; a line that does not decode is an error naming it).
        download: fetch a missing file from its canonical URL (ETT only; others come in the TSLib bundle); the
            download is atomic and checked against the pinned SHA-256 where one is known (ETTh1, ETTm1).

    Items: dicts ``x (seq_len, C)``, ``y (pred_len, C or 1)``, ``mean`` / ``std (C or 1,)`` (the train-slice
    statistics; 0 / 1 with ``scale=False``), with ``time`` / ``y_time`` and ``y_known`` when asked for.
    """

    def __init__(self, root, name: str, split: str = "train", seq_len: int = 96, pred_len: int = 96,
                 scale: bool = True, features: str = "M", *, label_len: int = 0, target: str = "OT",
                 time_features: bool = False, freq: str | None = None, verify: bool = True, download: bool = False,
                 encoding: str = "utf-8"):
        self.name, spec, path = _resolve(root, name, download)
        if path.is_dir():
            raise FileNotFoundError(f"LTSF file for {self.name!r}: {path} is a directory, expected a CSV file")
        if not path.is_file():
            if download and spec.url:
                download_url(spec.url, path, sha256=spec.sha256 if verify else None)
            else:
                hint = (f"Pass download=True to fetch it from {spec.url}." if spec.url else
                        _BUNDLE_HINT if spec.channels > 0 else "")
                raise FileNotFoundError(f"LTSF file for {self.name!r} not found: {path}. {hint}".strip())
        if verify and spec.sha256:
            verify_file(path, sha256=spec.sha256, hint=VERIFY_HINT)
        self.path, self.encoding = path, encoding
        dates, values, columns = read_series_table(path, spec.protocol != "solar", encoding=encoding)
        self._build(values, dates, columns, spec.protocol, split, seq_len, pred_len, scale, features, label_len,
                    target, time_features, freq or spec.freq)

    # ------------------------------------------------------------------ shared by SyntheticLTSF
    def _build(self, values, dates, columns, protocol, split, seq_len, pred_len, scale, features, label_len, target,
               time_features, freq):
        for arg, v in (("seq_len", seq_len), ("pred_len", pred_len)):
            check_int(type(self).__name__, arg, v)
        if not is_int(label_len) or not 0 <= label_len <= seq_len:
            raise ValueError(f"label_len must be an int in [0, seq_len={seq_len}], got {label_len!r}")
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
        if features not in ("M", "S", "MS"):
            raise ValueError(f"features must be 'M', 'S' or 'MS', got {features!r}")
        columns = list(columns)
        if target in columns:  # TSLib order: date, other variates..., target
            order = [i for i, c in enumerate(columns) if c != target] + [columns.index(target)]
            values, columns = values[:, order], [columns[i] for i in order]
        elif features != "M" and protocol != "solar":
            raise ValueError(f"target {target!r} is not a column of {self.name!r} (columns: {columns})")
        if features == "S":
            values, columns = values[:, -1:], columns[-1:]
        try:
            starts, train_rows = chronological_split(protocol, len(values), seq_len, pred_len)
        except ValueError as e:  # SchemaError (too few rows for the protocol) stays one
            raise type(e)(f"{self.name!r}: {e}") from e
        b1s, b2s = ltsf_borders(protocol, len(values), seq_len)
        i = _SPLITS.index(split)
        b1, b2 = b1s[i], b2s[i]
        self.scaler = StandardScaler().fit(values[:train_rows])
        self.mean, self.std = self.scaler.mean, self.scaler.std
        data = self.scaler.transform(values[b1:b2]) if scale else values[b1:b2]

        self.split, self.seq_len, self.pred_len = split, seq_len, pred_len
        self.scale, self.features, self.target, self.freq, self.protocol = scale, features, target, freq, protocol
        self.columns, self.borders, self.n_rows = columns, (b1, b2), len(values)
        self.file_values, self.file_dates = values, dates  # the whole file (read-only): forecasts read its end
        self.dates = None if dates is None else dates[b1:b2]
        marks = None
        if time_features:
            marks = (time_features_of(self.dates, freq) if self.dates is not None
                     else np.zeros((b2 - b1, 1), np.float32))  # solar: no timestamps (as in iTransformer)
        c = len(columns)
        mean, std = (self.mean, self.std) if scale else (np.zeros(c), np.ones(c))
        super().__init__(torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)), starts[split] - b1, seq_len,
                         pred_len, mean, std, time=None if marks is None else torch.from_numpy(marks),
                         label_len=label_len, target_last=features == "MS")

    @property
    def marks(self) -> torch.Tensor | None:
        """Calendar features of the split's rows (``time_features=True``), else ``None``."""
        return self.time

    @property
    def num_variates(self) -> int:
        """Number of input variates ``C`` of ``x``."""
        return self.data.shape[-1]

    def _stats(self, c: int):
        if c == len(self.mean):
            return self.mean, self.std
        if c == 1 and self.features in ("S", "MS"):
            return self.mean[-1:], self.std[-1:]
        raise ValueError(f"expected a last dimension of {len(self.mean)} (all variates)"
                         f"{' or 1 (target)' if self.features != 'M' else ''}, got {c}")

    def transform(self, data):
        """Standardise raw values (numpy or torch, last dim = variates, or 1 for the target under S/MS) with the
        train-slice statistics."""
        if not self.scale:
            return data
        mean, std = self._stats(data.shape[-1])
        if isinstance(data, torch.Tensor):
            return (data - torch.as_tensor(mean, dtype=data.dtype, device=data.device)) / torch.as_tensor(
                std, dtype=data.dtype, device=data.device)
        return (data - mean) / std

    def inverse_transform(self, data):
        """Map standardised values (numpy or torch, last dim = variates, or 1 for the target under S/MS) back to
        the original scale."""
        if not self.scale:
            return data
        mean, std = self._stats(data.shape[-1])
        if isinstance(data, torch.Tensor):
            return data * torch.as_tensor(std, dtype=data.dtype, device=data.device) + torch.as_tensor(
                mean, dtype=data.dtype, device=data.device)
        return data * std + mean

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, seq_len={self.seq_len}, "
                f"pred_len={self.pred_len}, features={self.features!r}, variates={self.num_variates}, "
                f"rows={self.borders}, windows={len(self)})")


def synthetic_multiway_series(length: int = 4000, num_variates: int = 7, *, seed: int = 0, period: int = 24,
                              noise: float = 0.1) -> np.ndarray:
    """Deterministic multivariate series ``(length, num_variates)`` float64 with multiway structure.

    Each variate mixes a daily (``period``) and a weekly (``7 * period``) seasonality with its own amplitude and phase,
    two shared AR(1) latent factors with variate-specific loadings, and a lagged cross-variate coupling
    (variate ``c`` follows variate ``c - 1`` with a lag of ``period // 4`` steps), plus white noise. A model has to
    use both the time mode and the variate mode to forecast it well.
    """
    if length < 2 or num_variates < 1:
        raise ValueError(f"length must be >= 2 and num_variates >= 1, got {length}, {num_variates}")
    rng = np.random.default_rng(seed)
    t = np.arange(length, dtype=np.float64)[:, None]
    amp_d, amp_w = rng.uniform(0.5, 2.0, num_variates), rng.uniform(0.2, 1.0, num_variates)
    ph_d, ph_w = rng.uniform(0, 2 * np.pi, num_variates), rng.uniform(0, 2 * np.pi, num_variates)
    season = amp_d * np.sin(2 * np.pi * t / period + ph_d) + amp_w * np.sin(2 * np.pi * t / (7 * period) + ph_w)
    eps = rng.normal(scale=0.3, size=(length, 2))
    f = np.zeros((length, 2))
    for i in range(1, length):
        f[i] = np.array([0.97, 0.9]) * f[i - 1] + eps[i]
    base = season + f @ rng.normal(size=(2, num_variates))
    lag = max(1, period // 4)
    coupled = base.copy()
    coupled[lag:, 1:] += 0.6 * base[:-lag, :-1]
    return coupled + noise * rng.normal(size=coupled.shape) + rng.uniform(5, 20, num_variates)


class SyntheticLTSF(LTSFDataset):
    """Built-in synthetic multiway forecasting dataset with the same item contract and split/scaling protocol as
    :class:`LTSFDataset` (70/10/20, val/test start ``seq_len`` early, scaler fitted on train); hourly timestamps from
    2020-01-01. Columns ``v0 .. v{C-2}, OT``; ``features`` / ``target`` as in :class:`LTSFDataset`. Deterministic
    given ``seed``; see :func:`synthetic_multiway_series`."""

    def __init__(self, split: str = "train", seq_len: int = 96, pred_len: int = 96, num_variates: int = 7,
                 length: int = 4000, seed: int = 0, scale: bool = True, *, label_len: int = 0,
                 time_features: bool = False, period: int = 24, noise: float = 0.1, features: str = "M",
                 target: str = "OT"):
        self.name, self.path, self.encoding = "synthetic", None, "utf-8"
        values = synthetic_multiway_series(length, num_variates, seed=seed, period=period, noise=noise)
        dates = np.datetime64("2020-01-01T00:00", "ns") + np.arange(length) * np.timedelta64(1, "h")
        dates.setflags(write=False)
        columns = [f"v{i}" for i in range(num_variates - 1)] + ["OT"]
        self._build(values, dates, columns, "custom", split, seq_len, pred_len, scale, features, label_len, target,
                    time_features, "h")


_SYNTH_FORMATS = {  # dataset family -> (columns, pandas freq (ETT: from its protocol), first timestamp)
    "ETT": (["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"], None, "2016-07-01 00:00:00"),
    "weather": (["p (mbar)", "T (degC)", "Tpot (K)", "Tdew (degC)", "rh (%)", "VPmax (mbar)", "VPact (mbar)",
                 "VPdef (mbar)", "sh (g/kg)", "H2OC (mmol/mol)", "rho (g/m**3)", "wv (m/s)", "max. wv (m/s)",
                 "wd (deg)", "rain (mm)", "raining (s)", "SWDR (W/m\u00b2)", "PAR (\u00b5mol/m\u00b2/s)",
                 "max. PAR (\u00b5mol/m\u00b2/s)", "Tlog (degC)", "OT"], "10min", "2020-01-01 00:10:00"),
    "national_illness": (["% WEIGHTED ILI", "%UNWEIGHTED ILI", "AGE 0-4", "AGE 5-24", "ILITOTAL",
                          "NUM. OF PROVIDERS", "OT"], "7D", "2002-01-01 00:00:00"),
}


def write_synthetic_ltsf_csv(path, name: str = "ETTh1", n_rows: int | None = None, *, num_variates: int | None = None,
                             seed: int = 0) -> Path:
    """Write a synthetic file in the exact on-disk format of a known LTSF dataset (for tests and demos).

    ETT*: ``date,HUFL,...,OT`` hourly / 15-minute from 2016-07-01 (default 14,400 / 57,600 rows = the protocol
    minimum); weather: 21 variates, 10-minute, CRLF line endings and non-ASCII unit symbols in the header;
    national_illness: weekly; solar: no header and no date column; others: ``date,0,1,...,OT`` hourly.
    The file is written atomically. Returns the path.
    """
    import pandas as pd

    key = _LOOKUP.get(name.lower())
    if key is None:
        raise ValueError(f"name must be one of {sorted(LTSF_DATASETS)}, got {name!r}")
    check_int("write_synthetic_ltsf_csv", "num_variates", num_variates, optional=True)
    spec = LTSF_DATASETS[key]
    if key.startswith("ETT"):
        cols, start = _SYNTH_FORMATS["ETT"][0], _SYNTH_FORMATS["ETT"][2]
        freq = "15min" if spec.protocol == "ettm" else "h"
        n_rows = n_rows or 20 * 30 * 24 * (4 if spec.protocol == "ettm" else 1)
    elif key in _SYNTH_FORMATS:
        cols, freq, start = _SYNTH_FORMATS[key]
    else:
        c = spec.channels if num_variates is None else num_variates
        cols, freq, start = [str(i) for i in range(c - 1)] + ["OT"], "h", "2016-07-01 00:00:00"
    if num_variates is not None and num_variates != len(cols):
        raise ValueError(f"write_synthetic_ltsf_csv: {key} has {len(cols)} variates, got num_variates={num_variates}")
    n_rows = n_rows or 2000
    values = synthetic_multiway_series(n_rows, len(cols), seed=seed)
    path = Path(path)
    if key == "solar":
        atomic_write(path, lambda tmp: np.savetxt(tmp, values, delimiter=",", fmt="%.6g"))
    else:
        df = pd.DataFrame(values, columns=cols)
        df.insert(0, "date", pd.date_range(start, periods=n_rows, freq=freq).strftime("%Y-%m-%d %H:%M:%S"))
        atomic_write(path, lambda tmp: df.to_csv(tmp, index=False, encoding="utf-8",
                                                 lineterminator="\r\n" if key == "weather" else "\n"))
    return path
