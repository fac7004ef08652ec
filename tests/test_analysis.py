"""Analysis: attention-map recorder, stable-rank callback vs dense SVD, FLOP formulas vs FlopCounterMode,
``hoformer analyze`` / ``hoformer bench --quick`` outputs and their error messages."""
from __future__ import annotations

import json

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
from hoformer.functional import kron_apply, kron_dense, kron_sum_apply, kron_sum_dense
from hoformer.layers import build_attention
from hoformer.models import create_model


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
    assert all(m._record is None for m in model.modules() if hasattr(m, "_record"))


def test_attention_maps_of_weaver_and_hoba_models():
    w = create_model("weaver", num_nodes=5, window=4, horizon=4, dim=16, num_heads=2).eval()
    args, kwargs = w.example_inputs(2)
    (rec,) = attention_maps(w, *args, **kwargs)
    assert rec.kind == "kronecker" and [tuple(m.shape) for m in rec.maps] == [(2, 2, 4, 4), (2, 2, 5, 5)]
    assert w.record_attention is False
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
    task = ForecastingTask("hot_forecaster", dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1,
                                                  num_heads=2, patch_size=4, attention="kronecker_sum"))
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
    got = attention_flops(kind, (3, 5, 6), 32, 4, batch=2)["total"]
    ref = count_flops(layer, x)
    assert abs(got - ref) <= 0.05 * ref


@pytest.mark.parametrize("name,kind,kw", [("hoba", "hoba", {}), ("block2d", "block2d", {}), ("full2d", "full2d", {}),
                                          ("triplet_full", "triplet", {"block_size": None})])
def test_text_attention_flops_match_flop_counter(name, kind, kw):
    from hoformer.layers import build_text_attention

    layer = build_text_attention(name, 32, 4, block_size=16).eval()
    x = torch.randn(2, 40, 32)
    got = attention_flops(kind, (40,), 32, 4, batch=2, **{"block_size": 16, **kw})["total"]
    ref = count_flops(layer, x)
    assert abs(got - ref) <= 0.05 * ref


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
