"""Traffic data protocol on a small synthetic METR-LA-format ``.h5`` + ``adj_mx.pkl`` and the real Los-loop CSV;
reference checksums (the synthetic files are not the reference ones: ``verify=False``), safe unpickling, explicit
file paths and clear errors for bad cells."""
from __future__ import annotations

import pickle

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest
import torch

from hoformer.train import Optimization
from hoformer.models import create_model
from hoformer.data import ChecksumError, SchemaError
from hoformer.data.traffic import (
    TRAFFIC_SHA256,
    TrafficDataModule,
    load_los_loop,
    load_adj_pkl,
    read_traffic_h5,
)
from hoformer.data.series import split_windows, time_features, window_starts

from _trainer import quiet_trainer

T, N = 300, 6


def _series(ds) -> torch.Tensor:
    """The whole series ``(T, N, C)`` of a split on the original scale, missing readings 0 (the file's values)."""
    return torch.where(ds.mask, ds.data * ds.target_std + ds.target_mean, torch.zeros(()))


def _write(tmp_path, values=None, ids=None, graph_ids=None, name="metr-la.h5"):
    rng = np.random.default_rng(0)
    if values is None:
        values = rng.uniform(30, 70, size=(T, N)).astype(np.float64)
        values[rng.random(values.shape) < 0.1] = 0.0
        values[100:140] = 0.0  # an outage: every sensor missing for 40 steps
    ids = ids or [str(773869 + i) for i in range(values.shape[1])]
    idx = pd.date_range("2012-03-01 00:00:00", periods=len(values), freq="5min")
    pd.DataFrame(values, index=idx, columns=ids).to_hdf(tmp_path / name, key="df")  # DCRNN's format
    g = graph_ids or ids
    (tmp_path / "sensor_graph").mkdir(exist_ok=True)
    adj = np.eye(len(g), dtype=np.float32)
    with open(tmp_path / "sensor_graph" / "adj_mx.pkl", "wb") as f:
        pickle.dump((g, {s: i for i, s in enumerate(g)}, adj), f, protocol=2)
    return values


def test_readers(tmp_path):
    values = _write(tmp_path)
    v, stamps, ids = read_traffic_h5(tmp_path / "metr-la.h5")
    np.testing.assert_allclose(v, values.astype(np.float32))
    assert len(stamps) == T and ids[0] == "773869"
    g, g2i, adj = load_adj_pkl(tmp_path / "sensor_graph" / "adj_mx.pkl")
    assert g == ids and adj.shape == (N, N) and g2i[ids[2]] == 2


def test_split_and_windows():
    s = window_starts(100, 12, 12)
    assert len(s) == 77 and s[-1] + 24 == 100
    tr, va, te = split_windows(len(s))
    assert (len(tr), len(va), len(te)) == (54, 8, 15) and tr[-1] + 1 == va[0] and va[-1] + 1 == te[0]
    # DCRNN's generate_training_data.py: round the train and test sizes, validation takes the rest (n = 32 is where
    # rounding val instead gives 23 / 3 / 6); METR-LA / PEMS-BAY sample counts of the DCRNN paper
    for n, sizes in ((32, (22, 4, 6)), (34249, (23974, 3425, 6850)), (52093, (36465, 5209, 10419))):
        assert tuple(map(len, split_windows(n))) == sizes, n
    with pytest.raises(ValueError, match="shorter"):
        window_starts(20, 12, 12)
    for kw in ({"window": 0}, {"horizon": -2}, {"window": 2.5}):  # were: empty inputs x (0, N, 1) / a wrong error
        name, v = next(iter(kw.items()))
        with pytest.raises(ValueError, match=rf"window_starts: `{name}` must be an int >= 1 \(time steps\), got {v}"):
            window_starts(100, **{"window": 12, "horizon": 12, **kw})
        with pytest.raises(ValueError, match=rf"TrafficDataModule: `{name}` must be an int >= 1"):
            TrafficDataModule("metr_la", **kw)
    # torch-spatiotemporal's TemporalSplitter (its own test: 95 windows, window 3 -> 66 / 4 / 19)
    tr, va, te = split_windows(95, protocol="tsl", gap=3)
    assert (len(tr), len(va), len(te)) == (66, 4, 19) and (tr[-1], va[0], va[-1], te[0]) == (65, 69, 72, 76)
    with pytest.raises(ValueError, match="protocol"):
        split_windows(95, protocol="tsl2")
    with pytest.raises(ValueError, match="too few"):
        split_windows(30, protocol="tsl", gap=12)


def test_datamodule_tsl_split_protocol(tmp_path):
    """``split_protocol="tsl"``: the splits are TSL's TemporalSplitter windows (``window`` windows dropped before
    the validation and the test block) and the scaler sees the training windows' steps only."""
    values = _write(tmp_path)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, num_nodes=N, split_protocol="tsl",
                           drop_empty_windows=False)
    dm.setup()
    starts = window_starts(T, 12, 12)
    for name, idx in zip(("train", "val", "test"), split_windows(len(starts), protocol="tsl", gap=12)):
        np.testing.assert_array_equal(dm.splits[name].starts, starts[idx])
    assert dm.splits["val"].starts[0] - dm.splits["train"].starts[-1] == 13  # 12 windows dropped
    train = values[: dm.splits["train"].starts[-1] + 24]
    np.testing.assert_allclose(dm.scaler.mean, [train[train != 0].mean()], rtol=1e-5)
    with pytest.raises(ValueError, match="split_protocol"):
        TrafficDataModule("metr_la", root=str(tmp_path), split_protocol="random")


def test_datamodule_protocol(tmp_path):
    values = _write(tmp_path)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, batch_size=4, num_nodes=N)
    dm.setup()
    starts = window_starts(T, 12, 12)
    tr, va, te = split_windows(len(starts))
    # scaler: observed training values only (zeros excluded), steps covered by the training windows
    train = values[: starts[tr[-1]] + 24]
    obs = train[train != 0]
    np.testing.assert_allclose(dm.scaler.mean, [obs.mean()], rtol=1e-5)
    np.testing.assert_allclose(dm.scaler.std, [obs.std()], rtol=1e-5)
    # windows whose whole target lies in the outage are dropped; the others are kept in order
    empty = {int(s) for s in starts if not values[s + 12:s + 24].any()}
    assert empty and len(dm.splits["train"]) == sum(int(s) not in empty for s in starts[tr])
    item = dm.splits["train"][0]
    s = int(dm.splits["train"].starts[0])
    m = values[s:s + 12, :, None] != 0
    np.testing.assert_array_equal(item["mask"].numpy(), m)
    expect_x = np.where(m, (values[s:s + 12, :, None] - obs.mean()) / obs.std(), 0.0)
    np.testing.assert_allclose(item["x"].numpy(), expect_x, rtol=1e-4, atol=1e-5)
    # targets on the model's scale; the batch's statistics give the original readings back
    ym = values[s + 12:s + 24, :, None] != 0
    np.testing.assert_array_equal(item["y_mask"].numpy(), ym)
    np.testing.assert_allclose((item["y"] * item["std"] + item["mean"]).numpy()[ym], values[s + 12:s + 24, :, None][ym],
                               rtol=1e-5)
    assert item["y_mask"].dtype == torch.bool and item["time"].shape == (12, 2)
    assert item["time"][1, 0] - item["time"][0, 0] == 5 and item["time"][0, 1] == 3  # 2012-03-01 is a Thursday
    # integer features: a bf16-true run casts a batch's floating tensors (float32 minute 1435 became 1432)
    from lightning.pytorch.plugins.precision import HalfPrecision

    assert item["time"].dtype == torch.int16
    assert torch.equal(HalfPrecision("bf16-true").convert_input(item)["time"], item["time"])
    assert time_features(np.array(["2012-03-01T23:55"], dtype="datetime64[ns]"), encoding="daily").tolist() == [[1435, 3]]
    batch = next(iter(dm.test_dataloader()))
    assert batch["x"].shape == (4, 12, N, 1) and batch["mean"].shape == (4, 1)


def test_bad_files_give_clear_errors(tmp_path):
    values = np.full((T, N), 50.0)
    values[5, 2] = np.nan
    _write(tmp_path, values=values)
    with pytest.raises(ValueError, match="NaN"):
        TrafficDataModule("metr_la", root=str(tmp_path), verify=False).setup()
    _write(tmp_path, graph_ids=[str(i) for i in range(N + 1)])  # graph with one node more
    with pytest.raises(ValueError, match="sensors but the graph has"):
        TrafficDataModule("metr_la", root=str(tmp_path), verify=False).setup()
    _write(tmp_path)
    with pytest.raises(ValueError, match="num_nodes"):
        TrafficDataModule("metr_la", root=str(tmp_path), verify=False, num_nodes=207).setup()
    _write(tmp_path, values=np.zeros((T, N)))  # all-missing data
    with pytest.raises(ValueError, match="no observed"):
        TrafficDataModule("metr_la", root=str(tmp_path), verify=False).setup()
    with pytest.raises(FileNotFoundError, match="pems-bay"):
        TrafficDataModule("pems_bay", root=str(tmp_path)).setup()
    with pytest.raises(ValueError, match="dataset"):
        TrafficDataModule("metr")


def test_reorders_columns_to_graph_order(tmp_path):
    ids = [str(i) for i in range(N)]
    values = _write(tmp_path, graph_ids=ids[::-1], ids=ids)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False)
    dm.setup()
    assert dm.sensor_ids == ids[::-1]
    np.testing.assert_allclose(_series(dm.splits["train"])[:, 0, 0].numpy(), values[:, -1].astype(np.float32), rtol=1e-5)


def test_los_loop_real(data_root):
    dm = TrafficDataModule("los_loop", root=str(data_root / "traffic"), batch_size=8, num_nodes=207)
    dm.setup()
    assert dm.num_nodes == 207 and dm.adj.shape == (207, 207)
    n = len(window_starts(2016, 12, 12))
    assert sum(len(s) for s in dm.splits.values()) == n  # Los-loop has no missing values
    assert len(dm.splits["test"]) == round(0.2 * n)
    b = next(iter(dm.train_dataloader()))
    assert b["x"].shape == (8, 12, 207, 1) and b["mask"].all()


@pytest.mark.parametrize("model_name", ["weaver", "last_value"])
def test_training_task_fit_and_test(tmp_path, model_name):
    import lightning as L

    from hoformer.train.traffic import TrafficForecastingTask

    _write(tmp_path)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, batch_size=8)
    kw = {"num_nodes": N, "dim": 16, "num_heads": 4} if model_name == "weaver" else {"num_nodes": N}
    task = TrafficForecastingTask(create_model(model_name, **kw),
                                  optim=Optimization(optimizer="adam", weight_decay=0.0, schedule="exponential", gamma=0.9))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, dm)
    (res,) = trainer.test(task, dm, verbose=False)
    for k in ("test/mae", "test/mae@3", "test/mape@6", "test/rmse@12", "test/loss"):
        assert np.isfinite(res[k]), k
    assert res["test/loss"] == pytest.approx(res["test/mae"], rel=0.05)  # batch-mean vs pooled MAE


def _last_value_reference(values: np.ndarray, window: int = 12, horizon: int = 12):
    """Independent NumPy reference of the test protocol on the original scale from the raw ``(T, N)`` readings
    (0 = missing): chronological 70/10/20 windows, scaler mean of the observed training-span readings, the last
    observed history value per sensor (the mean if none was observed), pooled masked MAE / MAPE / RMSE over every
    observed target (all steps and steps 3 / 6 / 12; the loss is the pooled MAE too), and the number of test windows
    (windows with no observed target are dropped)."""
    v = values.astype(np.float64)
    starts = np.arange(len(v) - window - horizon + 1)  # every window start, written out (not window_starts)
    n = len(starts)
    n_train, n_test = round(0.7 * n), round(0.2 * n)  # DCRNN: train and test sizes rounded, validation the rest
    tr, te = np.arange(n_train), np.arange(n - n_test, n)
    span = v[: starts[tr[-1]] + window + horizon]
    mean = span[span != 0].mean()
    preds, ys = [], []
    for s in starts[te]:
        last = np.full(v.shape[1], mean)
        for row in v[s:s + window]:  # walk the history: the latest observed value wins
            last = np.where(row != 0, row, last)
        preds.append(np.repeat(last[None], horizon, axis=0))
        ys.append(v[s + window:s + window + horizon])
    pred, y = np.stack(preds), np.stack(ys)  # (W, Q, N)
    m = y != 0
    ref = {}
    for suffix, sl in (("", slice(None)), ("@3", 2), ("@6", 5), ("@12", 11)):
        pp, yy = pred[:, sl][m[:, sl]], y[:, sl][m[:, sl]]
        ref[f"test/mae{suffix}"] = np.abs(pp - yy).mean()
        ref[f"test/mape{suffix}"] = 100 * np.abs((pp - yy) / yy).mean()
        ref[f"test/rmse{suffix}"] = np.sqrt(((pp - yy) ** 2).mean())
    # the loss (the configs' checkpoint monitor) is the same pooled masked MAE, whatever the batches: a mean of
    # per-batch means (Lightning's default) would move with eval_batch_size when data is missing
    ref["test/loss"] = ref["test/mae"]
    keep = m.any(axis=(1, 2))  # windows with no observed target are dropped
    return ref, int(keep.sum()), mean


@pytest.mark.parametrize("source", ["synthetic", "los_loop"])
def test_traffic_task_test_metrics_match_numpy_reference(tmp_path, source, request):
    """TrafficForecastingTask's logged test metrics (Lightning test loop, last-value model) equal a NumPy reference
    computed on the original scale from the raw readings: catches a missing inverse scaling, a wrong horizon
    index, mean-of-means pooling or a mask applied to the wrong entries. The synthetic series has missing readings
    and an outage inside the test span (sensors whose whole history is missing are forecast by the scaler mean)."""
    import lightning as L

    from hoformer.train.traffic import TrafficForecastingTask

    if source == "synthetic":
        rng = np.random.default_rng(3)
        values = rng.uniform(30, 70, size=(T, N))
        values[rng.random(values.shape) < 0.1] = 0.0
        values[250:268, :2] = 0.0  # test-span outage of sensors 0, 1: no observed history for some windows
        values[262:280] = 0.0  # and of every sensor: windows with no observed target at all
        values = _write(tmp_path, values=values).astype(np.float32)  # as stored and read back (float32)
        ebs = 7  # 48 test windows with an observed target: a ragged last batch
        dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, batch_size=8, eval_batch_size=ebs,
                               num_nodes=N)
    else:
        root = request.getfixturevalue("data_root") / "traffic"
        values = pd.read_csv(root / "los_loop" / "los_speed.csv").to_numpy(np.float32)  # the raw table, not the loader
        ebs = 8  # 399 test windows
        dm = TrafficDataModule("los_loop", root=str(root), batch_size=8, eval_batch_size=ebs, num_nodes=207)
    ref, n_windows, mean = _last_value_reference(values)
    task = TrafficForecastingTask(create_model("last_value", **{"num_nodes": values.shape[1]}))
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    (res,) = trainer.test(task, dm, verbose=False)
    assert len(dm.splits["test"]) == n_windows and n_windows % ebs  # same windows, a ragged last batch
    np.testing.assert_allclose(dm.scaler.mean, [mean], rtol=1e-6)
    assert set(ref) <= set(res)
    for key, want in ref.items():
        assert res[key] == pytest.approx(want, rel=1e-5), key


# ------------------------------------------------------------------------------ Los-loop paths, checksums, cells
def _write_los(d, values=None, adj=None, speed_name="los_speed.csv", adj_name="los_adj.csv"):
    rng = np.random.default_rng(1)
    values = rng.uniform(20, 70, size=(T, N)).round(3) if values is None else values
    adj = np.eye(N) if adj is None else adj
    d.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(values, columns=[str(773869 + i) for i in range(N)]).to_csv(d / speed_name, index=False)
    pd.DataFrame(adj).to_csv(d / adj_name, index=False, header=False)
    return d / speed_name, d / adj_name, values


def test_los_loop_explicit_paths(tmp_path):
    """data_path / adj_path are the files read, whatever their names and folders (and each independently)."""
    speed, adj, values = _write_los(tmp_path / "a", speed_name="my_speed.csv", adj_name="unused.csv")
    adj2 = np.full((N, N), 0.5)
    _, adj_file, _ = _write_los(tmp_path / "b", adj=adj2, speed_name="unused.csv", adj_name="graph.csv")
    dm = TrafficDataModule("los_loop", root=str(tmp_path / "nowhere"), data_path=str(speed), adj_path=str(adj_file),
                           verify=False, num_nodes=N)
    dm.setup()
    np.testing.assert_allclose(_series(dm.splits["train"])[:, :, 0].numpy(), values.astype(np.float32), rtol=1e-5)
    np.testing.assert_allclose(dm.adj, adj2)
    # only the speeds overridden: the adjacency comes from root
    _write_los(tmp_path / "root" / "los_loop", adj=2 * np.eye(N))
    dm = TrafficDataModule("los_loop", root=str(tmp_path / "root"), data_path=str(speed), verify=False)
    dm.setup()
    np.testing.assert_allclose(dm.adj, 2 * np.eye(N))
    np.testing.assert_allclose(_series(dm.splits["test"])[:, :, 0].numpy(), values.astype(np.float32), rtol=1e-5)


def test_los_loop_real_explicit_paths_verified(data_root, tmp_path):
    """Renamed copies of the reference files pass the checksums; a modified one is caught, verify=False skips."""
    import shutil

    src = data_root / "traffic" / "los_loop"
    shutil.copy(src / "los_speed.csv", tmp_path / "speed.csv")
    shutil.copy(src / "los_adj.csv", tmp_path / "adj.csv")
    kw = dict(root=str(tmp_path / "nowhere"), data_path=str(tmp_path / "speed.csv"), adj_path=str(tmp_path / "adj.csv"))
    dm = TrafficDataModule("los_loop", **kw, num_nodes=207)
    dm.setup()
    assert dm.adj.shape == (207, 207) and _series(dm.splits["train"]).shape[1:] == (207, 1)
    lines = (tmp_path / "speed.csv").read_text().splitlines(keepends=True)
    first = lines[1].split(",")
    first[0] = str(float(first[0]) + 1.0)  # one reading changed: still a valid table, not the reference file
    lines[1] = ",".join(first)
    (tmp_path / "speed.csv").write_text("".join(lines))
    with pytest.raises(ChecksumError, match="speed.csv: sha256 checksum mismatch.*verify=False"):
        TrafficDataModule("los_loop", **kw).setup()
    dm = TrafficDataModule("los_loop", **kw, verify=False)
    dm.setup()
    assert _series(dm.splits["train"])[0, 0, 0].item() == pytest.approx(float(first[0]))


def test_adj_pickle_verified_before_unpickling(data_root, tmp_path):
    """adj_mx.pkl is checked against its reference SHA-256 *before* unpickling, and the unpickler never runs code."""
    import os
    import shutil

    ref = data_root / "traffic" / "sensor_graph" / "adj_mx.pkl"
    ids, _, adj = load_adj_pkl(ref, sha256=TRAFFIC_SHA256["adj_mx.pkl"])
    assert len(ids) == 207 and adj.shape == (207, 207) and adj.dtype == np.float32
    assert load_adj_pkl(data_root / "traffic" / "sensor_graph" / "adj_mx_bay.pkl",
                        sha256=TRAFFIC_SHA256["adj_mx_bay.pkl"])[2].shape == (325, 325)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    _write(tmp_path)  # metr-la.h5 + sensor_graph/adj_mx.pkl, the pickle then replaced by a code-running one
    evil = tmp_path / "sensor_graph" / "adj_mx.pkl"
    evil.write_bytes(pickle.dumps((["a"], {"a": 0}, Payload()), protocol=2))
    with pytest.raises(ChecksumError, match="adj_mx.pkl: sha256 checksum mismatch"):
        TrafficDataModule("metr_la", root=str(tmp_path)).setup()
    with pytest.raises(SchemaError, match=r"global (posix|os)\.mkdir is not allowed"):
        load_adj_pkl(evil)  # unverified: still no code execution
    assert not marker.exists()
    shutil.copy(ref, tmp_path / "copy.pkl")
    with open(tmp_path / "copy.pkl", "ab") as f:  # a corrupted copy that would still unpickle
        f.write(b"junk")
    with pytest.raises(ChecksumError, match="copy.pkl"):
        load_adj_pkl(tmp_path / "copy.pkl", sha256=TRAFFIC_SHA256["adj_mx.pkl"])
    assert load_adj_pkl(tmp_path / "copy.pkl")[2].shape == (207, 207)  # no digest given: skipped


def test_non_numeric_cells_give_schema_errors(tmp_path):
    speed, adj, values = _write_los(tmp_path / "los_loop")
    lines = speed.read_text().splitlines()
    lines[4] = lines[4].split(",", 1)[0] + ",abc," + lines[4].split(",", 2)[2]
    speed.write_text("\n".join(lines) + "\n")
    msg = r"los_speed.csv: column '773870' \(#2\) must be numeric, got 'abc' at line 5"
    with pytest.raises(SchemaError, match=msg):
        load_los_loop(tmp_path, verify=False)
    with pytest.raises(SchemaError, match="must be numeric"):
        TrafficDataModule("los_loop", root=str(tmp_path), verify=False).setup()
    _write_los(tmp_path / "los_loop")
    adj.write_text(adj.read_text().replace("1.0", "one", 1))
    with pytest.raises(SchemaError, match=r"los_adj.csv: column 0 \(#1\) must be numeric, got 'one' at line 1"):
        load_los_loop(tmp_path, verify=False)
    df = pd.DataFrame({"1": [1.0, 2.0], "2": ["3.0", "x"]}, index=pd.date_range("2012-03-01", periods=2, freq="5min"))
    df.to_hdf(tmp_path / "bad.h5", key="df")
    with pytest.raises(SchemaError, match="column '2'.*must be numeric, got 'x' at row 1"):
        read_traffic_h5(tmp_path / "bad.h5")


def _traffic_batch(tmp_path, n=8):
    from hoformer.data.traffic import TrafficDataModule

    _write(tmp_path)  # 10 % readings missing + an all-sensor outage
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, batch_size=n, num_nodes=N)
    dm.setup()
    ds = dm.splits["train"]
    # windows whose target is partly missing (the outage starts at step 100)
    idx = [i for i in range(len(ds)) if 0 < ds[i]["y_mask"].float().mean() < 0.9][:n]
    return dm, torch.utils.data.default_collate([ds[i] for i in idx])


def test_traffic_training_loss_is_masked_on_the_original_scale(tmp_path):
    """The training loss is the masked MAE over observed targets only (a missing reading is stored as 0 and must not
    be a target of 0 km/h), on the original scale."""
    from hoformer.train.metrics import masked_mae
    from hoformer.train.traffic import TrafficForecastingTask, forecast, original_scale

    _, batch = _traffic_batch(tmp_path)
    assert (~batch["y_mask"]).any() and batch["y_mask"].any()
    torch.manual_seed(0)
    task = TrafficForecastingTask(create_model("weaver", **{"num_nodes": N, "dim": 16, "num_heads": 4, "dropout": 0.0}))
    task.model.eval()
    loss = task.shared_step(batch, "train")
    with torch.no_grad():
        pred = forecast(task.model, batch)
    m, y = batch["y_mask"], original_scale(batch["y"], batch)
    want = (pred - y).abs()[m].mean()
    torch.testing.assert_close(loss.detach(), want)
    torch.testing.assert_close(loss.detach(), masked_mae(pred, y, m))
    assert not torch.allclose(loss.detach(), (pred - y).abs().mean())  # the unmasked MAE differs


def test_traffic_forecast_feeds_time_features_to_the_model(tmp_path):
    """``forecast(use_time=True)`` passes the batch's TOD/DOW features and the input mask to the model (Weaver's
    temporal encoding), ``use_time=False`` passes no time, and the output is mapped back to the original scale."""
    from hoformer.train.traffic import forecast

    _, batch = _traffic_batch(tmp_path)
    seen = []

    class Stub(torch.nn.Module):
        def forward(self, x, time=None, mask=None):
            seen.append((time, mask))
            return torch.ones_like(x)

    std, mean = batch["std"][:, None, None, :], batch["mean"][:, None, None, :]
    torch.testing.assert_close(forecast(Stub(), batch, use_time=True), torch.ones_like(batch["x"]) * std + mean)
    assert seen[-1][0] is batch["time"] and seen[-1][1] is batch["mask"]
    forecast(Stub(), batch, use_time=False)
    assert seen[-1][0] is None and seen[-1][1] is batch["mask"]


class _RecordLR(pl.Callback):
    def __init__(self):
        self.lrs = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append((trainer.current_epoch, trainer.optimizers[0].param_groups[0]["lr"]))


def test_traffic_exp_gamma_is_adam_with_l2_decayed_per_epoch(tmp_path):
    """``exp_gamma`` (Weaver section 6.1): Adam with ``weight_decay`` as L2 on every parameter, and the learning rate
    multiplied by gamma once per *epoch* (not per optimizer step)."""
    from hoformer.data.traffic import TrafficDataModule
    from hoformer.train.traffic import TrafficForecastingTask

    _write(tmp_path)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, batch_size=8, num_nodes=N)
    task = TrafficForecastingTask(create_model("weaver", **{"num_nodes": N, "dim": 16, "num_heads": 4}),
                                  optim=Optimization(lr=1e-3, weight_decay=0.01, optimizer="adam", schedule="exponential", gamma=0.5))
    rec = _RecordLR()
    trainer = quiet_trainer(tmp_path, max_epochs=3, limit_train_batches=3, limit_val_batches=0, callbacks=[rec])
    trainer.fit(task, dm)
    (opt,) = trainer.optimizers
    assert type(opt) is torch.optim.Adam
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01]
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == \
        sum(p.numel() for p in task.model.parameters())
    assert rec.lrs == [(e, pytest.approx(1e-3 * 0.5**e, rel=1e-12)) for e in range(3) for _ in range(3)]


def test_columns_reordered_by_a_non_involutive_permutation(tmp_path):
    """Data columns are put in graph order for any permutation (the existing test uses a reversal, which is its own
    inverse and so cannot tell the permutation from its inverse)."""
    from hoformer.data.traffic import TrafficDataModule

    ids = [str(i) for i in range(N)]
    graph_ids = ids[2:] + ids[:2]  # a rotation: not its own inverse
    values = _write(tmp_path, graph_ids=graph_ids, ids=ids)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), verify=False, drop_empty_windows=False)
    dm.setup()
    assert dm.sensor_ids == graph_ids
    y = _series(dm.splits["train"])[:, :, 0].numpy()  # (T, N) original-scale series, graph order
    for j, sid in enumerate(graph_ids):
        np.testing.assert_allclose(y[:, j], values[:, ids.index(sid)].astype(np.float32), rtol=1e-5, err_msg=sid)


def test_los_loop_time_features_are_five_minute_steps(tmp_path):
    """Los-loop has no timestamps: 5-minute steps from ``start`` (default 2012-03-01 00:00, a Thursday)."""
    from hoformer.data.traffic import TrafficDataModule

    _write_los(tmp_path / "los_loop")
    dm = TrafficDataModule("los_loop", root=str(tmp_path), verify=False, num_nodes=N, drop_empty_windows=False)
    dm.setup()
    tf = dm.splits["train"].time.numpy()  # (T, 2) minute of day, day of week
    steps = np.arange(T) * 5
    np.testing.assert_array_equal(tf[:, 0], steps % 1440)
    np.testing.assert_array_equal(tf[:, 1], (3 + steps // 1440) % 7)


def test_data_root_is_resolved_once_and_named(tmp_path, monkeypatch):
    """The traffic root comes from the shared data-root rule: a missing one is an error at construction that says
    how to fix it; with both files named no root is needed."""
    monkeypatch.delenv("HOFORMER_DATA", raising=False)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(FileNotFoundError, match="no data root for traffic dataset 'los_loop'.*HOFORMER_DATA"):
        TrafficDataModule("los_loop")
    with pytest.raises(FileNotFoundError, match=r"data root for traffic dataset 'metr_la' not found: .*nowhere"):
        TrafficDataModule("metr_la", root=str(tmp_path / "nowhere"))
    speed, adj, _ = _write_los(tmp_path / "files")
    dm = TrafficDataModule("los_loop", data_path=str(speed), adj_path=str(adj), verify=False, num_nodes=N)
    dm.setup()
    assert dm.root is None and len(dm.splits["test"]) > 0
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path))
    (tmp_path / "traffic").mkdir()
    assert TrafficDataModule("los_loop").root == tmp_path / "traffic"
