"""Options of the HOT models and of the forecasting task: the attention settings reachable from a config, the
reference forecaster's architecture options and preset, joint-horizon training, and the teacher-forcing hook."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hoformer.models import HoformerModel, create_model
from hoformer.train import ForecastingTask

from _trainer import quiet_trainer

F64 = torch.float64


# ------------------------------------------------------------------------------------------ teacher forcing
class _TeacherForced(HoformerModel):
    """A per-step linear map; ``teacher_forced`` predicts each target step from the previous one (its own training
    targets, of another shape than ``model(x)``'s).

    Args:
        seq_len: lookback.
        pred_len: horizon.
        num_variates: variates.
    """

    def __init__(self, seq_len: int = 8, pred_len: int = 4, num_variates: int = 2) -> None:
        super().__init__()
        self.record_config(locals())
        self.seq_len, self.pred_len, self.num_variates = seq_len, pred_len, num_variates
        self.lin = torch.nn.Linear(seq_len, pred_len)
        self.scale = torch.nn.Parameter(torch.tensor(0.5))
        self.calls: list[str] = []

    def forward(self, x):
        self.calls.append("forward")
        return self.lin(x.transpose(1, 2)).transpose(1, 2)

    def teacher_forced(self, x, y):
        self.calls.append("teacher_forced")
        seq = torch.cat([x, y], 1)  # (B, L + S, C)
        return self.scale * seq[:, :-1], seq[:, 1:]

    def example_inputs(self, batch_size: int = 2):
        return (torch.randn(batch_size, self.seq_len, self.num_variates),), {}


def _batch(b=3, seq_len=8, pred_len=4, c=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(b, seq_len, c, generator=g), "y": torch.randn(b, pred_len, c, generator=g)}


def test_teacher_forced_model_trains_on_its_own_targets_and_evaluates_with_forward():
    model = _TeacherForced()
    task = ForecastingTask(model, plot_variates=0)
    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        model.calls.clear()
        loss = task.training_step(batch, 0)
        assert model.calls == ["teacher_forced"]
        pred, target = model.teacher_forced(batch["x"], batch["y"])
        torch.testing.assert_close(loss, F.mse_loss(pred, target))
        loss.backward()
        assert model.scale.grad is not None and model.lin.weight.grad is None  # only teacher_forced's graph
        model.calls.clear()
        val = task.validation_step(batch, 0)
        assert model.calls == ["forward"]
        torch.testing.assert_close(val, F.mse_loss(model(batch["x"]), batch["y"]))


def test_teacher_forced_fit_and_test_run(tmp_path):
    data = [_batch(seed=s) for s in range(4)]
    loader = DataLoader(data, batch_size=None)
    task = ForecastingTask(_TeacherForced(), plot_variates=0)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(task, loader, loader)
    (res,) = trainer.test(task, loader, verbose=False)
    assert set(res) >= {"test/mse", "test/mae", "test/loss"}


def test_teacher_forced_rejects_masked_targets_and_mismatched_shapes():
    model = _TeacherForced()
    task = ForecastingTask(model, plot_variates=0)
    batch = _batch()
    with pytest.raises(ValueError, match="y_mask"):
        task.training_step({**batch, "y_mask": torch.ones_like(batch["y"], dtype=torch.bool)}, 0)
    model.teacher_forced = lambda x, y: (x, y)
    with pytest.raises(ValueError, match="teacher_forced.*different shapes"):
        task.training_step(batch, 0)


# -------------------------------------------------------------------------------- attention settings in configs
TINY = {
    "hot_forecaster": dict(seq_len=16, pred_len=8, num_variates=3, dim=16, num_heads=2, depth=1, patch_size=4),
    "hot_volume_classifier": dict(input_size=8, patch_size=4, dim=16, num_heads=2, depth=1),
    "hot_segmenter": dict(in_channels=2, num_classes=3, input_size=8, patch_size=4, dim=16, num_heads=2, depth=1),
}
KNOB_VALUES = {"qk_bias": True, "qkv_bias": False, "attn_dropout": 0.25, "rope_theta": 500.0, "num_features": 12,
               "redraw_interval": 3, "kronecker_pool": "mean"}


def _attn(model):
    return model.encoder.blocks[0].attn


@pytest.mark.parametrize("name", sorted(TINY))
def test_attention_settings_reach_the_kronecker_layer(name):
    from hoformer.layers import KroneckerAttention
    from hoformer.layers.blocks import SwiGLU

    linear = create_model(name, **TINY[name], attention="kronecker_linear",
                          **{k: v for k, v in KNOB_VALUES.items() if k != "qk_bias"}, mlp="swiglu")
    att = _attn(linear)
    assert isinstance(att, KroneckerAttention) and att.kernel == "linear"
    assert att.to_v.bias is None and att.to_out[0].bias is None  # qkv_bias=False
    assert att.attn_dropout == 0.25 and att.pool == "mean"
    assert att.favor.num_features == 12 and att.favor.redraw_interval == 3
    if att.rotary is not None:
        assert att.rotary.theta == 500.0
    assert isinstance(linear.encoder.blocks[0].mlp, SwiGLU)
    product = _attn(create_model(name, **TINY[name], qk_bias=True, rope_theta=500.0))
    assert product.qk_bias and all(lin.bias is not None for lin in product.to_qk)
    assert product.rotary is None or product.rotary.theta == 500.0
    x = create_model(name, **TINY[name]).example_inputs(2)[0][0]
    out = create_model(name, **TINY[name], qk_bias=True, kronecker_pool="mean", mlp="swiglu")(x)
    assert out.shape == linear(x).shape == create_model(name, **TINY[name])(x).shape


@pytest.mark.parametrize("name", sorted(TINY))
def test_attention_settings_reach_the_other_attentions(name):
    for attention in ("full", "axial", "divided"):
        att = _attn(create_model(name, **TINY[name], attention=attention, qkv_bias=False, attn_dropout=0.0,
                                 rope_theta=100.0))
        layers = [att.first, att.rest] if attention == "divided" else [att]
        for layer in layers:
            assert layer.attn_dropout == 0.0
            assert all(m.bias is None for m in layer.modules() if isinstance(m, torch.nn.Linear))


def test_only_changed_settings_reach_the_attention_builder(monkeypatch):
    """Defaults are not passed on (the layer's own defaults apply); changed values are, under the layer's names."""
    from hoformer.models import hot

    defaults = {k: default for k, (_, default) in hot.ATTENTION_KNOBS.items()}
    assert hot._attention_kwargs("m", "kronecker_product", defaults) == {}
    assert hot._attention_kwargs("m", "full", {**defaults, "rope_theta": 10000}) == {}  # an int equal to the default
    changed = {**defaults, "qkv_bias": False, "kronecker_pool": "mean"}
    assert hot._attention_kwargs("m", "kronecker_sum", changed) == {"bias": False, "pool": "mean"}
    seen = []
    real = hot.Encoder

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(hot, "Encoder", spy)
    create_model("hot_forecaster", **TINY["hot_forecaster"])
    assert not set(seen[-1]) & {"qk_bias", "bias", "attn_dropout", "rope_theta", "num_features", "redraw_interval",
                                "pool"}
    create_model("hot_forecaster", **TINY["hot_forecaster"], attn_dropout=0.3)
    assert seen[-1]["attn_dropout"] == 0.3


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("attention, arg, value", [
    ("full", "num_features", 8),
    ("axial", "qk_bias", True),
    ("divided", "kronecker_pool", "mean"),
    ("kronecker_product", "redraw_interval", 5),  # FAVOR+ settings need the linear kernel
    ("kronecker_sum", "num_features", 8),
])
def test_a_setting_the_attention_does_not_take_is_an_error(name, attention, arg, value):
    with pytest.raises(ValueError, match=rf"{name}: `{arg}={value!r}` does not apply to attention='{attention}'"):
        create_model(name, **TINY[name], attention=attention, **{arg: value})


def test_forecaster_one_mode_baselines_take_the_axial_settings():
    model = create_model("hot_forecaster", **TINY["hot_forecaster"], attention="temporal", qkv_bias=False)
    assert all(m.bias is None for m in _attn(model).modules() if isinstance(m, torch.nn.Linear))
    with pytest.raises(ValueError, match=r"`qk_bias=True` does not apply to attention='spatial' \(AxialAttention\)"):
        create_model("hot_forecaster", **TINY["hot_forecaster"], attention="spatial", qk_bias=True)
    with pytest.raises(TypeError, match="hot_forecaster: `qk_bias` must be a bool, got 'yes'"):
        create_model("hot_forecaster", **TINY["hot_forecaster"], qk_bias="yes")


def test_attention_settings_are_typed_config_arguments():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=HoformerModel)
    cfg = parser.parse_args(["--model", "hoformer.models.HOTVolumeClassifier", "--model.input_size", "8",
                             "--model.dim", "16", "--model.num_heads", "2", "--model.depth", "1",
                             "--model.kronecker_pool", "mean", "--model.qk_bias", "true", "--model.mlp", "swiglu"])
    model = parser.instantiate_classes(cfg).model
    assert _attn(model).pool == "mean" and _attn(model).qk_bias
    with pytest.raises(jsonargparse.ArgumentError):  # Literal choices are checked at parse time
        parser.parse_args(["--model", "hoformer.models.HOTSegmenter", "--model.kronecker_pool", "max"])


# ------------------------------------------------------------------------- reference forecaster options, preset
def _fc(**kw):
    torch.manual_seed(0)
    return create_model("hot_forecaster", **{**TINY["hot_forecaster"], "dropout": 0.0, **kw}).double().eval()


def _input_of(module, model, x):
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    return seen[0]


def test_embed_norm_and_the_mean_head_normalise_what_they_claim():
    x = torch.randn(2, 16, 3, dtype=F64)
    model = _fc(embed_norm=True, head="mean")
    for z in (_input_of(model.encoder, model, x), _input_of(model.head, model, x)):  # LayerNorm(1, 0) outputs
        torch.testing.assert_close(z.mean(-1), torch.zeros_like(z[..., 0]), atol=1e-10, rtol=0)
        torch.testing.assert_close(z.var(-1, unbiased=False), torch.ones_like(z[..., 0]), atol=1e-3, rtol=0)
    assert model.head.in_features == 16
    plain = _fc(head="flatten")
    assert not (_input_of(plain.encoder, plain, x).mean(-1).abs() < 1e-6).all()
    assert plain.embed_norm is None and plain.head_norm is None
    assert plain.head.in_features == 16 * 4  # flatten: every patch token, no norm


def test_revin_detach_false_lets_the_gradient_through_mean_and_std():
    """y(x + b) = y(x) + b per variate (per-window scaling), so with the statistics in the graph the gradient of the
    sum of variate 0's forecast along a constant shift of variate 0 is exactly pred_len, and 0 for the other variates;
    with detached statistics the gradient misses the path through the mean."""
    x = torch.randn(2, 16, 3, dtype=F64, requires_grad=True)
    grads = {}
    for detach in (True, False):
        model = _fc(revin_detach=detach)
        (g,) = torch.autograd.grad(model(x)[..., 0].sum(), x)
        grads[detach] = g.sum(1)  # (B, C): directional derivative along a shift of each variate
        out_shifted = model(x + torch.tensor([1.5, 0.0, 0.0], dtype=F64))
        torch.testing.assert_close(out_shifted[..., 0], model(x)[..., 0] + 1.5)  # the forward is the same
    torch.testing.assert_close(grads[False], torch.tensor([[8.0, 0, 0], [8.0, 0, 0]], dtype=F64), atol=1e-9, rtol=0)
    assert (grads[True][:, 0] - 8.0).abs().min() > 1e-3
    with pytest.raises(ValueError, match="revin_detach=False` needs `revin=True`"):
        _fc(revin=False, revin_detach=False)


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_d_mlp_and_mlp_bias_shape_the_feed_forward(mlp):
    model = _fc(mlp=mlp, d_mlp=24, mlp_bias=False)
    ff = model.encoder.blocks[0].mlp
    linears = [m for m in ff.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.bias is None for m in linears)
    assert linears[-1].in_features == 24  # the hidden (gated) width
    default = _fc(mlp=mlp).encoder.blocks[0].mlp
    hidden = [m for m in default.modules() if isinstance(m, torch.nn.Linear)][-1].in_features
    assert hidden == (64 if mlp == "gelu" else 42)  # int(16 * 4) and two thirds of it
    with pytest.raises(ValueError, match="`d_mlp` must be an int >= 1 or None"):
        _fc(d_mlp=0)


def test_swiglu_without_bias_is_the_gated_formula():
    from hoformer.layers.blocks import SwiGLU

    torch.manual_seed(0)
    ff = SwiGLU(6, 5, bias=False).double()
    x = torch.randn(3, 6, dtype=F64)
    w1, w3 = ff.w13.weight[:5], ff.w13.weight[5:]
    torch.testing.assert_close(ff(x), (F.silu(x @ w1.T) * (x @ w3.T)) @ ff.w2.weight.T)
    assert sum(p.numel() for p in ff.parameters()) == 3 * 6 * 5


def test_official_preset_turns_every_reference_option_on():
    model = create_model("hot_forecaster_official", **TINY["hot_forecaster"])
    kw = model.config["kwargs"]
    assert model.config["name"] == "hot_forecaster_official"
    assert (kw["embed_norm"], kw["head"], kw["revin_detach"], kw["mlp"], kw["mlp_bias"],
            kw["qk_bias"]) == (True, "mean", False, "swiglu", False, True)
    assert _attn(model).qk_bias and model.embed_norm is not None and model.head.in_features == 16
    assert model.head_norm is not None
    assert model(torch.randn(2, 16, 3)).shape == (2, 8, 3)
    # the same arguments given to the class directly are recognised as the preset
    from hoformer.models import HOTForecaster

    assert HOTForecaster(**TINY["hot_forecaster"], **{k: kw[k] for k in (
        "embed_norm", "head", "revin_detach", "mlp", "mlp_bias", "qk_bias")}).config == model.config
    with pytest.raises(ValueError, match="cannot take"):
        create_model("hot_forecaster_official", **TINY["hot_forecaster"], head="flatten")


# --------------------------------------------------------------------------------------- joint-horizon training
def test_joint_loss_is_the_average_of_the_prefix_losses():
    torch.manual_seed(0)
    model = create_model("hot_forecaster", **{**TINY["hot_forecaster"], "dropout": 0.0})
    batch = _batch(b=4, seq_len=16, pred_len=8, c=3)
    x, y = batch["x"], batch["y"]
    for loss_name, fn in (("mse", F.mse_loss), ("mae", F.l1_loss)):
        task = ForecastingTask(model, horizons=[2, 5, 8], loss=loss_name, plot_variates=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log without a trainer
            loss = task.training_step(batch, 0)
            pred = model(x)
            ref = sum(fn(pred[:, :h], y[:, :h]) for h in (2, 5, 8)) / 3
            torch.testing.assert_close(loss, ref)
            assert not torch.allclose(loss, fn(pred, y))  # not the plain loss over the 8 steps
            # a mask counts the observed entries of each prefix
            mask = torch.rand(y.shape, generator=torch.Generator().manual_seed(1)) > 0.3
            loss = task.training_step({**batch, "y_mask": mask}, 0)
            err = (pred - y).square() if loss_name == "mse" else (pred - y).abs()
            ref = sum((err[:, :h] * mask[:, :h]).sum() / mask[:, :h].sum() for h in (2, 5, 8)) / 3
            torch.testing.assert_close(loss, ref)


def test_per_prefix_test_metrics_equal_the_direct_ones(tmp_path):
    """test/mse@h etc. over uneven batches equal the metrics of the first h steps over all test windows, on the
    normalised and on the original scale; the whole-horizon metrics stay those of all steps."""
    from hoformer.data import LTSFDataModule

    dm = LTSFDataModule(synthetic=True, synthetic_length=700, seq_len=16, pred_len=8, batch_size=8, eval_batch_size=7)
    task = ForecastingTask(create_model("hot_forecaster", **{**TINY["hot_forecaster"], "num_variates": 7}),
                           horizons=[3, 8], original_scale=True, plot_variates=0)
    (res,) = quiet_trainer(tmp_path).test(task, dm, verbose=False)
    ds = dm.dataset("test")
    with torch.no_grad():
        x = torch.stack([ds[i]["x"] for i in range(len(ds))]).double()
        y = torch.stack([ds[i]["y"] for i in range(len(ds))]).double()
        p = task.model.eval().double()(x)
    po, yo = (torch.as_tensor(dm.scaler.inverse_transform(t.numpy())) for t in (p, y))
    for h in (3, 8):
        assert res[f"test/mse@{h}"] == pytest.approx((p - y)[:, :h].pow(2).mean().item(), rel=1e-5)
        assert res[f"test/mae@{h}"] == pytest.approx((p - y)[:, :h].abs().mean().item(), rel=1e-5)
        assert res[f"test/mse_orig@{h}"] == pytest.approx((po - yo)[:, :h].pow(2).mean().item(), rel=1e-4)
        assert res[f"test/mae_orig@{h}"] == pytest.approx((po - yo)[:, :h].abs().mean().item(), rel=1e-4)
    assert res["test/mse"] == pytest.approx((p - y).pow(2).mean().item(), rel=1e-5)
    assert res["test/mse_orig"] == pytest.approx((po - yo).pow(2).mean().item(), rel=1e-4)
    ref_loss = sum((p - y)[:, :h].pow(2).mean() for h in (3, 8)) / 2
    assert res["test/loss"] == pytest.approx(ref_loss.item(), rel=1e-4)
    assert res["test/mse@3"] != pytest.approx(res["test/mse"], rel=1e-3)
    for m in ("mse", "mae"):  # the mean over the horizons of the prefix metrics (the HOT protocol's selection)
        assert res[f"test/{m}_mean"] == pytest.approx((res[f"test/{m}@3"] + res[f"test/{m}@8"]) / 2, rel=1e-6)


def test_hot_protocol_selects_on_the_mean_prefix_mae_of_one_longest_horizon_model(tmp_path):
    """protocol="hot": the four LTSF horizons by default, the checkpoint selected on val/mae_mean, and a model whose
    horizon is not the longest of them refused (its validation windows would not be the protocol's)."""
    from hoformer.train.tasks import HOT_HORIZONS

    model = create_model("hot_forecaster", **TINY["hot_forecaster"])  # an 8-step model
    task = ForecastingTask(model, protocol="hot", plot_variates=0)
    assert task.hparams.horizons == list(HOT_HORIZONS) == [96, 192, 336, 720]
    assert task.selection == ("val/mae_mean", "min") and ForecastingTask(model).selection == ("val/mae", "min")
    with pytest.raises(ValueError, match="`protocol` must be one of"):
        ForecastingTask(model, protocol="TSLib")
    task = ForecastingTask(model, protocol="hot", horizons=[2, 4], plot_variates=0)
    with pytest.raises(ValueError, match=r"protocol='hot'.*must be 4; the model forecasts 8 steps"):
        task.training_step(_batch(seq_len=16, pred_len=8, c=3), 0)
    from hoformer.data import LTSFDataModule

    dm = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=16, pred_len=8, batch_size=16)
    task = ForecastingTask(create_model("hot_forecaster", **{**TINY["hot_forecaster"], "num_variates": 7}),
                           protocol="hot", horizons=[4, 8], plot_variates=0)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=3)
    trainer.fit(task, dm)
    logged = trainer.callback_metrics
    assert float(logged["val/mae_mean"]) == pytest.approx((float(logged["val/mae@4"]) + float(logged["val/mae@8"])) / 2,
                                                          rel=1e-6)


def test_joint_horizons_are_checked():
    model = create_model("hot_forecaster", **TINY["hot_forecaster"])
    for bad in ([], [8, 4], [4, 4], [0, 8], [2.5]):
        with pytest.raises(ValueError, match="`horizons` must be a non-empty increasing list"):
            ForecastingTask(model, horizons=bad)
    task = ForecastingTask(model, horizons=[4, 16], plot_variates=0)
    with pytest.raises(ValueError, match=r"`horizons` \[4, 16\] reach step 16 but the model forecasts 8 steps"):
        task.training_step(_batch(seq_len=16, pred_len=8, c=3), 0)


def test_teacher_forced_training_with_joint_horizon_evaluation():
    """A teacher-forced model trains on its own targets; validation scores model(x) on every prefix."""
    model = _TeacherForced()
    task = ForecastingTask(model, horizons=[2, 4], plot_variates=0)
    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred, target = model.teacher_forced(batch["x"], batch["y"])
        torch.testing.assert_close(task.training_step(batch, 0), F.mse_loss(pred, target))
        out = model(batch["x"])
        ref = (F.mse_loss(out[:, :2], batch["y"][:, :2]) + F.mse_loss(out, batch["y"])) / 2
        torch.testing.assert_close(task.validation_step(batch, 0), ref)


# ---------------------------------------------------------------------------------------------- prefix metrics
def test_masked_metrics_over_the_first_steps():
    from hoformer.train.metrics import MaskedMAE, MaskedMSE, MaskedRMSE

    g = torch.Generator().manual_seed(0)
    pred, y = torch.randn(5, 6, 2, generator=g), torch.randn(5, 6, 2, generator=g)
    mask = torch.rand(5, 6, 2, generator=g) > 0.4
    e, m = (pred - y).double()[:, :4], mask[:, :4]
    for cls, ref in ((MaskedMSE, (e.square() * m).sum() / m.sum()), (MaskedMAE, (e.abs() * m).sum() / m.sum()),
                     (MaskedRMSE, ((e.square() * m).sum() / m.sum()).sqrt())):
        metric = cls(upto=4)
        metric.update(pred[:2], y[:2], mask[:2])
        metric.update(pred[2:], y[2:], mask[2:])
        torch.testing.assert_close(metric.compute(), ref.float())
    full = MaskedMSE(upto=6)
    full.update(pred, y)
    torch.testing.assert_close(full.compute(), (pred - y).square().mean())
    with pytest.raises(ValueError, match="give `at` .* or `upto`"):
        MaskedMSE(at=1, upto=2)
    with pytest.raises(ValueError, match="`upto` must be a number of horizon steps"):
        MaskedMAE(upto=0)
    with pytest.raises(ValueError, match="upto=7 but the horizon"):
        MaskedMAE(upto=7).update(pred, y)
