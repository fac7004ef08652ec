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
``mean``        ``(B, C_y)``                scaler statistics of the target channels (``std`` with the scaler's
``std``         ``(B, C_y)``                ``eps``), float32: :func:`unscale` gives the original scale
``mask``        ``(B, P, *space, C)``       observed inputs (bool); only for series with missing values (traffic:
``y_mask``      ``(B, Q, *space, C_y)``     zeros are missing); absent: every entry is observed
``time``        ``(B, P, F)``               time features of the input steps (when asked for and known)
``y_time``      ``(B, Q, F)``               time features of the target steps
``y_known``     ``(B, label_len, C_y)``     the ``label_len`` steps before the horizon (TSLib decoder start; only
                                            when ``label_len > 0``), model scale
==============  ==========================  ====================================================================

A task needs nothing else: metrics on the original scale come from ``unscale(values, batch)`` (``values * std +
mean``, each sample's statistics broadcast over its steps and space; the one inverse of the scaling, used by every
task, metric, plot and ``hoformer forecast``), masked metrics from ``y_mask``.

Data signature
--------------
:meth:`SeriesDataModule.data_signature` summarises what a model trained on the data depends on (file, series names,
lookback, horizon, a digest of the scaler); :func:`hoformer.checkpoint.check_data_signature` compares a stored one
with the current one and names every difference, so a checkpoint is not silently tested on other data.

Modules
-------
``scaler`` (:class:`StandardScaler`, :func:`unscale`), ``reading`` (CSV reading and validation), ``calendar``
(:func:`time_features`), ``splits`` (the split protocols), ``windows`` (:class:`SeriesWindows`, the on-device
:class:`WindowBatches`), ``datamodule`` (:class:`Series`, :class:`SeriesDataModule`).
"""
from hoformer.checkpoint import DataMismatchError, check_data_signature  # noqa: F401 (documented there)

from .calendar import time_features
from .datamodule import Series, SeriesDataModule
from .reading import check_series_frame, check_time_order, read_series_table
from .scaler import StandardScaler, unscale
from .splits import (  # noqa: F401 (PROTOCOL_NAMES, SPLITS: importable, not exported)
    PROTOCOL_NAMES, ROW_PROTOCOLS, SPLITS, WINDOW_PROTOCOLS, chronological_split, ltsf_borders, split_windows,
    window_starts)
from .windows import SeriesWindows, WindowBatches  # noqa: F401 (WindowBatches: the on-device loader)

__all__ = [
    "StandardScaler",
    "unscale",
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
    "ROW_PROTOCOLS",
    "WINDOW_PROTOCOLS",
]
