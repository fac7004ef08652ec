"""The windowed-series data contract shared by forecasting and traffic: splitter, scaler, windows, batch format; time
order and text encoding of the files; checkpoints of the earlier task layout."""
from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from hoformer.data import LTSFDataModule, SchemaError, TrafficDataModule, write_synthetic_ltsf_csv
from hoformer.data.series import (SeriesWindows, StandardScaler, chronological_split, ltsf_borders, split_windows,
                                  window_starts)


def test_chronological_split_matches_both_protocol_families():
    """Row protocols: every window inside a split's rows (TSLib borders); window protocols: the DCRNN / TSL split of
    all windows. The scaler's rows end with the training windows' last target row in both."""
    starts, rows = chronological_split("custom", 1000, 24, 12)
    b1, b2 = ltsf_borders("custom", 1000, 24)
    assert rows == b2[0] == 700
    for i, s in enumerate(("train", "val", "test")):
        assert starts[s][0] == b1[i] and starts[s][-1] + 24 + 12 == b2[i]
        assert np.array_equal(np.diff(starts[s]), np.ones(len(starts[s]) - 1))
    for protocol in ("dcrnn", "tsl"):
        starts, rows = chronological_split(protocol, 500, 12, 12)
        ws = window_starts(500, 12, 12)
        want = split_windows(len(ws), protocol=protocol, gap=12)
        for s, idx in zip(("train", "val", "test"), want):
            assert np.array_equal(starts[s], ws[idx]), (protocol, s)
        assert rows == starts["train"][-1] + 24
    with pytest.raises(ValueError, match="protocol must be one of"):
        chronological_split("weekly", 100, 4, 4)


def test_scaler_observed_entries_and_constant_channels():
    """Statistics over every axis but the last, of observed entries only; a constant channel keeps std 1."""
    rng = np.random.default_rng(0)
    v = rng.normal(3, 2, (50, 4, 2))
    v[..., 1] = 5.0
    mask = rng.random(v.shape) > 0.3
    sc = StandardScaler(eps=1e-8).fit(v, mask)
    for c in range(2):
        obs = v[..., c][mask[..., c]]
        np.testing.assert_allclose(sc.mean[c], obs.mean(), rtol=1e-12)
        np.testing.assert_allclose(sc.std[c], obs.std() if c == 0 else 1.0, rtol=1e-12)
    out = sc.transform(v, mask)
    assert (out[~mask] == 0).all()
    np.testing.assert_allclose(sc.inverse_transform(out)[mask], v[mask], rtol=1e-9)
    t = torch.from_numpy(out).float()
    torch.testing.assert_close(sc.inverse_transform(t)[torch.from_numpy(mask)], torch.from_numpy(v[mask]).float())


def test_series_windows_items():
    """Item ``i``: input rows [s, s + P), target rows [s + P, s + P + Q), the target's statistics, masks and time
    features of both, the label_len known steps; a one-channel target is the last channel."""
    data = torch.arange(40.0).reshape(10, 2, 2)  # (T, N, C)
    mask = data % 3 != 0
    time = torch.arange(10).reshape(10, 1)
    ds = SeriesWindows(data, [0, 3], 4, 2, [1.0, 2.0], [3.0, 4.0], mask=mask, time=time, label_len=1,
                       target_last=True)
    item = ds[1]
    assert set(item) == {"x", "y", "mean", "std", "mask", "y_mask", "time", "y_time", "y_known"}
    torch.testing.assert_close(item["x"], data[3:7])
    torch.testing.assert_close(item["y"], data[7:9, ..., -1:])
    torch.testing.assert_close(item["y_known"], data[6:7, ..., -1:])
    torch.testing.assert_close(item["y_mask"], mask[7:9, ..., -1:])
    torch.testing.assert_close(item["y_time"], time[7:9])
    torch.testing.assert_close(item["mean"], torch.tensor([2.0]))
    torch.testing.assert_close(item["std"], torch.tensor([4.0]))
    with pytest.raises(IndexError):
        ds[2]


def test_ltsf_and_traffic_batches_share_the_format(tmp_path):
    """Both families give dicts with model-scale ``x`` / ``y`` and per-sample target statistics; traffic adds masks and
    its daily time features. ``y * std + mean`` is the file's value in both."""
    path = write_synthetic_ltsf_csv(tmp_path / "s.csv", "electricity", 400, num_variates=3)
    raw = pd.read_csv(path).iloc[:, 1:].to_numpy()
    ds = LTSFDataModule(str(tmp_path), "s.csv", 24, 12).dataset("test")
    b = ds[0]
    assert set(b) == {"x", "y", "mean", "std"}
    s = ds.starts[0]
    np.testing.assert_allclose((b["y"] * b["std"] + b["mean"]).numpy(), raw[s + 24:s + 36], rtol=1e-5)

    rng = np.random.default_rng(1)
    values = rng.uniform(20, 70, (300, 4)).round(1)
    values[rng.random(values.shape) < 0.2] = 0.0
    d = tmp_path / "traffic"
    d.mkdir()
    pd.DataFrame(values, columns=list("abcd")).to_csv(d / "los_speed.csv", index=False)
    pd.DataFrame(np.eye(4)).to_csv(d / "los_adj.csv", index=False, header=False)
    dm = TrafficDataModule("los_loop", root=str(d), verify=False, batch_size=5)
    t = next(iter(dm.test_dataloader()))
    assert set(t) == {"x", "y", "mean", "std", "mask", "y_mask", "time", "y_time"}
    assert t["x"].shape == (5, 12, 4, 1) and t["mean"].shape == (5, 1) and t["time"].dtype == torch.int16
    s = int(dm.splits["test"].starts[0])
    want = values[s + 12:s + 24, :, None]
    got = (t["y"][0] * t["std"][0] + t["mean"][0]).numpy()
    np.testing.assert_allclose(got[want != 0], want[want != 0], rtol=1e-5)
    assert np.array_equal(t["y_mask"][0].numpy(), want != 0)


# ------------------------------------------------------------------------------------ time order, encoding
@pytest.mark.parametrize("split", ["train", "val", "test"])
@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_unordered_timestamps_are_refused_in_every_split(tmp_path, split, order):
    path = write_synthetic_ltsf_csv(tmp_path / "s.csv", "electricity", 300, num_variates=3)
    df = pd.read_csv(path)
    df = df.iloc[::-1] if order == "reversed" else df.sample(frac=1.0, random_state=0)
    df.to_csv(path, index=False)
    with pytest.raises(SchemaError, match=r"s\.csv: timestamps go back in time at line \d+ .*sort the file"):
        LTSFDataModule(str(tmp_path), "s.csv", 24, 12).dataset(split)


def test_repeated_timestamps_stay_allowed(tmp_path):
    path = write_synthetic_ltsf_csv(tmp_path / "s.csv", "electricity", 300, num_variates=3)
    df = pd.read_csv(path)
    df.loc[5, "date"] = df.loc[4, "date"]  # one repeated stamp, as the Weather file has
    df.to_csv(path, index=False)
    assert len(LTSFDataModule(str(tmp_path), "s.csv", 24, 12).dataset("train")) > 0


def test_unordered_traffic_timestamps_are_refused(tmp_path):
    stamps = pd.date_range("2012-03-01", periods=200, freq="5min")
    stamps = stamps[::-1]
    df = pd.DataFrame(np.random.default_rng(0).uniform(10, 60, (200, 3)), index=stamps, columns=["1", "2", "3"])
    pytest.importorskip("tables")
    df.to_hdf(tmp_path / "metr-la.h5", key="df")
    (tmp_path / "sensor_graph").mkdir()
    with open(tmp_path / "sensor_graph" / "adj_mx.pkl", "wb") as f:
        pickle.dump((["1", "2", "3"], {"1": 0, "2": 1, "3": 2}, np.eye(3, dtype=np.float32)), f)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False)
    with pytest.raises(SchemaError, match=r"metr-la\.h5: timestamps go back in time at row 1 .*oldest first"):
        dm.setup()


def test_non_utf8_header_is_a_clear_error_with_an_encoding_option(tmp_path):
    """A latin-1 header is not read as replacement characters: the error names the file, the line and the encoding;
    ``encoding="latin-1"`` reads it."""
    path = write_synthetic_ltsf_csv(tmp_path / "s.csv", "electricity", 300, num_variates=3)
    text = path.read_text().replace("date,0,1,OT", "date,temp\u00e9rature,1,OT", 1)
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(SchemaError, match=r"s\.csv: line 1 \(byte 0xe9 at column 10\) is not valid utf-8 text.*"
                                          r"encoding='latin-1'"):
        LTSFDataModule(str(tmp_path), "s.csv", 24, 12).setup()
    dm = LTSFDataModule(root=str(tmp_path), name="s.csv", seq_len=24, pred_len=12, encoding="latin-1")
    assert dm.variate_names[0] == dm.dataset("val").columns[0] == "temp\u00e9rature"
    with pytest.raises(ValueError, match="unknown encoding 'klingon'"):
        LTSFDataModule(str(tmp_path), "s.csv", 24, 12, encoding="klingon").setup()


def test_a_directory_where_the_csv_should_be_is_named(tmp_path):
    (tmp_path / "s.csv").mkdir()
    with pytest.raises(FileNotFoundError, match=r"s\.csv is a directory, expected a CSV file"):
        LTSFDataModule(str(tmp_path), "s.csv", 24, 12).setup()


# ------------------------------------------------------------------------- checkpoints of the earlier layout
def _earlier_layout_checkpoint(path, model, kwargs, data):
    """A Lightning checkpoint as the tasks configured by registry name write it (``model_name`` / ``model_kwargs``
    hyper-parameters, the datamodule's hyper-parameters beside them), built by hand."""
    torch.save({
        "epoch": 0, "global_step": 2, "pytorch-lightning_version": "2.6.6",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "loops": {}, "callbacks": {}, "optimizer_states": [], "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": kwargs, "lr": 2e-4, "weight_decay": 0.1,
                             "betas": (0.9, 0.999), "warmup_steps": 0, "scheduler": "cosine", "min_lr_ratio": 0.01,
                             "loss": "mse", "original_scale": False, "plot_variates": 3},
        "datamodule_hparams_name": "kwargs",
        "datamodule_hyper_parameters": {"_class_path": "hoformer.data.LTSFDataModule", **data},
    }, path)


def test_checkpoints_of_the_earlier_task_layout_load(tmp_path):
    """``load_checkpoint`` (used by analyze, forecast and the Python API) rebuilds the model and its data from a
    checkpoint whose task recorded ``model_name`` / ``model_kwargs``; the forecast command reads it too."""
    from hoformer.checkpoint import load_checkpoint
    from hoformer.inference import checkpoint_datamodule
    from hoformer.models import create_model
    from hoformer.inference import forecast_checkpoint, forecast_series

    kwargs = dict(seq_len=16, pred_len=8, num_variates=3, dim=16, num_heads=2, depth=1, patch_size=8)
    data = dict(synthetic=True, synthetic_length=300, seq_len=16, pred_len=8, num_variates=3, batch_size=16)
    model = create_model("hot_forecaster", **kwargs).eval()
    _earlier_layout_checkpoint(tmp_path / "old.ckpt", model, kwargs, data)
    loaded, info = load_checkpoint(tmp_path / "old.ckpt")
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    dm = checkpoint_datamodule(info)
    assert isinstance(dm, LTSFDataModule) and dm.hparams.synthetic_length == 300
    df = forecast_checkpoint(tmp_path / "old.ckpt")
    pd.testing.assert_frame_equal(df, forecast_series(model, dm.scaler, dm.variate_names, dm.history()))


# ------------------------------------------------------------------------------------------- data signature
def _custom(tmp_path, name, num_variates, seed=0, rows=400):
    write_synthetic_ltsf_csv(tmp_path / name, "electricity", rows, num_variates=num_variates, seed=seed)
    return name


def test_data_signature_names_what_the_model_depends_on(tmp_path):
    """File name, series names, their number, the forecast targets, lookback, horizon and a scaler digest; JSON-able;
    the same for the same data read from another folder or with other loader settings."""
    import json
    import shutil

    from hoformer.data import LTSFDataModule

    _custom(tmp_path, "s.csv", 4)
    dm = LTSFDataModule(str(tmp_path), "s.csv", 24, 12)
    sig = dm.data_signature()
    assert json.loads(json.dumps(sig)) == sig
    assert {k: sig[k] for k in ("data", "columns", "num_series", "targets", "lookback", "horizon")} == {
        "data": "s.csv", "columns": ["0", "1", "2", "OT"], "num_series": 4, "targets": ["0", "1", "2", "OT"],
        "lookback": 24, "horizon": 12}
    assert sig["scaler"] == dm.scaler.digest() and len(sig["scaler"]) == 16
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(tmp_path / "s.csv", tmp_path / "elsewhere" / "s.csv")
    other = LTSFDataModule(str(tmp_path / "elsewhere"), "s.csv", 24, 12, batch_size=7, num_workers=0)
    assert other.data_signature() == sig
    ms = LTSFDataModule(str(tmp_path), "s.csv", 24, 12, features="MS").data_signature()
    assert ms["targets"] == ["OT"] and ms["columns"] == sig["columns"]
    assert LTSFDataModule(str(tmp_path), "s.csv", 24, 12, scale=False).data_signature()["scaler"] is None
    traffic = _los_loop(tmp_path / "traffic")
    t = traffic.data_signature()
    assert t["data"] == "los_speed.csv" and t["columns"] == list("abcd") and t["num_series"] == 4
    assert (t["lookback"], t["horizon"]) == (12, 12) and t["scaler"] == traffic.scaler.digest()


def _los_loop(d):
    rng = np.random.default_rng(1)
    values = rng.uniform(20, 70, (300, 4)).round(1)
    d.mkdir()
    pd.DataFrame(values, columns=list("abcd")).to_csv(d / "los_speed.csv", index=False)
    pd.DataFrame(np.eye(4)).to_csv(d / "los_adj.csv", index=False, header=False)
    return TrafficDataModule("los_loop", root=str(d), verify=False)


def test_scaler_digest_ignores_rounding_but_not_other_statistics():
    sc = StandardScaler().fit(np.random.default_rng(0).normal(size=(100, 3)))
    twin = StandardScaler()
    twin.mean, twin.std = sc.mean * (1 + 1e-14), sc.std.copy()  # another machine's summation order
    assert twin.digest() == sc.digest()
    twin.mean = sc.mean + 1e-6
    assert twin.digest() != sc.digest()


def test_check_data_signature_refuses_other_data_naming_the_difference(tmp_path):
    """An 8-series checkpoint used on 7-series data, a 7-series one on 4 series, another file with the same columns,
    another lookback: each refused with what differs (trained on what, given what) and the override; the override
    turns it into a warning; a checkpoint without a signature checks nothing."""
    from hoformer.data import DataMismatchError, LTSFDataModule, check_data_signature

    def sig(name, n, seed=0, **kw):
        return LTSFDataModule(str(tmp_path), _custom(tmp_path, name, n, seed), 24, 12, **kw).data_signature()

    eight, seven, four = sig("eight.csv", 8), sig("seven.csv", 7), sig("four.csv", 4)
    assert check_data_signature(seven, sig("seven.csv", 7)) == []
    with pytest.raises(DataMismatchError) as e:
        check_data_signature(eight, seven)
    msg = str(e.value)
    assert "data: trained on 'eight.csv', now 'seven.csv'" in msg and "num_series: trained on 8, now 7" in msg
    assert "only in training: ['6']" in msg and "pass allow_mismatch=True to use it anyway" in msg
    assert isinstance(e.value, ValueError)
    with pytest.raises(DataMismatchError, match="num_series: trained on 7, now 4"):
        check_data_signature(seven, four, override="--allow_data_mismatch")
    with pytest.raises(DataMismatchError, match="pass --allow_data_mismatch to use it anyway"):
        check_data_signature(seven, four, override="--allow_data_mismatch")
    other_values = sig("seven_b.csv", 7, seed=1)  # same columns, other numbers
    with pytest.raises(DataMismatchError, match="scaler: trained on") as e:
        check_data_signature(seven, {**other_values, "data": "seven.csv"})
    assert "columns" not in str(e.value)
    with pytest.raises(DataMismatchError, match="lookback: trained on 24, now 48"):
        check_data_signature(seven, {**seven, "lookback": 48})
    with pytest.warns(UserWarning, match="num_series: trained on 8, now 7"):
        diffs = check_data_signature(eight, seven, allow_mismatch=True)
    assert len(diffs) >= 3 and any(d.startswith("columns:") for d in diffs)
    assert check_data_signature(None, seven) == [] and check_data_signature({}, seven) == []
    assert check_data_signature({"lookback": 24, "future_key": 1}, seven) == []  # keys on one side only


# ------------------------------------------------------------------------------------------ batches on the device
def _ltsf(**kw):
    from hoformer.data import LTSFDataModule

    dm = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=24, pred_len=8, batch_size=16, **kw)
    dm.setup()
    return dm


@pytest.mark.parametrize("kw", [{}, {"features": "MS", "label_len": 6, "time_features": True}])
def test_window_batches_equal_the_dataloader_s(kw):
    """``on_device=True`` (:class:`WindowBatches`: gathered in one indexing op per key) gives the DataLoader's batches,
    in the same shuffled order for the same sampler seed, for every split and batch-format option."""
    from hoformer.data.series import WindowBatches

    ref, dev = _ltsf(**kw), _ltsf(on_device=True, **kw)
    for split, train in (("train", True), ("val", False), ("test", False)):
        a, b = ref._loader(split, train), dev._loader(split, train)
        assert isinstance(b, WindowBatches) and len(a) == len(b)
        if train:  # what a task's per-epoch reseeding does
            a.sampler.generator = torch.Generator().manual_seed(5)
            b.sampler.generator = torch.Generator().manual_seed(5)
        batches = list(zip(a, b, strict=True))
        assert len(batches) == len(a)
        for x, y in batches:
            assert x.keys() == y.keys()
            for k in x:
                assert torch.equal(x[k], y[k]), (split, k)


def test_window_batches_are_gathered_where_the_windows_are():
    dm = _ltsf(on_device=True)
    w = dm.dataset("train").to("meta")
    batch = w.batch(torch.tensor([0, 3, 5]))
    assert all(v.device.type == "meta" for v in batch.values())
    assert batch["x"].shape == (3, 24, 7) and batch["mean"].shape == (3, 7)
    with pytest.raises(ValueError, match=r"LTSFDataModule: on_device=True .* got num_workers=2"):
        _ltsf(on_device=True, num_workers=2)


@pytest.mark.parametrize("fmt", ["ltsf", "ltsf_target_last", "traffic", "traffic_missing"])
def test_unscale_inverts_the_scaling_of_every_batch_format_in_float64(fmt):
    """``unscale(values, batch)`` gives the series back on its original scale for every batch format (LTSF ``(B, Q,
    C)``, one target channel ``(B, Q, 1)`` with ``y_known``, traffic ``(B, Q, N, C)`` with and without missing
    entries), for items collated by the DataLoader and batches gathered by ``SeriesWindows.batch`` alike, tensors and
    arrays alike, in float64 to rounding; ``StandardScaler.inverse_transform`` is the same function."""
    from torch.utils.data import default_collate

    from hoformer.data import unscale

    g = np.random.default_rng(0)
    shape = (200, 4) if fmt.startswith("ltsf") else (200, 5, 2)
    values = g.normal(3.0, 2.0, size=shape) * np.arange(1, shape[-1] + 1)  # channels of different scales
    mask = g.random(shape) > 0.2 if fmt == "traffic_missing" else None
    scaler = StandardScaler(0.0 if fmt.startswith("ltsf") else 1e-8).fit(values[:140],
                                                                         None if mask is None else mask[:140])
    target_last, label_len = fmt == "ltsf_target_last", 6 if fmt.startswith("ltsf") else 0
    w = SeriesWindows(torch.from_numpy(scaler.transform(values, mask)), np.arange(0, 150, 7), 24, 12, scaler.mean,
                      scaler.scale, mask=None if mask is None else torch.from_numpy(mask), label_len=label_len,
                      target_last=target_last)
    c = slice(-1, None) if target_last else slice(None)
    rows_p = w.starts[:, None] + np.arange(24)
    rows_q = w.starts[:, None] + 24 + np.arange(12)
    observed = np.ones(values.shape, bool) if mask is None else mask
    collated = default_collate([w[i] for i in range(len(w))])
    gathered = w.batch(torch.arange(len(w)))
    for batch in (collated, gathered):
        assert batch["y"].dtype == batch["mean"].dtype == batch["std"].dtype == torch.float64
        assert batch["mean"].shape == (len(w), 1 if target_last else shape[-1])
        got = unscale(batch["y"], batch)
        assert got.dtype == torch.float64 and got.shape == batch["y"].shape
        seen = observed[rows_q][..., c]
        np.testing.assert_allclose(got.numpy()[seen], values[rows_q][..., c][seen], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(unscale(batch["y"].numpy(), batch), got.numpy())  # an array: the same values
        if not target_last:  # the inputs have the target's channels
            seen = observed[rows_p]
            np.testing.assert_allclose(unscale(batch["x"], batch).numpy()[seen], values[rows_p][seen], rtol=1e-12,
                                       atol=1e-12)
        if label_len:
            rows_k = w.starts[:, None] + 24 - label_len + np.arange(label_len)
            np.testing.assert_allclose(unscale(batch["y_known"], batch).numpy(), values[rows_k][..., c], rtol=1e-12,
                                       atol=1e-12)
    for key in collated:
        assert torch.equal(collated[key], gathered[key]), key  # one gatherer: items and batches agree
    target = scaler.channels(c) if target_last else scaler
    np.testing.assert_array_equal(target.inverse_transform(gathered["y"][3]).numpy(),
                                  unscale(gathered["y"], gathered)[3].numpy())
    np.testing.assert_array_equal(target.inverse_transform(gathered["y"][3].numpy()),
                                  unscale(gathered["y"], gathered)[3].numpy())


def test_unscale_names_what_the_batch_lacks():
    from hoformer.data import unscale

    y = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"unscale: the batch must carry the scaler statistics 'mean' and 'std'.*"
                                         r"\['x', 'y'\]"):
        unscale(y, {"x": y, "y": y})
    with pytest.raises(ValueError, match=r"values \(2, 3, 4\), mean \(2, 3\), std \(2, 4\)"):
        unscale(y, {"mean": torch.zeros(2, 3), "std": torch.ones(2, 4)})
    with pytest.raises(ValueError, match=r"values \(4,\)"):
        unscale(torch.zeros(4), {"mean": torch.zeros(1, 4), "std": torch.ones(1, 4)})
    # float32 statistics keep float32 values float32 (the batches' format) and make bf16 values float32
    stats = {"mean": torch.full((2, 4), 1.5), "std": torch.full((2, 4), 2.0)}
    assert unscale(y, stats).dtype == torch.float32 and torch.equal(unscale(y, stats), torch.full_like(y, 1.5))
    assert unscale(y.bfloat16(), stats).dtype == torch.float32
