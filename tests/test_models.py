"""Registry-wide model checks (every registered model, every family) and the HOT models' public API."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hoformer.layers import ATTENTION_TYPES, record_attention
from hoformer.models import HoformerModel, create_model, from_pretrained, list_models
from hoformer.models.hot import FORECAST_ATTENTIONS, SingleModeAttention

ALL_MODELS = list_models()
HOT_ATTENTIONS = ["kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial", "divided"]
FORECAST_ALL = HOT_ATTENTIONS + sorted(FORECAST_ATTENTIONS)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def _float_outputs(model, args, kwargs):
    return [t for t in _tensors(model(*args, **kwargs)) if t.is_floating_point()]


def test_registry_has_hot_models():
    for name in ("hot_forecaster", "hot_volume_classifier", "hot_segmenter"):
        assert name in ALL_MODELS


# ----------------------------------------------------------------------------------------- every model
@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_backward_every_param_gets_grad(name):
    torch.manual_seed(0)
    model = create_model(name)
    assert isinstance(model, HoformerModel)
    args, kwargs = model.example_inputs(batch_size=2)
    model.train()
    outs = _float_outputs(model, args, kwargs)
    assert outs, f"{name}: forward returned no floating-point tensor"
    for t in outs:
        assert torch.isfinite(t).all(), f"{name}: non-finite output"
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:  # parameter-free baselines (e.g. last value)
        return
    loss = sum(t.float().square().mean() for t in outs if t.requires_grad)
    loss.backward()
    missing = [n for n, p in params if p.grad is None]
    assert not missing, f"{name}: parameters without gradient: {missing[:8]}"
    bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
    assert not bad, f"{name}: non-finite gradients: {bad[:8]}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_save_pretrained_round_trip_identical(name, tmp_path):
    torch.manual_seed(0)
    model = create_model(name).eval()
    args, kwargs = model.example_inputs(batch_size=1)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is type(model) and loaded.config == json.loads(json.dumps(model.config))
    with torch.no_grad():
        for a, b in zip(_tensors(model(*args, **kwargs)), _tensors(loaded(*args, **kwargs))):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_from_pretrained_rejects_tampered_weights(name, tmp_path):
    model = create_model(name)
    d = model.save_pretrained(tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    if not state:
        pytest.skip(f"{name} has no weights")
    save_file({**state, "not_a_parameter": torch.zeros(1)}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="do not match"):
        from_pretrained(d)
    key = sorted(state)[0]
    save_file({k: v for k, v in state.items() if k != key}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="do not match"):
        from_pretrained(d)


def test_from_pretrained_mismatched_config_and_corrupt_files(tmp_path):
    model = create_model("hot_forecaster", dim=32, num_heads=4)
    d = model.save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["kwargs"]["dim"] = 64  # weights were saved for dim 32
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="(?s)do not fit.*size mismatch"):
        from_pretrained(d)
    cfg["kwargs"] = {"attention": "no_such_attention"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="attention"):
        from_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_pretrained(d)
    (d / "config.json").write_text(json.dumps({"name": "hot_forecaster"}))
    with pytest.raises(ValueError, match="kwargs"):
        from_pretrained(d)
    model.save_pretrained(tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="cannot read weights"):
        from_pretrained(tmp_path / "ok")


# -------------------------------------------------------------------------------- HOT public API shapes
@pytest.mark.parametrize("attention", FORECAST_ALL)
def test_forecaster_api_shape(attention):
    m = create_model("hot_forecaster", seq_len=96, pred_len=96, num_variates=7, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.randn(2, 96, 7))
    assert y.shape == (2, 96, 7) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", HOT_ATTENTIONS)
def test_volume_classifier_api_shape(attention):
    m = create_model("hot_volume_classifier", in_channels=1, input_size=28, num_classes=2, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.rand(2, 1, 28, 28, 28))
    assert y.shape == (2, 2) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", HOT_ATTENTIONS)
def test_segmenter_api_shape(attention):
    m = create_model("hot_segmenter", in_channels=7, num_classes=17, input_size=64, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.randn(2, 7, 64, 64))
    assert y.shape == (2, 17, 64, 64) and torch.isfinite(y).all()


def test_every_layer_attention_is_accepted():
    """A new attention type in hoformer.layers is usable by every HOT model without model changes."""
    for name in ATTENTION_TYPES:
        create_model("hot_forecaster", attention=name, dim=16, num_heads=2)
        create_model("hot_volume_classifier", attention=name, dim=16, num_heads=2, depth=1)
        create_model("hot_segmenter", attention=name, dim=16, num_heads=2, depth=1, input_size=32)


# ------------------------------------------------------------------------------------- HOT behaviour
@pytest.mark.parametrize("attention", FORECAST_ALL)
def test_forecaster_permutation_equivariant_over_variates(attention):
    """No positional code on the variate mode: permuting input variates permutes the forecast."""
    torch.manual_seed(1)
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=5, attention=attention, dim=32,
                     num_heads=4).eval().double()
    x, perm = torch.randn(2, 32, 5, dtype=torch.float64), torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(m(x[..., perm]), m(x)[..., perm])


def test_forecaster_revin_affine_equivariance():
    """RevIN: forecasting a * x + b per variate gives a * f(x) + b."""
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=3, dim=32, num_heads=4).eval().double()
    x = torch.randn(2, 32, 3, dtype=torch.float64)
    a, b = torch.tensor([2.0, 0.5, 10.0], dtype=torch.float64), torch.tensor([-3.0, 100.0, 0.0], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x * a + b), m(x) * a + b, rtol=1e-4, atol=1e-4)  # eps inside the std


def test_forecaster_time_order_matters():
    """RoPE on the time mode: the model is not invariant to reversing time patches."""
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=3, dim=32, num_heads=4,
                     pool="mean").eval()
    x = torch.randn(2, 32, 3)
    xr = x.view(2, 8, 4, 3).flip(1).reshape(2, 32, 3)  # reverse the order of the 8 patches
    with torch.no_grad():
        assert not torch.allclose(m(x), m(xr), atol=1e-4)


def test_single_mode_attention_matches_loop():
    """'spatial' / 'temporal' attend along one mode for every fiber of the other (explicit-loop reference)."""
    from hoformer.layers import FullAttention

    torch.manual_seed(0)
    inner = FullAttention(16, num_heads=2).double()
    x = torch.randn(2, 5, 6, 16, dtype=torch.float64)
    for mode in (0, 1):
        y = SingleModeAttention(inner, mode)(x)
        ref = torch.empty_like(x)
        for b in range(2):
            for j in range(x.shape[2 - mode]):
                if mode == 0:
                    ref[b, :, j] = inner(x[b : b + 1, :, j])[0]
                else:
                    ref[b, j] = inner(x[b : b + 1, j])[0]
        torch.testing.assert_close(y, ref)


def test_segmenter_head_is_patch_local():
    """The per-token head maps token (i, j) to pixel block (i p : (i+1) p, j p : (j+1) p) (depth 0: no mixing)."""
    m = create_model("hot_segmenter", in_channels=3, num_classes=4, input_size=32, depth=0, patch_size=8).eval()
    x = torch.randn(1, 3, 32, 32)
    x2 = x.clone()
    x2[:, :, 8:16, 16:24] += 1.0  # token (1, 2)
    with torch.no_grad():
        diff = (m(x2) - m(x)).abs().sum(1)[0]
    changed = diff > 1e-6
    assert changed[8:16, 16:24].all()
    changed[8:16, 16:24] = False
    assert not changed.any()


@pytest.mark.parametrize("name,kw", [
    ("hot_forecaster", dict(seq_len=32, pred_len=8, num_variates=3)),
    ("hot_volume_classifier", dict(input_size=16, depth=2)),
    ("hot_segmenter", dict(input_size=32, depth=2)),
])
@pytest.mark.parametrize("attention", ["kronecker_product", "kronecker_sum", "full"])
def test_attention_maps_recorded(name, kw, attention):
    m = create_model(name, attention=attention, dim=32, num_heads=4, **kw).eval()
    (x,), _ = m.example_inputs(1)
    with torch.no_grad():
        y, maps = m(x, return_attention=True)
        with record_attention(m) as rec:
            y2 = m(x)
    torch.testing.assert_close(y, y2)
    assert len(maps) == len(m.encoder.blocks) and len(rec) == len(m.encoder.blocks)
    for per_mode in maps:
        for a in per_mode:  # rows of softmax attention sum to one
            torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,kw,bad", [
    ("hot_forecaster", {}, torch.randn(2, 95, 7)),
    ("hot_forecaster", {}, torch.randn(2, 96, 8)),
    ("hot_volume_classifier", {}, torch.randn(2, 28, 28, 28)),
    ("hot_segmenter", dict(input_size=64), torch.randn(2, 7, 64, 60)),
])
def test_bad_input_raises_clear_error(name, kw, bad):
    m = create_model(name, dim=16, num_heads=2, **kw)
    with pytest.raises(ValueError, match="expected `x` of shape"):
        m(bad)
    with pytest.raises(TypeError, match="floating-point"):
        m(bad.long())


@pytest.mark.parametrize("name,kw,match", [
    ("hot_forecaster", dict(attention="nope"), "attention"),
    ("hot_forecaster", dict(seq_len=30, patch_size=4), "divisible"),
    ("hot_segmenter", dict(patch_size=0), "patch_size"),
    ("hot_forecaster", dict(pool="max"), "pool"),
    ("hot_volume_classifier", dict(attention="spatial"), "attention"),  # 1-mode baselines are forecasting-only
    ("hot_volume_classifier", dict(num_classes=1), "num_classes"),
    ("hot_volume_classifier", dict(input_size=(28, 28)), "input_size"),
    ("hot_segmenter", dict(pos_embed="alibi"), "pos_embed"),
])
def test_bad_config_raises(name, kw, match):
    with pytest.raises(ValueError, match=match):
        create_model(name, **kw)


def test_paper_scale_defaults():
    """Defaults = appendix B.4: width 128; 2 blocks (forecasting), 6 blocks (3D classification, segmentation)."""
    for name, depth in (("hot_forecaster", 2), ("hot_volume_classifier", 6), ("hot_segmenter", 6)):
        m = create_model(name)
        assert len(m.encoder.blocks) == depth and m.encoder.norm.normalized_shape == (128,)
