"""The windowed-series datamodule (:class:`SeriesDataModule`) and the series it reads (:class:`Series`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .._base import SplitDataModule
from .calendar import time_features
from .scaler import StandardScaler
from .splits import PROTOCOL_NAMES, ROW_PROTOCOLS, SPLITS, WINDOW_PROTOCOLS, chronological_split
from .windows import SeriesWindows, WindowBatches

__all__ = ["Series", "SeriesDataModule"]


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
        with a checkpoint; :func:`hoformer.checkpoint.check_data_signature` compares it with the data a checkpoint
        is later used on."""
        series = self._built()
        columns = list(series.columns)
        return {"data": Path(series.source).name, "columns": columns, "num_series": len(columns),
                "targets": columns[-1:] if self.target_last else columns, "lookback": self.window,
                "horizon": self.horizon, "scaler": None if self.scaler is None else self.scaler.digest()}

