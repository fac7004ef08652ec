"""The causal HOT forecaster (``hot_causal_forecaster``): cached generation equals recomputed generation, teacher
forcing is causal and agrees with generation, any horizon, save / load, training through ForecastingTask, and
``hoformer forecast`` past the trained horizon.

Axis legend: ``b`` batch, ``t`` time patches, ``c`` variates, ``p`` steps per patch.
"""
from __future__ import annotations

import pytest
import torch

from hoformer.data import LTSFDataModule
from hoformer.models import create_model, from_pretrained
from hoformer.models.causal_forecaster import HOTCausalForecaster
from hoformer.train import ForecastingTask
from hoformer.inference import forecast_checkpoint, forecast_main, forecast_series

from _trainer import quiet_trainer

D64 = torch.float64
SMALL = dict(seq_len=24, pred_len=16, num_variates=3, dim=16, depth=2, num_heads=2, patch_size=4,
             train_positions="all")

#: every shared HOT setting off its default (they reach the causal forecaster through ``HOTModel``)
KNOBS = dict(qk_bias=True, qkv_bias=False, kronecker_pool="mean", mlp="swiglu", d_mlp=20, mlp_bias=False,
             rope_theta=500.0, attn_dropout=0.0)


def _model(dtype=D64, **kw):
    torch.manual_seed(0)
    return create_model("hot_causal_forecaster", **{**SMALL, **kw}).to(dtype).eval()


def _x(b=2, seq_len=24, c=3, dtype=D64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, seq_len, c, generator=g, dtype=dtype)


def _count_steps(model, monkeypatch) -> list:
    calls = []
    real = type(model.encoder).step

    def step(self, x, cache):
        calls.append(x.shape)
        return real(self, x, cache)

    monkeypatch.setattr(type(model.encoder), "step", step)
    return calls


# ------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("attention,knobs", [
    *((a, {}) for a in ["kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial",
                        "axial_sequential", "divided"]),
    ("kronecker_product", KNOBS)], ids=lambda v: v if isinstance(v, str) else ("shared-settings" if v else ""))
def test_cached_generation_equals_recomputing_the_causal_forward(attention, knobs, monkeypatch):
    """Inference (eval, no_grad) decodes with the encoder cache; with gradients it recomputes the causal forward of
    the whole prefix at every step. Both generate the same forecast (float64, 1e-10)."""
    model = _model(attention=attention, **knobs)
    x = _x()
    calls = _count_steps(model, monkeypatch)
    with torch.no_grad():
        cached = model(x, pred_len=18)  # 5 patches of 4, cropped to 18
    # the lookback fills the cache patch by patch (6), then every generated patch but the last is fed back (4)
    assert len(calls) == 6 + 4 and all(s == (2, 1, 3, 16) for s in calls)
    calls.clear()
    recomputed = model(x, pred_len=18)  # gradients enabled: no cache
    assert not calls and recomputed.requires_grad
    assert cached.shape == (2, 18, 3)
    torch.testing.assert_close(cached, recomputed.detach(), rtol=1e-10, atol=1e-10)
    # the reference written out: re-run the whole causal model on the growing series, one patch at a time
    mu, sd = x.mean(1, keepdim=True), torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)
    s = (x - mu) / sd
    with torch.no_grad():
        for _ in range(5):
            z = model.encoder(model._tokens(s))
            nxt = model.head(z[:, -1]).transpose(1, 2)  # (b, p, c): the last position's next patch
            s = torch.cat([s, nxt], 1)
    torch.testing.assert_close(cached, (s[:, 24:42] * sd + mu), rtol=1e-10, atol=1e-10)


def test_any_horizon_is_a_prefix_of_a_longer_one():
    model = _model()
    x = _x()
    with torch.no_grad():
        long = model(x, pred_len=37)
        assert model(x).shape == (2, 16, 3)  # the constructor's pred_len
        for h in (1, 3, 4, 9, 16):  # inside a patch, one patch, across patches
            torch.testing.assert_close(model(x, pred_len=h), long[:, :h], rtol=1e-10, atol=1e-10)
    assert long.shape == (2, 37, 3)
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="`pred_len` must be an int >= 1"):
            model(x, pred_len=bad)


# -------------------------------------------------------------------------------------------- training
def test_teacher_forced_predicts_every_next_patch_from_its_prefix():
    """Position ``i``'s prediction targets patch ``i + 1`` of ``[x; y]``; a partial last patch of ``y`` is dropped."""
    model = _model()
    x, y = _x(), _x(seq_len=18, seed=2)
    pred, target = model.teacher_forced(x, y)
    s = torch.cat([x, y], 1)
    n = (24 + 18) // 4  # 10 complete patches: 9 positions with a target
    assert pred.shape == target.shape == (2, (n - 1) * 4, 3)
    torch.testing.assert_close(target, s[:, 4 : n * 4], rtol=0, atol=0)


def test_teacher_forced_on_horizon_positions_only():
    """``train_positions="horizon"`` (the default): the same predictions from the last lookback patch on, the horizon
    as target."""
    x, y = _x(), _x(seq_len=18, seed=2)
    everywhere, _ = _model().teacher_forced(x, y)
    assert create_model("hot_causal_forecaster").train_positions == "horizon"
    pred, target = _model(train_positions="horizon").teacher_forced(x, y)
    assert pred.shape == target.shape == (2, 16, 3)  # 4 complete horizon patches of 18 steps
    torch.testing.assert_close(target, y[:, :16], rtol=0, atol=0)
    torch.testing.assert_close(pred, everywhere[:, 20:], rtol=0, atol=0)
    with pytest.raises(ValueError, match="`train_positions` must be 'horizon' or 'all'"):
        create_model("hot_causal_forecaster", train_positions="lookback")


@pytest.mark.parametrize("knobs", [{}, KNOBS], ids=["defaults", "shared-settings"])
def test_teacher_forced_is_causal(knobs):
    """The prediction of patch ``i + 1`` depends on the window's steps up to the end of patch ``i`` only: its gradient
    with respect to every later step is exactly zero (the window's scale is a constant of the lookback, detached as
    at inference), and perturbing the target after step ``j`` leaves every prediction made before ``j`` as it was."""
    model = _model(**knobs)
    x, y = _x().requires_grad_(), _x(seq_len=16, seed=2).requires_grad_()
    pred, _ = model.teacher_forced(x, y)
    p, n_pos = 4, pred.shape[1] // 4
    for i in range(n_pos):
        gx, gy = torch.autograd.grad(pred[:, i * p : (i + 1) * p].sum(), (x, y), retain_graph=True)
        g = torch.cat([gx, gy], 1).abs().sum((0, 2))
        assert (g[(i + 1) * p :] == 0).all(), f"position {i} sees the future"
        assert (g[i * p : (i + 1) * p] > 0).all(), f"position {i} ignores its own patch"
    with torch.no_grad():
        base, _ = model.teacher_forced(x, y)
        y2 = y.clone()
        y2[:, 9:] += 5 * torch.randn(2, 7, 3, dtype=D64)  # target steps 9.. = window steps 33.. (patch 8 on)
        moved, _ = model.teacher_forced(x, y2)
    torch.testing.assert_close(moved[:, : 8 * p], base[:, : 8 * p], rtol=0, atol=0)  # positions 0..7
    assert (moved[:, 8 * p :] - base[:, 8 * p :]).abs().amax() > 1e-3


def test_generation_continues_the_teacher_forced_predictions():
    """The first generated patch is the teacher-forced prediction at the last lookback position, and teacher forcing
    on ``[x; generated]`` reproduces every generated patch (the same causal function, one parallel forward)."""
    model = _model()
    x = _x()
    with torch.no_grad():
        gen = model(x)  # 16 steps = 4 patches
        first, _ = model.teacher_forced(x, torch.randn(2, 4, 3, dtype=D64))
        again, _ = model.teacher_forced(x, gen)
    torch.testing.assert_close(gen[:, :4], first[:, 5 * 4 :], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gen, again[:, 5 * 4 :], rtol=1e-10, atol=1e-10)


def test_scale_comes_from_the_lookback_and_forecasts_are_affine_equivariant():
    model = _model()
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(model(x + 7), model(x) + 7, rtol=1e-10, atol=1e-10)
        # scaling is exact up to the eps 1e-5 inside the standard deviation
        torch.testing.assert_close(model(3 * x), 3 * model(x), rtol=1e-4, atol=1e-4)
        # per-variate shift of the lookback and target together: predictions move with it
        shift = torch.tensor([1.0, -2.0, 5.0], dtype=D64)
        y = _x(seq_len=16, seed=2)
        (p0, t0), (p1, t1) = model.teacher_forced(x, y), model.teacher_forced(x + shift, y + shift)
    torch.testing.assert_close(p1, p0 + shift, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(t1, t0 + shift, rtol=1e-12, atol=1e-12)


def test_bad_inputs_name_the_argument():
    model = _model()
    x = _x()
    with pytest.raises(ValueError, match=r"expected `x` of shape \(B, 24, 3\)"):
        model(_x(seq_len=20))
    with pytest.raises(ValueError, match=r"teacher_forced: expected targets `y` of shape \(B, H, num_variates\)"):
        model.teacher_forced(x, _x(c=1))  # one target variate (features="MS"): not the model's own inputs
    with pytest.raises(ValueError, match="`y`"):
        model.teacher_forced(x, x[:, :0])
    with pytest.raises(ValueError, match="`seq_len`"):
        create_model("hot_causal_forecaster", seq_len=30, patch_size=4)
    with pytest.raises(ValueError, match="`attention` must be one of"):
        create_model("hot_causal_forecaster", attention="temporal")


def test_save_pretrained_round_trip_keeps_any_horizon(tmp_path):
    model = _model(dtype=torch.float32)
    model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    assert isinstance(loaded, HOTCausalForecaster) and loaded.config == model.config
    x = _x(dtype=torch.float32)
    with torch.no_grad():
        for h in (None, 7, 40):
            torch.testing.assert_close(loaded(x, pred_len=h), model(x, pred_len=h), rtol=0, atol=0)


def test_forecasting_task_trains_on_next_patch_prediction(tmp_path):
    """Through the normal datamodule and task: training steps call ``teacher_forced`` and lower its loss;
    validation generates the horizon with ``model(x)``."""
    dm = LTSFDataModule(synthetic=True, synthetic_length=600, seq_len=32, pred_len=16, batch_size=16)
    torch.manual_seed(0)
    model = create_model("hot_causal_forecaster", seq_len=32, pred_len=16, num_variates=7, dim=16, depth=1,
                         num_heads=2, patch_size=8, dropout=0.0)
    task = ForecastingTask(model, optim={"lr": 3e-3}, plot_variates=0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))

    def tf_loss():
        with torch.no_grad():
            pred, target = model.eval().teacher_forced(batch["x"], batch["y"])
        return torch.nn.functional.mse_loss(pred, target).item()

    before = tf_loss()
    seen = []
    real = model.teacher_forced
    model.teacher_forced = lambda x, y: seen.append(y.shape) or real(x, y)
    trainer = quiet_trainer(tmp_path, max_steps=40, limit_val_batches=2, num_sanity_val_steps=0, val_check_interval=20)
    trainer.fit(task, dm)
    del model.teacher_forced
    assert len(seen) == 40 and all(s[1:] == (16, 7) for s in seen)
    assert tf_loss() < 0.8 * before
    assert "val/mse" in trainer.callback_metrics


# -------------------------------------------------------------------------------------------- forecast
def _forecast(model, **kw):
    dm = LTSFDataModule(synthetic=True, seq_len=24, pred_len=16, num_variates=3, synthetic_length=300)
    dm.setup()
    return forecast_series(model, dm.scaler, dm.variate_names, dm.history(), **kw)


def test_forecast_series_any_horizon_for_the_causal_model_only():
    model = _model(dtype=torch.float32)
    default = _forecast(model)
    long = _forecast(model, horizon=50)
    assert len(default) == 16 and len(long) == 50 and list(long.columns) == list(default.columns)
    assert long["date"].is_monotonic_increasing
    torch.testing.assert_close(torch.tensor(long.iloc[:16, 1:].to_numpy()),
                               torch.tensor(default.iloc[:, 1:].to_numpy()), rtol=1e-6, atol=1e-6)
    direct = create_model("hot_forecaster", seq_len=24, pred_len=16, num_variates=3, dim=16, depth=1, num_heads=2)
    assert len(_forecast(direct, horizon=16)) == 16
    with pytest.raises(ValueError, match=r"`horizon`=50 but hot_forecaster forecasts the fixed horizon pred_len=16"):
        _forecast(direct, horizon=50)
    with pytest.raises(ValueError, match="`horizon` must be an int >= 1"):
        _forecast(model, horizon=0)


def test_hoformer_forecast_horizon_from_a_causal_checkpoint(tmp_path, capsys):
    model = _model(dtype=torch.float32)
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    data = dict(synthetic=True, seq_len=24, pred_len=16, num_variates=3, synthetic_length=300, batch_size=4)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_causal_forecaster", "model_kwargs": model.config["kwargs"]},
                "datamodule_hyper_parameters": {"_class_path": "hoformer.data.LTSFDataModule", **data}}, ckpt)
    out = tmp_path / "forecast.csv"
    assert forecast_main(["--checkpoint", str(ckpt), "--horizon", "40", "--output", str(out)]) == 0
    assert "hoformer forecast: 40 steps" in capsys.readouterr().out
    want = _forecast(model, horizon=40)
    got = forecast_checkpoint(ckpt, horizon=40)
    torch.testing.assert_close(torch.tensor(got.iloc[:, 1:].to_numpy()), torch.tensor(want.iloc[:, 1:].to_numpy()),
                               rtol=1e-6, atol=1e-6)
    assert len(__import__("pandas").read_csv(out)) == 40
