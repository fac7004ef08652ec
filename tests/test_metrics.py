"""Masked forecasting metrics vs a NumPy reference with missing values; DDP-style state merging."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hoformer.train.metrics import (MaskedMAE, MaskedMAPE, MaskedMSE, MaskedRMSE, PrefixAverage, forecasting_metrics,
                                    masked_mae)


def _data(seed=0, b=6, q=12, n=5):
    rng = np.random.default_rng(seed)
    y = rng.uniform(20, 70, size=(b, q, n, 1))
    y[rng.random(y.shape) < 0.2] = 0.0  # zeros = missing (METR-LA convention)
    pred = y + rng.normal(0, 5, size=y.shape)
    return pred, y, y != 0


def _np_ref(pred, y, mask, at=None):
    if at is not None:
        pred, y, mask = pred[:, at - 1], y[:, at - 1], mask[:, at - 1]
    p, t = pred[mask], y[mask]
    return {"mae": np.abs(p - t).mean(), "mape": 100 * np.abs((p - t) / t).mean(),
            "rmse": np.sqrt(((p - t) ** 2).mean())}


@pytest.mark.parametrize("at", [None, 3, 6, 12])
def test_masked_metrics_match_numpy_reference(at):
    pred, y, mask = _data()
    ref = _np_ref(pred, y, mask, at)
    for name, cls in (("mae", MaskedMAE), ("mape", MaskedMAPE), ("rmse", MaskedRMSE)):
        m = cls(at=at)
        for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):  # several batches = one pooled average
            m.update(*(torch.tensor(a[sl]) for a in (pred, y)), torch.tensor(mask[sl]))
        assert float(m.compute()) == pytest.approx(ref[name], rel=1e-5)


def test_collection_and_ddp_style_merge_equal_single_process():
    pred, y, mask = _data(1)
    t = [torch.tensor(a) for a in (pred, y, mask)]
    whole = forecasting_metrics()
    whole.update(*t)
    ranks = [forecasting_metrics() for _ in range(2)]
    ranks[0].update(*(a[:1] for a in t))  # unequal shards: a mean of means would be wrong
    ranks[1].update(*(a[1:] for a in t))
    for key, metric in ranks[0].items():
        metric.merge_state(ranks[1][key])  # the same "sum" reduction DDP applies to (total, count)
    merged, single = ranks[0].compute(), whole.compute()
    assert set(single) == {f"{m}{s}" for m in ("mae", "mape", "rmse") for s in ("", "@3", "@6", "@12")}
    for k in single:
        assert float(merged[k]) == pytest.approx(float(single[k]), rel=1e-6)
    assert float(single["mae@12"]) == pytest.approx(_np_ref(pred, y, mask, 12)["mae"], rel=1e-5)


def test_collection_never_merges_metrics_whose_first_batch_had_no_observed_target():
    """MAE, MAPE and RMSE share the state names ``(total, count)``: torchmetrics' compute groups would merge every
    metric whose states are equal after the first update (all ``(0, 0)`` when the first batch - e.g. Lightning's
    sanity check - has no observed target at a step) and report MAE's value as RMSE / MAPE for the whole run."""
    pred, y, mask = (torch.tensor(a) for a in _data(4))
    first = mask.clone()
    first[:, 2] = first[:, 5] = False  # an outage: nothing observed at steps 3 and 6 in the first batch
    coll = forecasting_metrics()
    for m in (first, mask, mask):
        coll.update(pred, y, m)
    got = coll.compute()
    for at in (3, 6):
        ref = _np_ref(*(np.concatenate([a.numpy()] * 2) for a in (pred, y, mask)), at)
        for name in ("mae", "mape", "rmse"):
            assert float(got[f"{name}@{at}"]) == pytest.approx(ref[name], rel=1e-5), (name, at)


def test_masked_mae_loss_and_all_missing_errors():
    pred, y, mask = (torch.tensor(a) for a in _data(2))
    assert float(masked_mae(pred, y, mask)) == pytest.approx(float((pred - y).abs()[mask].mean()))
    pred.requires_grad_(True)
    masked_mae(pred, y, mask).backward()
    assert pred.grad[~mask].eq(0).all()
    empty = torch.zeros_like(mask)
    with pytest.raises(ValueError, match="all-missing"):
        masked_mae(pred, y, empty)
    loss = masked_mae(pred, y, empty, allow_empty=True)  # the traffic task's no-sync form: 0, no gradient signal
    assert float(loss) == 0.0 and loss.requires_grad
    m = MaskedMAE()
    m.update(pred.detach(), y, empty)
    with pytest.raises(ValueError, match="all-missing"):
        m.compute()
    with pytest.raises(ValueError, match="mask"):
        MaskedRMSE().update(pred.detach(), y, mask.float())
    with pytest.raises(ValueError, match="at"):
        MaskedMAE(at=0)
    with pytest.raises(ValueError, match="horizon"):
        MaskedMAE(at=13).update(pred.detach(), y, mask)


def test_mape_excludes_near_zero_targets_even_when_marked_observed():
    """Eq 65 is undefined at y = 0: targets with |y| <= eps are left out of MAPE (numerator and count) even when the
    mask calls them observed (or there is no mask), while MAE / RMSE still score them."""
    pred, y, _ = _data(3)
    y[:, :, 0] = 0.0  # an observed zero reading (e.g. a stopped sensor), not a missing one
    y[0, 2, 1] = 1e-7
    mask = np.ones_like(y, dtype=bool)
    keep = np.abs(y) > 1e-5
    t = [torch.tensor(a) for a in (pred, y)]
    for at in (None, 3):
        sl = (slice(None),) if at is None else (slice(None), at - 1)
        p, yy, k = pred[sl], y[sl], keep[sl]
        want = 100 * np.abs((p[k] - yy[k]) / yy[k]).mean()
        for m in (torch.tensor(mask), None):
            metric = MaskedMAPE(at=at)
            metric.update(*t, m)
            assert float(metric.compute()) == pytest.approx(want, rel=1e-5)
        mae = MaskedMAE(at=at)
        mae.update(*t)
        assert float(mae.compute()) == pytest.approx(np.abs(p - yy).mean(), rel=1e-5)


@pytest.mark.parametrize("at", [None, 2])
def test_mape_excludes_masked_nonzero_targets(at):
    """The mask is honoured for non-zero targets too (the zero-target filter alone hid a mask-ignoring bug)."""
    g = torch.Generator().manual_seed(0)
    y = torch.rand(4, 3, 5, 1, generator=g, dtype=torch.float64) * 50 + 20      # no zeros at all
    pred = y + torch.randn(y.shape, generator=g, dtype=torch.float64)
    mask = torch.rand(y.shape, generator=g) > 0.3
    pred[~mask] = 1e6                                                # a masked entry must not count
    m = MaskedMAPE(at=at)
    m.update(pred, y, mask)
    sl = (slice(None),) if at is None else (slice(None), at - 1)
    p, t, k = pred[sl], y[sl], mask[sl]
    assert float(m.compute()) == pytest.approx(float(100 * ((p - t) / t).abs()[k].mean()), rel=1e-6)


@pytest.mark.parametrize("error,cls", [("mae", MaskedMAE), ("mse", MaskedMSE)])
def test_prefix_average_is_the_mean_of_the_prefix_metrics(error, cls):
    """Over uneven batches with missing targets: the mean over horizons of MaskedMAE(upto=h) (each prefix pooled
    over all windows), not a mean over batches or over steps."""
    g = torch.Generator().manual_seed(0)
    avg, each = PrefixAverage([2, 5, 9], error), [cls(upto=h) for h in (2, 5, 9)]
    for b in (3, 1, 4):
        pred, target = torch.randn(b, 9, 2, generator=g), torch.randn(b, 9, 2, generator=g)
        mask = torch.rand(b, 9, 2, generator=g) > 0.25
        avg.update(pred, target, mask)
        for m in each:
            m.update(pred, target, mask)
    ref = torch.stack([m.compute() for m in each]).mean()
    torch.testing.assert_close(avg.compute(), ref, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="shorter"):
        PrefixAverage([2, 12]).update(torch.zeros(1, 9, 2), torch.zeros(1, 9, 2))
    for bad in ([], [0, 3]):
        with pytest.raises(ValueError, match="horizons"):
            PrefixAverage(bad)
    with pytest.raises(ValueError, match="error"):
        PrefixAverage([2], "rmse")
    empty = PrefixAverage([2])
    empty.update(torch.zeros(1, 3, 1), torch.zeros(1, 3, 1), torch.zeros(1, 3, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="no observed target"):
        empty.compute()
