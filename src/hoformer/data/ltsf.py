"""Long-term time-series forecasting (LTSF) data with the Time-Series-Library / iTransformer protocol.

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

Reading, splitting, scaling, windows and the batch format are those of every windowed series
(:class:`~hoformer.data.series.SeriesDataModule`); :class:`LTSFDataModule` is its LTSF configuration.

Conventional horizons: lookback 96 with ``pred_len`` in {96, 192, 336, 720}; for ILI the literature uses lookback 36
with ``pred_len`` in {24, 36, 48, 60} (not forced here).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hoformer._checks import check_int, is_int
from hoformer._io import atomic_write

from .series import Series, SeriesDataModule, read_series_table
from ._utils import VERIFY_HINT, cache_dir, default_data_root, download_url, require_file, resolve_root, verify_file

__all__ = [
    "LTSFSpec",
    "LTSF_DATASETS",
    "LTSFDataModule",
    "ltsf_key",
    "default_ltsf_root",
    "synthetic_multiway_series",
    "write_synthetic_ltsf_csv",
]

_ETT_URL = "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/{}.csv"
_BUNDLE_HINT = ("It is part of the Autoformer / Time-Series-Library dataset bundle "
                "(https://github.com/thuml/Time-Series-Library, 'Data preparation'); unpack it so that the file is at "
                "this path.")


def _nearby_csv(path: Path) -> str:
    """What the folder of a missing CSV holds: the closest file names, or its CSV files, or that it does not exist."""
    import difflib

    folder = path.resolve().parent
    if not folder.is_dir():
        return f"The folder {folder} does not exist."
    csvs = sorted(p.name for p in folder.glob("*.csv"))
    close = difflib.get_close_matches(path.name, csvs, n=3)
    if close:
        return f"Did you mean {' or '.join(map(repr, close))} (in {folder})?"
    return f"{folder} holds the CSV files {csvs[:10]}." if csvs else f"{folder} holds no CSV file."


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
    # layout is still schema-checked by read_series_table).
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


def _resolve(root, name: str, download: bool = False) -> tuple[str, LTSFSpec, Path]:
    key = ltsf_key(name)
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
    key = ltsf_key(name)
    if base is not None and key is not None and (base / "ltsf" / LTSF_DATASETS[key].path).is_file():
        return base / "ltsf"
    return cache_dir("ltsf")


def ltsf_key(name: str) -> str | None:
    """The key in :data:`LTSF_DATASETS` of a known dataset ``name`` (case-insensitive, aliases such as ``ECL`` or
    ``ILI``), or ``None`` (a CSV path, or an unknown name)."""
    return _LOOKUP.get(str(name).lower())


class LTSFDataModule(SeriesDataModule):
    """Long-term forecasting data with the Time-Series-Library protocol (module doc): one LTSF file, or with
    ``synthetic=True`` the built-in multiway series (:func:`synthetic_multiway_series`: ``synthetic_length`` hourly
    rows from 2020-01-01, ``num_variates`` variates named ``v0 .. v{C-2}, OT``, 70/10/20 split, deterministic given
    ``seed``). A configuration of :class:`~hoformer.data.series.SeriesDataModule`: the file is read and split, and
    the scaler fitted on its training rows, once, for every split.

    Args:
        root: directory laid out like ``shared/data/ltsf`` (``ETT-small/ETTh1.csv``, ``weather/weather.csv``,
            ``illness/national_illness.csv``, ``electricity/electricity.csv``, ``traffic/traffic.csv``,
            ``exchange_rate/exchange_rate.csv``, ``Solar/solar_AL.txt``); ``None`` = ``$HOFORMER_DATA/ltsf`` (or
            ``../shared/data/ltsf``), or with ``download=True`` (file not there) the cache ``~/.cache/hoformer/ltsf``
            (``$HOFORMER_CACHE``); a missing ``root`` is created by a download.
        name: a known dataset (case-insensitive: ETTh1, ETTh2, ETTm1, ETTm2, weather, electricity/ECL, traffic,
            exchange_rate, solar, national_illness/ILI) or a CSV path relative to ``root`` (70/10/20 protocol).
        seq_len, pred_len: lookback and horizon; ``label_len`` known steps before the horizon, returned as
            ``y_known`` (TSLib's decoder start tokens; 0 by default).
        features: "M" all variates in and out; "S" the ``target`` variate only; "MS" all in, ``target`` out
            (``y`` is then ``(pred_len, 1)``).
        target: target column for S/MS (moved to the last column, as in TSLib); default "OT".
        scale: standardise with the training rows' statistics (:attr:`scaler`; ``False``: none).
        time_features: also return the calendar features (:func:`~hoformer.data.series.time_features`, the
            dataset's own frequency, e.g. "h" for ETTh, "t" for ETTm / weather, as in Informer) of the input and
            target steps as ``time`` / ``y_time``. The hoformer models do not read them.
        verify: check the file's SHA-256 when the reference copy's is known (``False`` for other copies).
        download: fetch a missing file from its canonical URL (ETT only; others come in the TSLib bundle); the
            download is atomic and checked against the pinned SHA-256 where one is known (ETTh1, ETTm1).
        encoding: text encoding of the file (default UTF-8; a line that does not decode is an error naming it).
        batch_size, eval_batch_size, num_workers, pin_memory: the loaders; ``on_device``: keep the scaled series
            on the trainer's device and gather the batches there (no workers; see
            :class:`~hoformer.data.series.SeriesDataModule`).

    Batches are the dicts of :mod:`hoformer.data.series` (``x (B, seq_len, C)``, ``y (B, pred_len, C or 1)``,
    ``mean`` / ``std``, and ``time`` / ``y_time`` with ``time_features``, ``y_known`` with ``label_len``). After
    ``setup``: :attr:`scaler` (its ``inverse_transform`` maps model-scale values back), :attr:`variate_names`,
    :meth:`history` (the file as a DataFrame, for :func:`~hoformer.inference.forecast_series`) and
    :meth:`data_signature`.
    """

    def __init__(self, root: str | None = None, name: str = "ETTh1", seq_len: int = 96, pred_len: int = 96,
                 batch_size: int = 32, num_workers: int = 0, synthetic: bool = False, label_len: int = 0,
                 features: str = "M", target: str = "OT", scale: bool = True, time_features: bool = False,
                 num_variates: int = 7, synthetic_length: int = 4000, seed: int = 0, verify: bool = True,
                 download: bool = False, pin_memory: bool = False, eval_batch_size: int | None = None,
                 encoding: str = "utf-8", on_device: bool = False):
        fn = type(self).__name__
        for arg, v in (("seq_len", seq_len), ("pred_len", pred_len)):
            check_int(fn, arg, v)
        if not is_int(label_len) or not 0 <= label_len <= seq_len:
            raise ValueError(f"{fn}: label_len must be an int in [0, seq_len={seq_len}], got {label_len!r}")
        if features not in ("M", "S", "MS"):
            raise ValueError(f"{fn}: features must be 'M', 'S' or 'MS', got {features!r}")
        if synthetic:
            check_int(fn, "num_variates", num_variates)
            check_int(fn, "synthetic_length", synthetic_length, low=2)
        spec = None if synthetic else LTSF_DATASETS.get(ltsf_key(name) or "")
        super().__init__(window=seq_len, horizon=pred_len, protocol=spec.protocol if spec else "custom",
                         scale=scale, label_len=label_len, target_last=features == "MS",
                         time_encoding="calendar" if time_features else None, freq=spec.freq if spec else "h",
                         batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                         eval_batch_size=eval_batch_size, on_device=on_device)
        self.save_hyperparameters()
        self.name, self.seq_len, self.pred_len, self.synthetic = name, seq_len, pred_len, synthetic
        self.features, self.target = features, target
        if synthetic:
            self.root = None
        elif download:  # a fresh machine: no data root yet; the read creates it (or uses the cache) and downloads
            self.root = Path(root).expanduser() if root is not None else None
        else:
            self.root = resolve_root(root, "ltsf", f"LTSF dataset {name!r}")

    # ------------------------------------------------------------------------------------------------ read
    def _path(self) -> tuple[str, Path]:
        """``(dataset label, file)``, downloaded (``download=True``) and verified (``verify=True``) where known."""
        h = self.hparams
        label, spec, path = _resolve(self.root, h.name, h.download)
        if path.is_dir():
            raise FileNotFoundError(f"LTSF file for {label!r}: {path} is a directory, expected a CSV file")
        if not path.is_file():
            if h.download and spec.url:
                download_url(spec.url, path, sha256=spec.sha256 if h.verify else None)
            else:
                hint = (f"Pass download=True to fetch it from {spec.url}." if spec.url else
                        _BUNDLE_HINT if spec.channels > 0 else _nearby_csv(path))
                raise FileNotFoundError(f"LTSF file for {label!r} not found: {path.resolve()}. {hint}".strip())
        if h.verify and spec.sha256:
            verify_file(path, sha256=spec.sha256, hint=VERIFY_HINT)
        return label, path

    def _table(self, path=None):
        """``(label, source, dates, values, columns)`` of the file (or of ``path``, read the same way)."""
        h = self.hparams
        if self.synthetic and path is None:
            values = synthetic_multiway_series(h.synthetic_length, h.num_variates, seed=h.seed)
            dates = np.datetime64("2020-01-01T00:00", "ns") + np.arange(h.synthetic_length) * np.timedelta64(1, "h")
            columns = tuple(f"v{i}" for i in range(h.num_variates - 1)) + ("OT",)
            source = f"synthetic(length={h.synthetic_length}, num_variates={h.num_variates}, seed={h.seed})"
            return "synthetic", source, dates, values, columns
        if path is None:
            label, path = self._path()
        else:
            label, path = Path(path).stem, Path(path)
        headed = self.synthetic or self.protocol != "solar"
        dates, values, columns = read_series_table(path, headed, encoding=h.encoding)
        return label, str(path), dates, values, columns

    def read_series(self) -> Series:
        label, source, dates, values, columns = self._table()
        columns = list(columns)
        if self.target in columns:  # TSLib order: date, other variates..., target
            order = [i for i, c in enumerate(columns) if c != self.target] + [columns.index(self.target)]
            values, columns = values[:, order], [columns[i] for i in order]
        elif self.features != "M" and self.protocol != "solar":
            raise ValueError(f"target {self.target!r} is not a column of {label!r} (columns: {columns})")
        if self.features == "S":
            values, columns = values[:, -1:], columns[-1:]
        return Series(values, tuple(columns), source, dates)

    # ---------------------------------------------------------------------------------------------- views
    @property
    def variate_names(self) -> list[str]:
        """The column names in the model's variate order (``HUFL`` ... ``OT`` for ETTh1), the labels of the forecast
        plots (linked into :class:`~hoformer.train.ForecastingTask` ``variate_names`` by the CLI)."""
        return self.columns

    @property
    def num_variates(self) -> int:
        """Input variates ``C`` (known without reading the file for the built-in datasets)."""
        if self.features == "S":
            return 1
        if self.synthetic:
            return self.hparams.num_variates
        key = ltsf_key(self.name)
        return LTSF_DATASETS[key].channels if key else len(self.columns)

    def _split_note(self) -> str:
        """A CSV path whose name is a known dataset (``ETTh2.csv``) is split 70/10/20 as any CSV: say how to get the
        dataset's published split instead (``name=ETTh2``)."""
        key = None if self.synthetic or ltsf_key(self.name) else ltsf_key(Path(str(self.name)).stem)
        if key is None or LTSF_DATASETS[key].protocol == self.protocol:
            return ""
        return (f"name={self.name} is read as a CSV of your own; name={key} (root: the folder holding "
                f"{LTSF_DATASETS[key].path}) gives {key}'s published split")

    def history(self, path=None):
        """The series on the original scale as a ``pandas.DataFrame``: a ``date`` column (when the data has
        timestamps), then :attr:`variate_names`; of the datamodule's file, or of ``path`` (e.g. the same series with
        newer rows) read and checked the same way. The ``history`` of
        :func:`~hoformer.inference.forecast_series`."""
        import pandas as pd

        series = self._built()
        if path is None:
            dates, values = series.dates, series.values
        else:
            _, _, dates, values, columns = self._table(require_file(path, "LTSFDataModule.history"))
            missing = [c for c in series.columns if c not in columns]
            if missing:
                raise ValueError(f"{path}: lacks the training column(s) {missing} (has {list(columns)})")
            values = values[:, [columns.index(c) for c in series.columns]]
        frame = pd.DataFrame(np.asarray(values), columns=list(series.columns))
        if dates is not None:
            frame.insert(0, "date", pd.DatetimeIndex(dates))
        return frame


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

    key = ltsf_key(name)
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
