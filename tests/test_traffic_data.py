"""Traffic data protocol on a small synthetic METR-LA-format ``.h5`` + ``adj_mx.pkl`` and the real Los-loop CSV."""
from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from hoformer.data.traffic import (
    TrafficDataModule,
    load_adj_pkl,
    read_traffic_h5,
    split_windows,
    window_starts,
)

T, N = 300, 6


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
    with pytest.raises(ValueError, match="shorter"):
        window_starts(20, 12, 12)


def test_datamodule_protocol(tmp_path):
    values = _write(tmp_path)
    dm = TrafficDataModule("metr_la", root=str(tmp_path), batch_size=4, num_nodes=N)
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
    np.testing.assert_allclose(item["y"].numpy(), values[s + 12:s + 24, :, None], rtol=1e-6)
    assert item["y_mask"].dtype == torch.bool and item["time"].shape == (12, 2)
    assert item["time"][1, 0] - item["time"][0, 0] == 5 and item["time"][0, 1] == 3  # 2012-03-01 is a Thursday
    batch = next(iter(dm.test_dataloader()))
    assert batch["x"].shape == (4, 12, N, 1) and batch["mean"].shape == (4, 1)


def test_bad_files_give_clear_errors(tmp_path):
    values = np.full((T, N), 50.0)
    values[5, 2] = np.nan
    _write(tmp_path, values=values)
    with pytest.raises(ValueError, match="NaN"):
        TrafficDataModule("metr_la", root=str(tmp_path)).setup()
    _write(tmp_path, graph_ids=[str(i) for i in range(N + 1)])  # graph with one node more
    with pytest.raises(ValueError, match="sensors but the graph has"):
        TrafficDataModule("metr_la", root=str(tmp_path)).setup()
    _write(tmp_path)
    with pytest.raises(ValueError, match="num_nodes"):
        TrafficDataModule("metr_la", root=str(tmp_path), num_nodes=207).setup()
    _write(tmp_path, values=np.zeros((T, N)))  # all-missing data
    with pytest.raises(ValueError, match="no observed"):
        TrafficDataModule("metr_la", root=str(tmp_path)).setup()
    with pytest.raises(FileNotFoundError, match="pems-bay"):
        TrafficDataModule("pems_bay", root=str(tmp_path)).setup()
    with pytest.raises(ValueError, match="dataset"):
        TrafficDataModule("metr")


def test_reorders_columns_to_graph_order(tmp_path):
    ids = [str(i) for i in range(N)]
    values = _write(tmp_path, graph_ids=ids[::-1], ids=ids)
    dm = TrafficDataModule("metr_la", root=str(tmp_path))
    dm.setup()
    assert dm.sensor_ids == ids[::-1]
    np.testing.assert_allclose(dm.splits["train"].y[:, 0, 0].numpy(), values[:, -1].astype(np.float32))


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
    dm = TrafficDataModule("metr_la", root=str(tmp_path), batch_size=8)
    kw = {"num_nodes": N, "dim": 16, "num_heads": 4} if model_name == "weaver" else {"num_nodes": N}
    task = TrafficForecastingTask(model_name, kw, exp_gamma=0.9)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, dm)
    (res,) = trainer.test(task, dm, verbose=False)
    for k in ("test/mae", "test/mae@3", "test/mape@6", "test/rmse@12", "test/loss"):
        assert np.isfinite(res[k]), k
    assert res["test/loss"] == pytest.approx(res["test/mae"], rel=0.05)  # batch-mean vs pooled MAE
