"""Analysis: attention-map recorder, stable-rank callback vs dense SVD, FLOP formulas vs FlopCounterMode,
``hoformer analyze`` / ``hoformer bench --quick`` outputs and their error messages."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hoformer.analysis import (
    attention_flops,
    attention_maps,
    attention_stable_ranks,
    analyze_checkpoint,
    analyze_main,
    bench_main,
    count_flops,
    cpu_peak_memory,
    fit_exponent,
    StableRankCallback,
)
from hoformer.analysis.maps import recording
from hoformer.functional import kron_apply, kron_dense, kron_sum_apply, kron_sum_dense
from hoformer.layers import build_attention
from hoformer.models import create_model, from_pretrained


def _svd_sr(a: torch.Tensor) -> torch.Tensor:
    s = torch.linalg.svdvals(a.double())
    return s.pow(2).sum(-1) / s[..., 0] ** 2


# ------------------------------------------------------------------------------------------ recorder / maps
@pytest.mark.parametrize("combine", ["product", "sum"])
def test_recorded_factors_reproduce_layer_output(combine):
    layer = build_attention(f"kronecker_{combine}", 16, 2, num_modes=3).double().eval()
    x = torch.randn(2, 3, 4, 5, 16, dtype=torch.float64)
    (rec,) = attention_maps(layer, x)
    assert rec.kind == "kronecker" and rec.combine == combine
    assert [tuple(f.shape) for f in rec.maps] == [(2, 2, 3, 3), (2, 2, 4, 4), (2, 2, 5, 5)]
    v = layer.to_v(x).view(2, 3, 4, 5, 2, 8).movedim(-2, 1)  # (b, h, n1, n2, n3, e)
    apply = kron_apply if combine == "product" else kron_sum_apply
    y = layer.to_out(apply(rec.maps, v).movedim(1, -2).reshape(2, 3, 4, 5, 16))
    torch.testing.assert_close(y, layer(x))
    # and through the dense (prod N x prod N) matrix, the naive reference
    dense = kron_dense(rec.maps) if combine == "product" else kron_sum_dense(rec.maps, normalize=True)
    yd = torch.einsum("bhij,bhjd->bhid", dense, v.reshape(2, 2, 60, 8)).view(2, 2, 3, 4, 5, 8)
    torch.testing.assert_close(layer.to_out(yd.movedim(1, -2).reshape(2, 3, 4, 5, 16)), layer(x))


def test_recording_does_not_change_outputs_and_model_level_maps():
    model = create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=2, num_heads=2,
                         patch_size=4).eval()
    x = torch.randn(2, 16, 3)
    ref = model(x)
    recs = attention_maps(model, x)
    assert [r.name for r in recs] == ["encoder.blocks.0.attn", "encoder.blocks.1.attn"]
    assert [tuple(m.shape) for m in recs[0].maps] == [(2, 2, 3, 3), (2, 2, 4, 4)]
    torch.testing.assert_close(model(x), ref)
    assert all(not m._sinks for m in model.modules() if hasattr(m, "_sinks"))


def test_attention_maps_of_weaver_and_hoba_models():
    w = create_model("weaver", num_nodes=5, window=4, horizon=4, dim=16, num_heads=2).eval()
    args, kwargs = w.example_inputs(2)
    (rec,) = attention_maps(w, *args, **kwargs)
    assert rec.kind == "kronecker" and [tuple(m.shape) for m in rec.maps] == [(2, 2, 4, 4), (2, 2, 5, 5)]
    assert all(not m._sinks for m in w.modules() if hasattr(m, "_sinks"))  # recording switched off again
    h = create_model("hoba_classifier").eval()
    args, kwargs = h.example_inputs(2)
    recs = attention_maps(h, *args, **kwargs)
    assert recs and recs[0].kind == "triplet" and recs[0].maps[0].ndim == 6


def test_attention_maps_rejects_models_without_attention():
    with pytest.raises(ValueError, match="recorded no attention maps"):
        attention_maps(torch.nn.Linear(3, 3), torch.randn(2, 3))
    with pytest.raises(TypeError, match="nn.Module"):
        attention_maps(lambda x: x, torch.randn(2))


# ---------------------------------------------------------------------------------------------- stable ranks
def test_callback_stable_ranks_match_dense_svd():
    layer = build_attention("kronecker_product", 16, 2, num_modes=2).double().eval()
    full = build_attention("full", 16, 2).double().eval()
    x = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    recs = attention_maps(layer, x) + attention_maps(full, x)
    got = attention_stable_ranks(recs, per_layer=True, full_max_tokens=64)
    fs = recs[0].maps
    assert got["mode0"] == pytest.approx(float(_svd_sr(fs[0]).mean()), rel=1e-9)
    assert got["mode1"] == pytest.approx(float(_svd_sr(fs[1]).mean()), rel=1e-9)
    assert got["product"] == pytest.approx(float(_svd_sr(kron_dense(fs)).mean()), rel=1e-9)
    assert got["sum"] == pytest.approx(float(_svd_sr(kron_sum_dense(fs)).mean()), rel=1e-6)
    assert got["full"] == pytest.approx(float(_svd_sr(recs[1].maps[0]).mean()), rel=1e-9)
    assert attention_stable_ranks(recs, full_max_tokens=10).keys() == {"mode0", "mode1", "product", "sum"}


def test_stable_rank_callback_logs_to_csv(tmp_path):
    import lightning.pytorch as pl
    import pandas as pd
    from lightning.pytorch.loggers import CSVLogger

    from hoformer.data import LTSFDataModule
    from hoformer.train import ForecastingTask

    dm = LTSFDataModule(synthetic=True, seq_len=16, pred_len=8, num_variates=3, synthetic_length=300, batch_size=8)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1,
                                                  num_heads=2, patch_size=4, attention="kronecker_sum")))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                         logger=CSVLogger(tmp_path, name="logs"), enable_checkpointing=False,
                         callbacks=[StableRankCallback(train_every_n_steps=1, num_batches=1)],
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(task, datamodule=dm)
    df = pd.read_csv(next(tmp_path.rglob("metrics.csv")))
    for key in ("train/sr/mode0", "train/sr/sum", "val/sr/mode1", "val/sr/product", "val/sr/sum"):
        assert df[key].notna().any(), key
    # Kronecker sum keeps a higher stable rank than its factors (HOT section 4.2)
    assert df["val/sr/sum"].dropna().iloc[-1] >= df["val/sr/mode0"].dropna().iloc[-1]


def test_stable_rank_callback_validates_arguments():
    with pytest.raises(ValueError, match="every_n_epochs"):
        StableRankCallback(every_n_epochs=0)
    with pytest.raises(ValueError, match="train_every_n_steps"):
        StableRankCallback(train_every_n_steps=-1)


# ---------------------------------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("kind", ["kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial",
                                  "axial_sequential", "divided"])
def test_attention_flops_match_flop_counter(kind):
    layer = build_attention(kind, 32, 4).eval()
    x = torch.randn(2, 3, 5, 6, 32)
    got = attention_flops(kind, (3, 5, 6), 32, 4, batch=2)
    assert got["total"] == count_flops(layer, x)  # every matmul counted exactly, none missed or doubled
    assert got["total"] == got["projections"] + got["scores"] + got["apply"]
    assert attention_flops(kind, (3, 5, 6), 32, 4, batch=2, projections=False)["total"] == got["scores"] + got["apply"]


def test_linear_attention_flops_follow_the_kernels_route():
    """kronecker_linear forms short modes' factors and applies long ones by associativity: a (40, 3) input mixes the
    two routes (40 x 3 x 8-dim heads, 16 features: mode 0 associative, mode 1 formed) and the count follows both."""
    from hoformer.functional.kronecker import forms_linear_factor

    assert not forms_linear_factor(40, 16, 3 * 8) and forms_linear_factor(3, 16, 40 * 8)
    for sizes in ((40, 3), (3, 40), (40,), (3, 5, 6)):
        layer, x = build_attention("kronecker_linear", 32, 4).eval(), torch.randn(2, *sizes, 32)
        assert attention_flops("kronecker_linear", sizes, 32, 4, batch=2)["total"] == count_flops(layer, x), sizes


@pytest.mark.parametrize("name,kind,kw", [("hoba", "hoba", {}), ("block2d", "block2d", {}), ("full2d", "full2d", {}),
                                          ("triplet_full", "triplet", {"block_size": None})])
def test_text_attention_flops_match_flop_counter(name, kind, kw):
    from hoformer.layers import build_text_attention

    layer = build_text_attention(name, 32, 4, block_size=16).eval()
    x = torch.randn(2, 40, 32)
    got = attention_flops(kind, (40,), 32, 4, batch=2, **{"block_size": 16, **kw})["total"]
    assert got == count_flops(layer, x)


def test_weaver_p2kmv_flops_match_flop_counter():
    from hoformer.functional.weaver import p2_kmv, valence_attention

    qt, qs, u = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 6, 9, 8)
    ref = count_flops(lambda: p2_kmv(valence_attention(qt, qt), valence_attention(qs, qs), u))
    assert attention_flops("weaver_p2kmv", (6, 9), 32, 4, batch=2, projections=False)["total"] == ref


def test_attention_flops_scaling_and_errors():
    # product / sum: O(N sum N_i); full: O(N^2): doubling every mode of a 3-mode cube
    a = [attention_flops("kronecker_product", (n,) * 3, 64, 4, projections=False)["total"] for n in (8, 16)]
    f = [attention_flops("full", (n,) * 3, 64, 4, projections=False)["total"] for n in (8, 16)]
    assert fit_exponent([512, 4096], a) == pytest.approx(4 / 3, abs=0.02)
    assert fit_exponent([512, 4096], f) == pytest.approx(2.0, abs=1e-9)
    with pytest.raises(ValueError, match="kind"):
        attention_flops("nope", (4,), 8, 2)
    with pytest.raises(ValueError, match="sizes"):
        attention_flops("full", (0, 3), 8, 2)


def test_cpu_peak_memory_sees_allocations():
    peak = cpu_peak_memory(lambda: torch.ones(1_000_000).add_(1).sum())
    assert 4_000_000 <= peak < 8_100_000


# ------------------------------------------------------------------------------------------------ commands
def test_bench_quick_writes_csv_and_pngs(tmp_path, capsys):
    import pandas as pd

    assert bench_main(["--quick", "--output", str(tmp_path), "--threads", "1"]) == 0
    df = pd.read_csv(tmp_path / "bench.csv")
    assert {"kronecker_product", "kronecker_sum", "full"} <= set(df.attention)
    assert (df.time_fwd_ms > 0).all() and (df.mem_fwdbwd_mb > 0).all()
    assert ((df.gflops_counted - df.gflops).abs() <= 0.05 * df.gflops).all()
    summary = pd.read_csv(tmp_path / "bench_summary.csv").set_index("attention")
    assert summary.loc["full", "exp_flops"] > 1.8 and summary.loc["kronecker_product", "exp_flops"] < 1.4
    ana = pd.read_csv(tmp_path / "bench_flops_3d.csv")
    assert ana.input_side.max() == 224
    for png in ("bench_time_fwd_ms.png", "bench_time_fwdbwd_ms.png", "bench_mem_fwdbwd_mb.png",
                "bench_flops_3d.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert "growth exponents" in capsys.readouterr().out


_DATA = dict(synthetic=True, seq_len=16, pred_len=8, num_variates=3, synthetic_length=300, batch_size=4)
_MODEL = dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=2, num_heads=2, patch_size=4)


def _ckpt(tmp_path, **kw):
    model = create_model("hot_forecaster", **{**_MODEL, **kw})
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": {**_MODEL, **kw}},
                "datamodule_hyper_parameters": {"_class_path": "hoformer.data.LTSFDataModule", **_DATA}}, path)
    return path, model


def test_analyze_writes_figures_from_ckpt_and_pretrained(tmp_path):
    ckpt, model = _ckpt(tmp_path)
    logs = tmp_path / "run" / "logs" / "version_0"
    logs.mkdir(parents=True)
    (logs / "metrics.csv").write_text("epoch,step,val/sr/mode0,val/sr/sum,val/loss\n"
                                      "0,9,1.5,3.0,0.4\n1,19,1.6,3.2,0.3\n")
    files = analyze_checkpoint(ckpt, tmp_path / "fig", split="val")
    names = sorted(f.name for f in files)
    assert names == ["attention_00_encoder_blocks_0_attn.png", "attention_01_encoder_blocks_1_attn.png",
                     "forecast.png", "stable_rank.png"]
    assert all(f.stat().st_size > 1000 for f in files)
    model.save_pretrained(tmp_path / "pre")
    assert analyze_main(["--checkpoint", str(tmp_path / "pre"), "--data", "hoformer.data.LTSFDataModule",
                         "--data-args", json.dumps(_DATA), "--output", str(tmp_path / "fig2")]) == 0
    assert (tmp_path / "fig2" / "attention_00_encoder_blocks_0_attn.png").stat().st_size > 1000


class ToyDM:
    """Minimal datamodule (dict batches) for the HOBA and Weaver analyses; built by class path like real ones."""

    def __init__(self, kind: str = "hoba") -> None:
        g = torch.Generator().manual_seed(0)
        if kind == "hoba":
            ids = torch.randint(1, 50, (4, 40), generator=g)
            self.items = [{"ids": i, "mask": torch.ones(40, dtype=torch.bool), "label": 0} for i in ids]
        else:
            self.items = [{"x": torch.randn(4, 5, 1, generator=g), "mask": torch.ones(4, 5, 1, dtype=torch.bool),
                           "time": torch.tensor([[480.0 + 5 * t, 2.0] for t in range(4)]),
                           "y": torch.randn(4, 5, 1, generator=g), "mean": torch.tensor([50.0]),
                           "std": torch.tensor([10.0])} for _ in range(4)]

    def test_dataloader(self):
        return torch.utils.data.DataLoader(self.items, batch_size=4)


def test_analyze_hoba_slice_and_weaver_signed_maps(tmp_path):
    create_model("hoba_classifier", vocab_size=50, max_len=40, dim=16, depth=1, num_heads=2).save_pretrained(
        tmp_path / "hoba")
    files = analyze_checkpoint(tmp_path / "hoba", tmp_path / "fig", data=f"{__name__}.ToyDM", token=5)
    assert "hoba_slice_00.png" in {f.name for f in files}
    create_model("weaver", num_nodes=5, window=4, horizon=4, dim=16, num_heads=2).save_pretrained(tmp_path / "w")
    files = analyze_checkpoint(tmp_path / "w", tmp_path / "figw", data=f"{__name__}.ToyDM",
                               data_args={"kind": "weaver"})
    names = {f.name for f in files}
    assert {"attention_00_attention.png", "weaver_sensor_00.png", "weaver_time_step_00.png", "forecast.png"} <= names
    assert all(f.stat().st_size > 1000 for f in files)


def test_plot_functions_validate_inputs(tmp_path):
    from hoformer.analysis import plot_mode_maps, plot_signed_maps, plot_triplet_slice

    with pytest.raises(ValueError, match="token"):
        plot_triplet_slice(torch.rand(2, 4, 4, 4), tmp_path / "a.png", token=4)
    with pytest.raises(ValueError, match="maps"):
        plot_signed_maps(torch.rand(2, 3, 4, 4), tmp_path / "b.png")
    with pytest.raises(ValueError, match="maps"):
        plot_mode_maps([torch.rand(2, 3, 4, 4)], tmp_path / "c.png")


def test_analyze_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        analyze_checkpoint(tmp_path / "missing.ckpt", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a save_pretrained folder"):
        analyze_checkpoint(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="cannot read"):
        analyze_checkpoint(tmp_path / "junk.ckpt", tmp_path / "out")
    ckpt, _ = _ckpt(tmp_path, num_variates=5)  # data has 3 variates
    with pytest.raises(ValueError, match="does not match"):
        analyze_checkpoint(ckpt, tmp_path / "out", data_args={"num_variates": 3})
    with pytest.raises(ValueError, match="cannot import datamodule"):
        analyze_checkpoint(ckpt, tmp_path / "out", data="hoformer.data.NoSuchModule")
    with pytest.raises(FileNotFoundError, match="config"):
        analyze_checkpoint(ckpt, tmp_path / "out", config=tmp_path / "nope.yaml")


def test_one_mode_axial_maps_keep_their_mode_index():
    """A layer attending along a subset of modes (traffic 'alternating', HOT 'temporal') reports each map under the
    mode it attends, not under its position in the list."""
    from hoformer.analysis.callbacks import attention_stable_ranks

    m = create_model("traffic_alternating", num_nodes=5, window=7, horizon=3, dim=16, num_heads=2, num_layers=1).eval()
    args, kwargs = m.example_inputs(2)
    recs = attention_maps(m, *args, **kwargs)
    assert [(r.kind, r.mode_indices(), tuple(r.maps[0].shape[-2:])) for r in recs] == [
        ("axial", (0,), (7, 7)), ("axial", (1,), (5, 5))]
    ranks = attention_stable_ranks(recs, per_layer=True)
    assert set(k for k in ranks if "/" not in k) == {"mode0", "mode1"}
    assert ranks["mode0"] == ranks[f"{recs[0].name}/mode0"] and ranks["mode1"] == ranks[f"{recs[1].name}/mode1"]


@pytest.mark.parametrize("attention", ["kronecker_product", "kronecker_sum", "full", "axial", "divided"])
def test_hot_model_flops_match_flop_counter(attention):
    """Patch-embedding convolution, every block's attention and MLP, and the head: the analytic count of HOT Fig 6
    equals FlopCounterMode on the real model."""
    from hoformer.analysis import hot_model_flops

    m = create_model("hot_volume_classifier", attention=attention, input_size=16, patch_size=4, in_channels=2,
                     dim=32, depth=2, num_heads=4, num_classes=3, dropout=0.0).eval()
    args, kwargs = m.example_inputs(batch_size=1)
    assert hot_model_flops(attention, 16, patch_size=4, in_channels=2, dim=32, depth=2, num_heads=4,
                           num_classes=3) == count_flops(m, *args, **kwargs)


# ------------------------------------------------------------------------------------------ stable-rank averaging
def test_attention_stable_ranks_average_over_layers_batch_and_fibers():
    """Each key is the mean over layers of the per-layer mean (over batch, heads and axial fibers) of SVD stable
    ranks; product / sum come from Kronecker layers only; undefined (all-zero) maps are left out of the mean."""
    torch.manual_seed(0)
    model = create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=2, num_heads=2,
                         patch_size=4).double().eval()
    axial = build_attention("axial", 16, 2, num_modes=3).double().eval()
    recs = attention_maps(model, torch.randn(2, 16, 3, dtype=torch.float64)) + \
        attention_maps(axial, torch.randn(2, 3, 4, 5, 16, dtype=torch.float64))
    got = attention_stable_ranks(recs, per_layer=True)
    layers = []
    for r in recs:
        vals = {f"mode{i}": float(_svd_sr(m.reshape(-1, *m.shape[-2:])).mean()) for i, m in enumerate(r.maps)}
        if r.kind == "kronecker":
            vals["product"] = float(_svd_sr(kron_dense(r.maps)).mean())
            vals["sum"] = float(_svd_sr(kron_sum_dense(r.maps)).mean())
        layers.append(vals)
    assert {k for k in got if "/" not in k} == {"mode0", "mode1", "mode2", "product", "sum"}
    for key in ("mode0", "mode1", "mode2", "product", "sum"):
        vals = [v[key] for v in layers if key in v]
        assert got[key] == pytest.approx(sum(vals) / len(vals), rel=1e-6), key
    assert got["encoder.blocks.1.attn/sum"] == pytest.approx(layers[1]["sum"], rel=1e-6)
    assert got[f"{recs[2].name}/mode2"] == pytest.approx(layers[2]["mode2"], rel=1e-9)
    # a map of one sample that is all zeros (every key masked) has no stable rank: the mean is over the others
    f = recs[0].maps[0].clone()
    f[1] = 0
    one = attention_stable_ranks([recs[0]._replace(maps=[f, recs[0].maps[1]])])
    assert one["mode0"] == pytest.approx(float(_svd_sr(f[0]).mean()), rel=1e-9)


def test_stable_rank_callback_values_and_schedule(tmp_path):
    """Validation: the mean over the first ``num_batches`` batches of each batch's stable ranks, on every
    ``every_n_epochs``-th epoch; training: every ``train_every_n_steps``-th step."""
    import lightning.pytorch as pl
    import pandas as pd
    from lightning.pytorch.loggers import CSVLogger

    from hoformer.data import LTSFDataModule
    from hoformer.train import ForecastingTask

    dm = LTSFDataModule(synthetic=True, seq_len=16, pred_len=8, num_variates=3, synthetic_length=300, batch_size=8,
                        eval_batch_size=7)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=2,
                                                  num_heads=2, patch_size=4, attention="kronecker_sum")),
                           plot_variates=0)
    kw = dict(logger=CSVLogger(tmp_path, name="logs"), enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=0)
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=3, **kw,
                         callbacks=[StableRankCallback(every_n_epochs=2, num_batches=2, train_every_n_steps=3)])
    trainer.fit(task, datamodule=dm)
    df = pd.read_csv(next(tmp_path.rglob("metrics.csv")))
    assert df["train/sr/mode0"].notna().sum() == 3  # steps 0, 3, 6 of 8
    assert df.loc[df["train/sr/mode0"].notna(), "step"].tolist() == [0, 3, 6]  # logged at the measured step, not +1
    val_rows = df[df["val/loss"].notna()]
    assert val_rows["val/sr/sum"].notna().tolist() == [True, False]  # epoch 0 only (every_n_epochs=2)

    (res,) = pl.Trainer(**{**kw, "logger": False}, callbacks=[StableRankCallback(num_batches=2)]).validate(
        task, datamodule=dm, verbose=False)
    loader = dm.val_dataloader()
    per_batch = [attention_stable_ranks(attention_maps(task.model.eval(), b["x"])) for b in list(loader)[:2]]
    assert len(list(loader)) >= 3  # a third batch exists and must not be counted
    for key in ("mode0", "mode1", "product", "sum"):
        assert res[f"val/sr/{key}"] == pytest.approx((per_batch[0][key] + per_batch[1][key]) / 2, rel=1e-5), key


def test_batch_mean_maps_and_split_batch():
    from hoformer.analysis import AttentionRecord, batch_mean_maps, split_batch

    torch.manual_seed(0)
    kron = torch.rand(3, 2, 4, 4)
    ax = torch.rand(3, 2, 5, 6, 4, 4)
    (k, a) = batch_mean_maps([AttentionRecord("k", "kronecker", [kron]), AttentionRecord("a", "axial", [ax])])
    ref_k = torch.stack([sum(kron[b, h] for b in range(3)) / 3 for h in range(2)])
    ref_a = torch.stack([sum(ax[b, h, i, j] for b in range(3) for i in range(5) for j in range(6)) / 90
                         for h in range(2)])
    torch.testing.assert_close(k.maps[0], ref_k)
    torch.testing.assert_close(a.maps[0], ref_a)
    model = create_model("weaver", num_nodes=5, window=4, horizon=4, dim=16, num_heads=2)
    x, y = torch.randn(2, 4, 5, 1), torch.randn(2, 4, 5, 1)
    args, kw, target = split_batch(model, {"x": x, "y": y, "mask": x > 0, "time": torch.zeros(2, 4, 2),
                                           "mean": torch.zeros(1), "unused": 1})
    assert args[0] is x and target is y and set(kw) == {"mask", "time"}
    args, kw, target = split_batch(model, (x, y, "extra"))
    assert args == (x,) and kw == {} and target is y
    assert split_batch(model, x) == ((x,), {}, None)
    with pytest.raises(ValueError, match="input key 'x', 'ids' or 'input_ids'"):
        split_batch(model, {"inputs": x})
    with pytest.raises(TypeError, match="unsupported batch type"):
        split_batch(model, 3)


def test_fit_exponent_tail():
    x = [1, 2, 4, 8, 16, 32]
    y = [5, 5, 5, 8**3, 16**3, 32**3]  # flat (overhead-dominated) then cubic
    assert fit_exponent(x, y, tail=0.5) == pytest.approx(3.0, abs=1e-9)
    assert abs(fit_exponent(x, y) - 3.0) > 0.1  # all points: pulled down by the flat start
    assert fit_exponent([4, 1, 2], [16, 1, 4]) == pytest.approx(2.0, abs=1e-12)  # order does not matter
    assert np.isnan(fit_exponent([1, 2], [0, 4]))  # one usable point


# --------------------------------------------------------------------------------------------------- analyze
def _capture(monkeypatch, name):
    from hoformer.analysis import analyze as analyze_mod

    calls = []

    def fake(*args, **kwargs):
        calls.append((args, kwargs))
        return next(a for a in args[1:] if isinstance(a, Path))

    monkeypatch.setattr(analyze_mod, name, fake)
    return calls


def test_analyze_averages_maps_over_batches(tmp_path, monkeypatch):
    ckpt, model = _ckpt(tmp_path)
    calls = _capture(monkeypatch, "plot_mode_maps")
    analyze_checkpoint(ckpt, tmp_path / "fig", split="test", num_batches=2, metrics=None)
    from hoformer.data import LTSFDataModule

    dm = LTSFDataModule(**_DATA)
    dm.setup("test")
    batches = [b["x"] for b in list(dm.test_dataloader())[:3]]
    model.eval()
    per = [attention_maps(model, x) for x in batches]
    assert len(calls) == 2  # one figure per layer
    for layer, (args, kwargs) in enumerate(calls):
        for mode, got in enumerate(args[0]):
            want = sum(per[b][layer].maps[mode].double().mean(0) for b in range(2)) / 2  # batches 0 and 1 only
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
        assert kwargs["mode_names"] == ["variate", "time patch"]


def test_analyze_forecast_hoba_slice_and_run_files(tmp_path, monkeypatch):
    import os

    from hoformer.data import LTSFDataModule

    # forecast: lookback, the horizon of y (label_len steps dropped) and the model's forecast of the chosen sample
    ckpt, model = _ckpt(tmp_path)
    calls = _capture(monkeypatch, "plot_forecast_vs_truth")
    analyze_checkpoint(ckpt, tmp_path / "f", data_args={"label_len": 4}, sample=2, metrics=None)
    dm = LTSFDataModule(**{**_DATA, "label_len": 4})
    dm.setup("test")
    b = next(iter(dm.test_dataloader()))
    x, y = b["x"], b["y"]  # y: the horizon (the label_len known steps are y_known)
    ((args, kwargs),) = calls
    assert kwargs["names"] == ["v0", "v1", "OT"]  # panels labelled with the data's column names
    torch.testing.assert_close(args[0], x[2])
    torch.testing.assert_close(args[1], y[2])
    with torch.no_grad():
        torch.testing.assert_close(args[2], model.eval()(x)[2])
    # the newest metrics.csv of the run is plotted
    for v, t in (("version_0", 1_000_000), ("version_1", 2_000_000), ("version_2", 1_500_000)):
        f = tmp_path / "run" / "logs" / v / "metrics.csv"
        f.parent.mkdir(parents=True)
        f.write_text("step,val/sr/mode0\n0,1.5\n")
        os.utime(f, (t, t))
    srs = _capture(monkeypatch, "plot_stable_rank_curves")
    analyze_checkpoint(ckpt, tmp_path / "f2")
    assert srs[0][0][0] == tmp_path / "run" / "logs" / "version_1" / "metrics.csv"
    # a later `hoformer test` adds a newer metrics.csv without stable-rank columns: the fit's is still found
    f = tmp_path / "run" / "logs" / "version_3" / "metrics.csv"
    f.parent.mkdir(parents=True)
    f.write_text("epoch,step,test/mse\n0,0,0.4\n")
    srs.clear()
    analyze_checkpoint(ckpt, tmp_path / "f3")
    assert srs[0][0][0] == tmp_path / "run" / "logs" / "version_1" / "metrics.csv"

    # HOBA: a token in the overlap of windows [0, 16) and [12, 28) is shown in the later window; token 30 in [24, 40)
    create_model("hoba_classifier", vocab_size=50, max_len=40, dim=16, depth=1, num_heads=2).save_pretrained(
        tmp_path / "hoba")
    slices = _capture(monkeypatch, "plot_triplet_slice")
    hoba = from_pretrained(tmp_path / "hoba").eval()
    batch = next(iter(ToyDM().test_dataloader()))
    (rec,) = [r for r in attention_maps(hoba, batch["ids"], mask=batch["mask"]) if r.kind == "triplet"]
    for token, window, offset in ((13, 1, 1), (30, 2, 6), (5, 0, 5)):
        slices.clear()
        analyze_checkpoint(tmp_path / "hoba", tmp_path / "h", data=f"{__name__}.ToyDM", token=token, sample=1)
        ((args, kwargs),) = slices
        torch.testing.assert_close(args[0], rec.maps[0][1, :, window])
        assert kwargs["token"] == offset


def test_analyze_model_args_and_datamodule_sources(tmp_path):
    import yaml

    from hoformer.checkpoint import load_checkpoint
    from hoformer.inference import build_datamodule

    # a checkpoint whose stored model_kwargs no longer describe its weights (a default changed): --model-args
    model = create_model("hot_forecaster", **{**_MODEL, "mlp_ratio": 2.0})
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hot_forecaster", "model_kwargs": _MODEL}}, path)
    with pytest.raises(ValueError, match="pass the old value with --model-args"):
        load_checkpoint(path)
    loaded, info = load_checkpoint(path, model_args={"mlp_ratio": 2.0})
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    assert info["datamodule"] is None and info["run_dir"] is None  # not in <run>/checkpoints: no run folder guessed
    # datamodule from a LightningCLI YAML, a class path, or the checkpoint; explicit data args win
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"class_path": "hoformer.data.LTSFDataModule", "init_args": _DATA}}))
    dm = build_datamodule(config=cfg, data_args={"seq_len": 12})
    assert (dm.hparams.seq_len, dm.hparams.pred_len, dm.hparams.synthetic) == (12, 8, True)
    dm = build_datamodule(stored={"_class_path": "hoformer.data.LTSFDataModule", **_DATA},
                          data_args={"pred_len": 4})
    assert (dm.hparams.seq_len, dm.hparams.pred_len) == (16, 4)
    dm = build_datamodule(data="hoformer.data.LTSFDataModule", data_args=_DATA)
    assert dm.hparams.num_variates == 3
    cfg.write_text(yaml.safe_dump({"model": {}}))
    with pytest.raises(ValueError, match="has no `data: {class_path"):
        build_datamodule(config=cfg)
    with pytest.raises(ValueError, match="no data given"):
        build_datamodule()
    model.save_pretrained(tmp_path / "pre")  # a folder's config.json fixes the model: --model-args cannot apply
    with pytest.raises(ValueError, match=r"--model-args \{'mlp_ratio': 2.0\} cannot apply to the save_pretrained"):
        load_checkpoint(tmp_path / "pre", model_args={"mlp_ratio": 2.0})


class RaggedTextDM:
    """Text-like batches padded to their own longest sample (40 then 20 tokens); records a restored state."""

    restored: list = []

    def test_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return [{"ids": torch.randint(1, 50, (2, n), generator=g), "mask": torch.ones(2, n, dtype=torch.bool),
                 "label": torch.zeros(2, dtype=torch.long)} for n in (40, 20)]

    def load_state_dict(self, state):
        RaggedTextDM.restored.append(state)


def _hoba_ckpt(path, **kw):
    kw = dict(vocab_size=50, max_len=40, dim=16, depth=1, num_heads=2, **kw)
    model = create_model("hoba_classifier", **kw)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_name": "hoba_classifier", "model_kwargs": kw},
                "RaggedTextDM": {"tokenizer": "the vocabulary the model was trained with"}}, path)
    return path


def test_analyze_text_models_ragged_batches_2d_baselines_and_checkpoint_state(tmp_path):
    """Text batches change length between batches (maps of other shapes are not averaged in: used to crash); the
    datamodule gets the checkpoint's state (the tokenizer the model was trained with) before it is set up; HOBA's
    2D baselines (full and block-local) and every cross-block routing map are drawn (used to write nothing)."""
    RaggedTextDM.restored.clear()
    data = f"{__name__}.RaggedTextDM"
    with pytest.warns(UserWarning, match="change shape between batches"):
        files = analyze_checkpoint(_hoba_ckpt(tmp_path / "hoba.ckpt"), tmp_path / "a", data=data, num_batches=2)
    assert sorted(f.name for f in files) == ["cross_block_00_layers_0_attn.png", "hoba_slice_00.png"]
    assert RaggedTextDM.restored == [{"tokenizer": "the vocabulary the model was trained with"}]
    for attention in ("full2d", "block2d"):
        files = analyze_checkpoint(_hoba_ckpt(tmp_path / f"{attention}.ckpt", attention=attention),
                                   tmp_path / attention, data=data)
        names = {f.name for f in files}
        assert any(n.startswith("attention_") for n in names), (attention, names)
        assert all(f.stat().st_size > 1000 for f in files)
    rc = analyze_main(["--checkpoint", str(tmp_path / "missing.ckpt"), "--output", str(tmp_path / "x")])
    assert rc == 2  # a one-line error, not a traceback


def test_bench_options_that_leave_nothing_to_measure(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_main(["--repeats", "0", "--output", str(tmp_path)])
    assert "--repeats must be >= 1" in capsys.readouterr().err
    # every case above --max-full-tokens: a clear error instead of a KeyError after the sweep
    assert bench_main(["--attention", "full", "--sides", "20", "--max-full-tokens", "10", "--no-memory",
                       "--output", str(tmp_path / "a")]) == 2
    assert "every case was skipped" in capsys.readouterr().err
    # a patch that divides no analytic side: the analytic section is skipped, the measured one written
    assert bench_main(["--attention", "kronecker_product", "--sides", "4", "--repeats", "1", "--patch", "9",
                       "--no-memory", "--threads", "1", "--output", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "bench.csv").is_file() and not (tmp_path / "b" / "bench_flops_3d.csv").exists()
    assert "analytic 3D sweep skipped" in capsys.readouterr().out


def test_run_bench_model_rows_use_hot_model_flops():
    from hoformer.analysis import hot_model_flops, run_bench

    rows = run_bench(attentions=("kronecker_sum",), sides=(2, 3), modes=2, dim=16, heads=2, batch=1, repeats=1,
                     warmup=0, models=("hot_volume_classifier",), model_sides=(2,), model_depth=1, patch=2,
                     memory=False, device="cpu", log=lambda *a: None)
    layer = [r for r in rows if r["target"] == "layer"]
    (model,) = [r for r in rows if r["target"] == "hot_volume_classifier"]
    assert [r["sizes"] for r in layer] == ["2x2", "3x3"] and [r["tokens"] for r in layer] == [4, 9]
    for r in layer:
        assert r["gflops_counted"] == r["gflops"] == attention_flops("kronecker_sum", (r["side"],) * 2, 16, 2)[
            "total"] / 1e9
        assert r["time_fwd_ms"] > 0 and r["time_fwdbwd_ms"] > 0 and np.isnan(r["mem_fwd_mb"])
    assert model["gflops"] == hot_model_flops("kronecker_sum", 4, patch_size=2, dim=16, depth=1, num_heads=2) / 1e9
    assert model["tokens"] == 8 and model["sizes"] == "2x2x2"
    with pytest.raises(ValueError, match="--models supports 'hot_volume_classifier'"):
        run_bench(attentions=("full",), sides=(), models=("hot_forecaster",), model_sides=(2,), device="cpu",
                  log=lambda *a: None)


def test_nested_recordings_each_get_every_map():
    """An inner recording (e.g. StableRankCallback's during a step the user also records) neither steals the outer
    recording's maps nor ends it: each block sees every forward made while it is open."""
    model = create_model("hot_forecaster", seq_len=12, pred_len=4, num_variates=3, patch_size=3, dim=16, num_heads=2,
                         depth=2).eval()
    x = torch.randn(2, 12, 3)
    with recording(model) as outer:
        model(x)
        inner = attention_maps(model, x)
        model(x)
    assert len(inner) == 2 and len(outer) == 6
    for a, b in zip(outer[2:4], inner):
        assert a.name == b.name and all(torch.equal(p, q) for p, q in zip(a.maps, b.maps))
    assert all(not m._sinks for m in model.modules() if hasattr(m, "_sinks"))


@pytest.mark.parametrize("kind", ["kronecker_tanimoto", "kronecker_cosine"])
def test_kernel_kronecker_attention_flops_match_flop_counter(kind):
    from hoformer.analysis.flops import attention_flops, count_flops
    from hoformer.layers import build_attention

    layer = build_attention(kind, 32, 4).eval()
    x = torch.randn(2, 3, 5, 6, 32)
    got = attention_flops(kind, (3, 5, 6), 32, 4, batch=2)
    assert got["total"] > 0 and got["total"] == count_flops(layer, x)


@pytest.mark.parametrize("first_mode", [1, 2])
def test_divided_attention_flops_follow_first_mode(first_mode):
    from hoformer.analysis.flops import attention_flops, count_flops
    from hoformer.layers import build_attention

    layer = build_attention("divided", 32, 4, first_mode=first_mode).eval()
    x = torch.randn(2, 3, 5, 6, 32)
    got = attention_flops("divided", (3, 5, 6), 32, 4, batch=2, first_mode=first_mode)["total"]
    assert got == count_flops(layer, x)


def test_weaver_maps_are_recorded_as_a_kronecker_product():
    """Weaver's valence attention is Theta_T (x) Theta_S: its maps are recorded with combine="product" (the stable
    rank / figure code combines the factors by it)."""
    from hoformer.analysis import attention_maps
    from hoformer.models import create_model

    w = create_model("weaver", num_nodes=5, window=4, horizon=4, dim=16, num_heads=2).eval()
    args, kwargs = w.example_inputs(2)
    (rec,) = attention_maps(w, *args, **kwargs)
    assert (rec.kind, rec.combine) == ("kronecker", "product")


def test_task_forecast_png_labels_panels_with_column_names(tmp_path, monkeypatch):
    """The forecasting task's test PNG labels each panel with the column name it was given, not ``variate <j>``."""
    pytest.importorskip("matplotlib")
    import hoformer._plot as plots
    from hoformer.train.tasks import plot_forecast

    seen = {}
    monkeypatch.setattr(plots, "plot_forecast_vs_truth",
                        lambda x, y, pred, path, **kw: seen.update(kw) or path)
    x, y = torch.randn(16, 4), torch.randn(8, 4)
    plot_forecast(x, y, y, tmp_path / "f.png", num_variates=2, names=["HUFL", "HULL", "MUFL", "OT"])
    assert seen["channels"] == [3, 2] and [seen["names"][c] for c in seen["channels"]] == ["OT", "MUFL"]
    plot_forecast(x[:, -1:], y[:, -1:], y[:, -1:], tmp_path / "f.png", names=["HUFL", "HULL", "MUFL", "OT"])  # MS
    assert seen["names"] == ["OT"]
    plot_forecast(x, y, y, tmp_path / "f.png")
    assert seen["names"] == ["variate 0", "variate 1", "variate 2", "variate 3"]


def test_names_of_0_1_0_resolve_with_a_deprecation_warning():
    """``hoformer.analysis`` exported the checkpoint reader and the datamodule builders in 0.1.0: the names still
    resolve, to the one implementation, with a warning naming its module."""
    import importlib

    import hoformer.analysis as analysis
    import hoformer.checkpoint
    import hoformer.inference

    for name, module in (("load_checkpoint", hoformer.checkpoint), ("build_datamodule", hoformer.inference),
                         ("checkpoint_datamodule", hoformer.inference)):
        with pytest.warns(DeprecationWarning, match=f"hoformer.analysis.{name} is {module.__name__}.{name}"):
            assert getattr(analysis, name) is getattr(module, name)
        assert name not in importlib.import_module("hoformer.analysis.analyze").__all__  # not a documented home
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        analysis.nothing  # noqa: B018
