"""Forecasting past the end of the data: forecast_series and ``hoformer forecast``."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from hoformer.data import LTSFDataModule
from hoformer.data.ltsf import write_synthetic_ltsf_csv
from hoformer.models import create_model
from hoformer.inference import forecast_checkpoint, forecast_main, forecast_series


class Persistence(torch.nn.Module):
    """``y = the last pred_len input steps`` (or a constant ``fill``), in float64, recording what it was fed."""

    def __init__(self, pred_len: int, fill: float | None = None) -> None:
        super().__init__()
        self.pred_len, self.fill, self.seen = pred_len, fill, None
        self.w = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

    def forward(self, x):
        self.seen = (x.clone(), self.training, torch.is_grad_enabled())
        y = x[:, -self.pred_len:] * self.w
        return torch.full_like(y, self.fill) if self.fill is not None else y


def _etth1(tmp_path, n_rows=14400 + 50):
    write_synthetic_ltsf_csv(tmp_path / "ETT-small" / "ETTh1.csv", "ETTh1", n_rows=n_rows)
    return _dm(tmp_path, "ETTh1", seq_len=48, pred_len=24)


def _dm(root, name, **kw):
    dm = LTSFDataModule(str(root), name, verify=False, **kw)
    dm.setup()
    return dm


def _forecast(model, dm, history=None, **kw):
    """forecast_series with what the datamodule knows: its scaler, columns, lengths and features; its file as the
    default history."""
    return forecast_series(model, dm.scaler, dm.variate_names, dm.history() if history is None else history,
                           seq_len=dm.seq_len, pred_len=dm.pred_len, features=dm.features, **kw)


def test_forecast_feeds_the_last_rows_scaled_with_the_train_statistics(tmp_path):
    ds = _etth1(tmp_path)
    raw = pd.read_csv(tmp_path / "ETT-small" / "ETTh1.csv")
    model = Persistence(24).train()
    df = _forecast(model, ds)
    # the input: the file's last 48 rows (beyond the protocol's 14,400: the data the user has), standardised with
    # the statistics of the 8,640 training rows, in float64 (the model's dtype)
    x, training, grad = model.seen
    assert x.dtype == torch.float64 and not training and not grad and model.training  # eval + no_grad, then restored
    train = raw.iloc[:8640, 1:].to_numpy()
    want = (raw.iloc[-48:, 1:].to_numpy() - train.mean(0)) / train.std(0)
    np.testing.assert_allclose(x[0].numpy(), want, rtol=1e-5, atol=1e-5)
    # the output: original scale (persistence returns the last 24 rows), dated after the last timestamp
    assert list(df.columns) == ["date", *raw.columns[1:]]
    np.testing.assert_allclose(df.iloc[:, 1:].to_numpy(), raw.iloc[-24:, 1:].to_numpy(), rtol=1e-5, atol=1e-4)
    last = pd.Timestamp(raw["date"].iloc[-1])
    assert list(df["date"]) == list(pd.date_range(last, periods=25, freq="h")[1:])


def test_forecast_backtest_end_uses_the_files_dates(tmp_path):
    ds = _etth1(tmp_path)
    raw = pd.read_csv(tmp_path / "ETT-small" / "ETTh1.csv")
    model = Persistence(24)
    df = _forecast(model, ds, end=1000)
    np.testing.assert_allclose(model.seen[0][0].numpy(), ds.scaler.transform(raw.iloc[952:1000, 1:].to_numpy()),
                               atol=1e-5)
    assert list(df["date"]) == list(pd.to_datetime(raw["date"].iloc[1000:1024]))
    for bad in (47, len(raw) + 1, 10.5, None.__class__):
        with pytest.raises(ValueError, match="`end` must be an int in"):
            _forecast(model, ds, end=bad)


def test_forecast_history_keeps_the_training_scaler(tmp_path):
    """Newer data in another file: the lookback comes from it, the scaler from the training file (a refit on the
    longer file would move a custom CSV's 70 % border); columns are matched by name, extra ones ignored."""
    ds = _etth1(tmp_path)
    raw = pd.read_csv(tmp_path / "ETT-small" / "ETTh1.csv")
    newer = pd.concat([raw, raw.iloc[-100:].assign(date=pd.date_range(raw["date"].iloc[-1], periods=101,
                                                                        freq="h")[1:].astype(str))])
    newer.iloc[:8640, 1:] *= 3.0  # a scaler refit on this file would have another mean
    newer = newer[["date", "OT", *raw.columns[1:-1]]].assign(extra=1.0)  # other column order, one extra column
    newer.to_csv(tmp_path / "newer.csv", index=False)
    zero = Persistence(24, fill=0.0)  # predicts the training mean on the original scale
    newer = newer.rename(columns={"OT": " OT "})  # names are stripped as when reading a CSV; the frame is not changed
    for history in (tmp_path / "newer.csv", str(tmp_path / "newer.csv"), newer):
        df = _forecast(zero, ds, history)
        np.testing.assert_allclose(df.iloc[0, 1:].to_numpy(np.float64), raw.iloc[:8640, 1:].to_numpy().mean(0),
                                   rtol=1e-5)
        assert df["date"].iloc[0] == pd.Timestamp(newer["date"].iloc[-1]) + pd.Timedelta(hours=1)
    assert " OT " in newer.columns
    newer = newer.rename(columns={" OT ": "OT"})
    with pytest.raises(ValueError, match=r"lacks the training column\(s\) \['OT'\]"):
        _forecast(zero, ds, newer.drop(columns="OT"))
    with pytest.raises(ValueError, match="non-finite"):
        _forecast(zero, ds, newer.assign(OT=np.nan))
    with pytest.raises(TypeError, match="`history` must be a pandas.DataFrame or a CSV path"):
        _forecast(zero, ds, raw.to_numpy())
    with pytest.raises(FileNotFoundError, match="history file"):
        _forecast(zero, ds, tmp_path / "missing.csv")


def test_forecast_target_features_weekly_dates_and_shape_errors(tmp_path):
    write_synthetic_ltsf_csv(tmp_path / "illness" / "national_illness.csv", "national_illness", n_rows=300)
    raw = pd.read_csv(tmp_path / "illness" / "national_illness.csv")
    for features in ("MS", "S"):
        ds = _dm(tmp_path, "ILI", seq_len=36, pred_len=12, features=features)
        df = _forecast(Persistence(12), ds)
        assert list(df.columns) == ["date", "OT"]
        np.testing.assert_allclose(df["OT"].to_numpy(), raw["OT"].iloc[-12:].to_numpy(), rtol=1e-5)
        assert df["date"].iloc[0] - pd.Timestamp(raw["date"].iloc[-1]) == pd.Timedelta(days=7)
    with pytest.raises(ValueError, match=r"expected \(1, 12, 1\) \(pred_len and features='S'"):
        _forecast(Persistence(6), ds)


class LastColumn(Persistence):
    def forward(self, x):
        return super().forward(x)[..., -1:]


def test_forecast_refuses_a_target_only_output_for_all_variates(tmp_path):
    """features="M" forecasts every variate: a model giving one column is an error (it was labelled 'OT' silently
    without a scaler), while "MS" takes the target column of a full-width output or a one-column output."""
    write_synthetic_ltsf_csv(tmp_path / "illness" / "national_illness.csv", "national_illness", n_rows=300)
    for scale in (True, False):
        ds = _dm(tmp_path, "ILI", seq_len=36, pred_len=12, scale=scale)
        with pytest.raises(ValueError, match=r"expected \(1, 12, 7\) \(pred_len and features='M'"):
            _forecast(LastColumn(12), ds)
    ms = _dm(tmp_path, "ILI", seq_len=36, pred_len=12, features="MS")
    pd.testing.assert_frame_equal(_forecast(LastColumn(12), ms), _forecast(Persistence(12), ms))


def test_forecast_dates_across_the_end_gaps_time_zones_and_bad_histories(tmp_path):
    """A backtest crossing the end keeps the file's own timestamps and extrapolates the rest from its last one (a gap
    before the last row stays); a DataFrame's time zone (date column or DatetimeIndex) is kept; histories that are too
    short, not finite or not advancing in time are named as such."""
    ds = _etth1(tmp_path)  # seq_len 48, pred_len 24
    raw = pd.read_csv(tmp_path / "ETT-small" / "ETTh1.csv").iloc[-200:].reset_index(drop=True)
    raw["date"] = pd.to_datetime(raw["date"])
    raw.loc[199, "date"] += pd.Timedelta(hours=2)  # the last row comes 3 hours after the one before
    df = _forecast(Persistence(24), ds, raw, end=190)
    want = list(raw["date"].iloc[190:]) + list(pd.date_range(raw["date"].iloc[-1], periods=15, freq="h")[1:])
    assert list(df["date"]) == want
    local = raw.assign(date=raw["date"].dt.tz_localize("Europe/Paris"))
    for frame in (local, local.set_index("date")):
        got = _forecast(Persistence(24), ds, frame)
        assert got["date"].iloc[0] == local["date"].iloc[-1] + pd.Timedelta(hours=1)
        assert str(got["date"].dt.tz) == "Europe/Paris"
    with pytest.raises(ValueError, match="the history has 10 rows, fewer than seq_len=48"):
        _forecast(Persistence(24), ds, raw.iloc[:10])
    with pytest.raises(ValueError, match="non-finite value in column 'MULL' at row 7"):
        _forecast(Persistence(24), ds, raw.assign(MULL=raw["MULL"].where(raw.index != 7)))
    with pytest.raises(ValueError, match="timestamps do not advance"):
        _forecast(Persistence(24), ds, raw.assign(date=raw["date"].iloc[0]))


def test_forecast_without_timestamps_numbers_the_steps(tmp_path):
    write_synthetic_ltsf_csv(tmp_path / "Solar" / "solar_AL.txt", "solar", n_rows=400, num_variates=4)
    ds = _dm(tmp_path, "solar", seq_len=24, pred_len=8)
    df = _forecast(Persistence(8), ds)
    assert list(df["step"]) == list(range(1, 9)) and df.shape == (8, 5)


_DATA = dict(synthetic=True, seq_len=16, pred_len=8, num_variates=3, synthetic_length=300, batch_size=4)
_MODEL = dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2, patch_size=4)


def _checkpoint(tmp_path, data: dict):
    """A tiny forecaster's Lightning checkpoint whose datamodule is ``LTSFDataModule(**data)``: (model, path)."""
    model = create_model("hot_forecaster", **_MODEL)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": _MODEL},
                "datamodule_hyper_parameters": {"_class_path": "hoformer.data.LTSFDataModule", **data}}, ckpt)
    return model, ckpt


def test_hoformer_forecast_from_ckpt_and_pretrained(tmp_path, capsys):
    model, ckpt = _checkpoint(tmp_path, _DATA)
    out = tmp_path / "out" / "forecast.csv"
    assert forecast_main(["--checkpoint", str(ckpt), "--output", str(out)]) == 0
    assert "hoformer forecast: 8 steps (2020-01-13 12:00:00 .. 2020-01-13 19:00:00) x 3 column(s)" in \
        capsys.readouterr().out  # 300 hourly rows from 2020-01-01 00:00: the last is 2020-01-13 11:00
    got = pd.read_csv(out)
    assert list(got.columns) == ["date", "v0", "v1", "OT"] and len(got) == 8
    dm = LTSFDataModule(**_DATA)
    dm.setup()
    want = forecast_series(model, dm.scaler, dm.variate_names, dm.history())  # lengths: the model's
    np.testing.assert_allclose(got.iloc[:, 1:].to_numpy(), want.iloc[:, 1:].to_numpy(), rtol=1e-5, atol=1e-6)
    # a save_pretrained folder stores no data: --config gives it (here a LightningCLI-style YAML)
    model.save_pretrained(tmp_path / "pre")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({"data": {"class_path": "hoformer.data.LTSFDataModule", "init_args": _DATA}}))
    df = forecast_checkpoint(tmp_path / "pre", config=cfg, end=100)
    np.testing.assert_allclose(df.iloc[:, 1:].to_numpy(), _forecast(model, dm, end=100).iloc[:, 1:].to_numpy(),
                               rtol=1e-5, atol=1e-6)
    # errors: one line and exit code 2
    assert forecast_main(["--checkpoint", str(tmp_path / "missing.ckpt")]) == 2
    assert forecast_main(["--checkpoint", str(ckpt), "--end", "5"]) == 2
    err = capsys.readouterr().err
    assert "hoformer forecast: error: load_checkpoint: checkpoint" in err and "`end` must be an int in" in err
    assert forecast_main(["--checkpoint", str(tmp_path / "pre")]) == 2
    assert "no data given" in capsys.readouterr().err


def test_hoformer_forecast_from_a_plain_fit_checkpoint(tmp_path, capsys):
    """A checkpoint of a plain ``Trainer.fit`` (``hoformer demo``) stores the datamodule's hyper-parameters without
    its class: ``--data CLASS`` names it, the stored arguments are used, ``--data-args`` override them."""
    model = create_model("hot_forecaster", **_MODEL)
    ckpt = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": _MODEL},
                "datamodule_hyper_parameters": dict(_DATA)}, ckpt)
    assert forecast_main(["--checkpoint", str(ckpt)]) == 2
    assert "no data given" in capsys.readouterr().err
    out = tmp_path / "f.csv"
    assert forecast_main(["--checkpoint", str(ckpt), "--data", "hoformer.data.LTSFDataModule",
                          "--output", str(out)]) == 0
    dm = LTSFDataModule(**_DATA)
    want = _forecast(model, dm)
    np.testing.assert_allclose(pd.read_csv(out).iloc[:, 1:].to_numpy(), want.iloc[:, 1:].to_numpy(), rtol=1e-5,
                               atol=1e-6)
    assert forecast_main(["--checkpoint", str(ckpt), "--data", "hoformer.data.LTSFDataModule", "--data-args",
                          json.dumps({"synthetic_length": 20})]) == 2  # overridden: too short for a window
    assert "hoformer forecast: error:" in capsys.readouterr().err


def test_hoformer_forecast_is_a_cli_command(capsys):
    from hoformer.cli import HOOKS, main

    assert HOOKS["forecast"][0] == "hoformer.inference:forecast_main"
    assert main(["--help"]) == 0
    assert any(line.split()[:1] == ["forecast"] for line in capsys.readouterr().out.splitlines())


def test_forecast_calendar_steps_in_local_time_offsets_and_order(tmp_path):
    """Daily / monthly local data keep their wall-clock time across a DST change (the step is extrapolated in the
    history's time zone, not in UTC); mixed UTC offsets, as a tz-aware series written to CSV has them, are read (as
    UTC) from a DataFrame or a file; a newest-first history is refused, naming the row, instead of feeding the model
    a reversed lookback with dates running backwards."""
    ds = _etth1(tmp_path)
    raw = pd.read_csv(tmp_path / "ETT-small" / "ETTh1.csv").iloc[-200:].reset_index(drop=True)
    daily = raw.assign(date=pd.date_range(end="2024-03-21", periods=200, freq="D", tz="Europe/Paris"))
    got = _forecast(Persistence(24), ds, daily)["date"]
    assert list(got) == list(pd.date_range("2024-03-22", periods=24, freq="D", tz="Europe/Paris"))
    assert (got.dt.hour == 0).all()  # the spring DST change (2024-03-31) is crossed at local midnight
    monthly = raw.assign(date=pd.date_range(end="2024-03-01", periods=200, freq="MS", tz="Europe/Paris"))
    assert _forecast(Persistence(24), ds, monthly.set_index("date"))["date"].iloc[1] == pd.Timestamp(
        "2024-05-01", tz="Europe/Paris")
    aware = raw.assign(date=pd.date_range(end="2024-04-05 12:00", periods=200, freq="h", tz="Europe/Paris"))
    aware.to_csv(tmp_path / "paris.csv", index=False)  # offsets +01:00 then +02:00 in the text
    want = pd.Timestamp("2024-04-05 13:00", tz="Europe/Paris")
    assert _forecast(Persistence(24), ds, pd.read_csv(tmp_path / "paris.csv"))["date"].iloc[0] == want
    # a file's timestamps are read as naive UTC
    assert _forecast(Persistence(24), ds, tmp_path / "paris.csv")["date"].iloc[0] == want.tz_convert(None)
    with pytest.raises(ValueError, match=r"timestamps go back in time at row 153 .* sort it oldest first"):
        _forecast(Persistence(24), ds, raw.iloc[::-1])  # checked in the rows the forecast uses: the last 48
    repeated = raw.assign(date=raw["date"].where(raw.index != 20, raw["date"].shift(1)))  # one repeated timestamp,
    assert len(_forecast(Persistence(24), ds, repeated)) == 24  # as the Weather file has: allowed


def test_forecast_series_arguments_are_checked(tmp_path):
    """The scaler must fit the columns, the lengths come from the model or the arguments, features is one of three."""
    dm = _etth1(tmp_path)
    history = dm.history()
    with pytest.raises(ValueError, match=r"the scaler has 7 channels but 2 columns were given \(\['HUFL', 'OT'\]\)"):
        forecast_series(Persistence(24), dm.scaler, ["HUFL", "OT"], history, seq_len=48)
    with pytest.raises(ValueError, match=r"`seq_len` must be an int >= 1 \(pass seq_len=\.\.\., or a model with a "
                                         r"`seq_len` attribute\), got None"):
        forecast_series(Persistence(24), dm.scaler, dm.variate_names, history)
    with pytest.raises(ValueError, match="`features` must be 'M', 'S' or 'MS', got 'X'"):
        forecast_series(Persistence(24), dm.scaler, dm.variate_names, history, seq_len=48, features="X")
    got = forecast_series(Persistence(24), dm.scaler, dm.variate_names, history, seq_len=48)  # pred_len: the model's
    pd.testing.assert_frame_equal(got, _forecast(Persistence(24), dm))


def test_forecast_checkpoint_reads_a_history_file_as_the_training_file(tmp_path):
    """``history=PATH`` (``--history``) is read like the training file (header or not, encoding) and matched by
    column name; a missing file is named."""
    write_synthetic_ltsf_csv(tmp_path / "Solar" / "solar_AL.txt", "solar", n_rows=400, num_variates=4)
    kwargs = dict(seq_len=24, pred_len=8, num_variates=4, dim=16, depth=1, num_heads=2, patch_size=4)
    model = create_model("hot_forecaster", **kwargs)
    ckpt = tmp_path / "solar.ckpt"
    data = dict(root=str(tmp_path), name="solar", seq_len=24, pred_len=8, verify=False)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": kwargs},
                "datamodule_hyper_parameters": {"_class_path": "hoformer.data.LTSFDataModule", **data}}, ckpt)
    newer = write_synthetic_ltsf_csv(tmp_path / "newer.txt", "solar", n_rows=100, num_variates=4, seed=3)
    dm = _dm(tmp_path, "solar", seq_len=24, pred_len=8)
    want = forecast_series(model, dm.scaler, dm.variate_names, dm.history(newer))
    pd.testing.assert_frame_equal(forecast_checkpoint(ckpt, history=newer), want)
    assert list(want.columns) == ["step", "0", "1", "2", "3"]  # no header: the columns are numbered
    assert not want.equals(forecast_checkpoint(ckpt))  # the training file's end is another lookback
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        forecast_checkpoint(ckpt, history=tmp_path / "missing.txt")


@pytest.mark.parametrize("features", ["M", "MS"])
def test_hoformer_forecast_writes_the_task_s_unscaled_predictions(tmp_path, features):
    """``hoformer forecast --end`` at a test window writes what the :class:`ForecastingTask` predicts for that window
    on the original scale (``unscale`` of its prediction with the batch's statistics, what its ``*_orig`` metrics
    score): the command and the task invert the scaling with the one function."""
    from torch.utils.data import default_collate

    from hoformer.data import unscale
    from hoformer.train import ForecastingTask

    data = {**_DATA, "features": features}
    model, ckpt = _checkpoint(tmp_path, data)
    dm = LTSFDataModule(**data)
    dm.setup()
    test = dm.dataset("test")
    task = ForecastingTask(model, original_scale=True, plot_variates=0).eval()
    for i in (0, len(test) - 1):
        batch = default_collate([test[i]])
        with torch.no_grad():
            pred = task.predict_step(batch, 0)
        pred = pred[..., -batch["y"].shape[-1]:]  # "MS": the target, the last channel (as the task scores it)
        want = unscale(pred, batch)[0].numpy()
        out = tmp_path / f"forecast_{i}.csv"
        end = int(test.starts[i]) + _DATA["seq_len"]
        assert forecast_main(["--checkpoint", str(ckpt), "--end", str(end), "--output", str(out)]) == 0
        got = pd.read_csv(out)
        assert list(got.columns)[1:] == (["OT"] if features == "MS" else dm.variate_names)
        np.testing.assert_allclose(got.iloc[:, 1:].to_numpy(), want, rtol=1e-5, atol=1e-5)
        # the truth of that window, unscaled the same way, is the file's own rows
        truth = dm.history().iloc[end:end + _DATA["pred_len"], 1:].to_numpy()[:, -want.shape[1]:]
        np.testing.assert_allclose(unscale(batch["y"], batch)[0].numpy(), truth, rtol=1e-5, atol=1e-5)
