"""Incremental decoding along the causal mode: ``init_cache`` / ``step`` of every causal attention layer (Kronecker,
full, axial, divided) and of an ``Encoder`` of them reproduce the full causal forward, one index of the causal mode
(a full slice of the other modes) at a time.

Axis legend: ``b`` batch, ``t`` the causal mode, ``n`` other modes, ``d`` model dim.
"""
from __future__ import annotations

import pytest
import torch

from hoformer.layers import ATTENTION_TYPES, DecodingCache, Encoder, KroneckerAttention, build_attention

KRONECKER = ["kronecker_product", "kronecker_sum", "kronecker_linear", "kronecker_tanimoto"]
DENSE = ["full", "axial", "axial_sequential", "divided"]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
#: every choice of causal mode with 2 and 3 modes, and a single mode
CASES = [((5,), 0), ((6, 3), 0), ((4, 6), 1), ((4, 3, 2), 0), ((3, 5, 2), 1), ((3, 2, 5), 2)]


def _decode(model, x, c, **kw):
    cache = model.init_cache(**kw)
    return torch.cat([model.step(x.narrow(1 + c, t, 1), cache) for t in range(x.shape[1 + c])], dim=1 + c)


def _layer(name, sizes, causal_mode, dtype, rope_modes=None, **kw):
    torch.manual_seed(0)
    rope = (causal_mode,) if rope_modes is None else rope_modes
    layer = build_attention(name, 16, 2, num_modes=len(sizes), causal_mode=causal_mode, rope_modes=rope, **kw)
    for p in layer.parameters():  # non-trivial norms and biases
        if p.ndim == 1:
            torch.nn.init.normal_(p, std=0.5)
    return layer.to(dtype).eval()


def test_every_attention_type_decodes():
    assert set(ATTENTION_TYPES) == set(KRONECKER + DENSE + ["kronecker_cosine"])
    for name in ATTENTION_TYPES:
        assert isinstance(build_attention(name, 8, 2, causal_mode=0).init_cache(), DecodingCache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sizes,causal_mode", CASES)
@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_layer_steps_equal_the_full_causal_forward(name, sizes, causal_mode, dtype):
    """With RoPE on the causal mode (rotated at the absolute step position)."""
    layer = _layer(name, sizes, causal_mode, dtype)
    x = torch.randn(2, *sizes, 16, dtype=dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(_decode(layer, x, causal_mode), layer(x), rtol=tol, atol=tol)


DENSE_VARIANTS = [("full", {}), ("axial", {}), ("axial_sequential", {}), ("axial_sequential", {"modes": (2, 1, 0)}),
                  ("axial", {"modes": (1,)}), ("divided", {}), ("divided", {"first_mode": 1})]


@pytest.mark.parametrize("sizes,causal_mode", [((4, 3), 1), ((3, 5, 2), 1), ((3, 2, 5), 0)])
@pytest.mark.parametrize("name,kw", DENSE_VARIANTS)
def test_dense_steps_with_rope_on_every_mode_other_orders_and_first_modes(name, kw, sizes, causal_mode):
    """RoPE on every mode (the causal mode's positions are absolute, the others' start at 0 in every slice),
    sequential axial stages in another order (the causal one between local ones; on two modes ``(1, 0)``), axial
    attention that never attends along the causal mode, and divided attention whose first mode is or is not the
    causal one."""
    if "modes" in kw:
        kw = {"modes": tuple(m for m in kw["modes"] if m < len(sizes))}
    layer = _layer(name, sizes, causal_mode, torch.float64, rope_modes=tuple(range(len(sizes))), **kw)
    x = torch.randn(2, *sizes, 16, dtype=torch.float64)
    torch.testing.assert_close(_decode(layer, x, causal_mode), layer(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", DENSE)
def test_dense_steps_with_masks_on_the_other_modes(name):
    """A static mask on one other mode and a per-sample, per-head mask on another apply in every step as in the full
    forward."""
    torch.manual_seed(1)
    layer = _layer(name, (3, 5, 4), 1, torch.float64)
    x = torch.randn(2, 3, 5, 4, 16, dtype=torch.float64)
    m0 = (torch.rand(3, 3) < 0.5) | torch.eye(3, dtype=torch.bool)
    m2 = (torch.rand(2, 2, 4, 4) < 0.5) | torch.eye(4, dtype=torch.bool)
    masks = [m0, None, m2]
    cache = layer.init_cache()
    steps = torch.cat([layer.step(x[:, :, t : t + 1], cache, masks=masks) for t in range(5)], dim=2)
    torch.testing.assert_close(steps, layer(x, masks=masks), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pool", ["sum", "mean"])
@pytest.mark.parametrize("combine", ["product", "sum"])
def test_steps_with_mean_pool_bias_and_a_mask_on_another_mode(pool, combine):
    torch.manual_seed(0)
    layer = KroneckerAttention(16, 2, combine=combine, num_modes=3, causal_mode=2, pool=pool, qk_bias=True,
                               rope_modes=(0, 2)).double().eval()
    x = torch.randn(2, 3, 4, 5, 16, dtype=torch.float64)
    mask = (torch.rand(3, 3) < 0.5) | torch.eye(3, dtype=torch.bool)
    masks = [mask, None, None]
    cache = layer.init_cache()
    steps = torch.cat([layer.step(x[:, :, :, t : t + 1], cache, masks=masks) for t in range(5)], dim=3)
    torch.testing.assert_close(steps, layer(x, masks=masks), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attention", ["kronecker_product", "kronecker_sum", "kronecker_linear"] + DENSE)
def test_encoder_steps_equal_the_full_causal_forward(attention, dtype):
    torch.manual_seed(0)
    enc = Encoder(16, depth=2, num_heads=2, attention=attention, num_modes=2, causal_mode=0,
                  rope_modes=(0,)).to(dtype).eval()
    x = torch.randn(2, 7, 3, 16, dtype=dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(_decode(enc, x, 0), enc(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("attention", ["kronecker_sum", "full", "axial", "divided"])
def test_encoder_of_three_modes_decodes_along_the_last(attention):
    torch.manual_seed(0)
    enc = Encoder(16, depth=2, num_heads=2, attention=attention, num_modes=3, causal_mode=2,
                  rope_modes=(2,)).double().eval()
    x = torch.randn(2, 3, 2, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(_decode(enc, x, 2, max_steps=6), enc(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["kronecker_product", "full", "axial_sequential", "divided"])
def test_cache_grows_beyond_its_first_capacity_or_is_preallocated(name):
    layer = _layer(name, (40, 2), 0, torch.float64)
    x = torch.randn(1, 40, 2, 16, dtype=torch.float64)  # more steps than the initial buffer of 16
    y = layer(x)
    torch.testing.assert_close(_decode(layer, x, 0), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(_decode(layer, x, 0, max_steps=40), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_decoding_errors(name):
    plain = build_attention(name, 8, 2, num_modes=2)
    with pytest.raises(ValueError, match="init_cache: decoding needs a layer built with `causal_mode`"):
        plain.init_cache()
    with pytest.raises(ValueError, match="step: decoding needs a layer built with `causal_mode`"):
        plain.step(torch.randn(1, 1, 3, 8), DecodingCache())
    layer = build_attention(name, 8, 2, num_modes=2, causal_mode=0).eval()
    with pytest.raises(ValueError, match=r"`max_steps` must be an int >= 1"):
        layer.init_cache(max_steps=0)
    cache = layer.init_cache(max_steps=2)
    with pytest.raises(ValueError, match=r"causal mode 0 \(size 1 along it\), got shape \(1, 2, 3, 8\)"):
        layer.step(torch.randn(1, 2, 3, 8), cache)
    layer.step(torch.randn(1, 1, 3, 8), cache)
    with pytest.raises(ValueError, match=r"other modes \(3,\).*other modes \(4,\)"):
        layer.step(torch.randn(1, 1, 4, 8), cache)
    with pytest.raises(ValueError, match="batch 1.*got batch 2"):
        layer.step(torch.randn(2, 1, 3, 8), cache)
    with pytest.raises(ValueError, match=r"`masks\[0\]` \(the causal mode's\) must be None"):
        layer.step(torch.randn(1, 1, 3, 8), cache, masks=[torch.ones(1, 1, dtype=torch.bool), None])
    with pytest.raises(ValueError, match=r"`masks\[1\]`"):
        layer.step(torch.randn(1, 1, 3, 8), cache, masks=[None, torch.ones(4, 4, dtype=torch.bool)])
    with pytest.raises(TypeError, match="init_cache"):
        layer.step(torch.randn(1, 1, 3, 8), {})
    layer.step(torch.randn(1, 1, 3, 8), cache)
    with pytest.raises(ValueError, match=r"the cache is full: it was made with max_steps=2 and holds 2 steps"):
        layer.step(torch.randn(1, 1, 3, 8), cache)


def test_encoder_cache_errors():
    enc = Encoder(16, depth=2, num_heads=2, attention="full", num_modes=2)
    with pytest.raises(ValueError, match="FullAttention.init_cache: decoding needs a layer built with `causal_mode`"):
        enc.init_cache()
    enc = Encoder(16, depth=2, num_heads=2, attention="divided", num_modes=2, causal_mode=1).eval()
    with pytest.raises(TypeError, match="the list from init_cache"):
        enc.step(torch.randn(1, 3, 1, 16), enc.init_cache()[:1])
    cache = enc.init_cache(max_steps=1)
    enc.step(torch.randn(1, 3, 1, 16), cache)
    with pytest.raises(ValueError, match="DividedAttention.step: the cache is full"):
        enc.step(torch.randn(1, 3, 1, 16), cache)


@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_steps_refuse_training_mode(name):
    """Decoding is eval-mode arithmetic: a layer, block or encoder in training mode with a dropout is refused (it
    would make the steps differ from the forward) instead of dropping out silently."""
    layer = build_attention(name, 8, 2, num_modes=2, causal_mode=0, dropout=0.5)
    with pytest.raises(RuntimeError, match=r"step: decoding runs in eval mode .* training mode with a "
                                           r"Dropout\(p=0.5\); call .eval\(\)"):
        layer.step(torch.randn(1, 1, 3, 8), layer.init_cache())
    enc = Encoder(8, depth=2, num_heads=2, attention=name, num_modes=2, causal_mode=0, dropout=0.5)
    with pytest.raises(RuntimeError, match=r"Encoder.step: decoding runs in eval mode"):
        enc.step(torch.randn(1, 1, 3, 8), enc.init_cache())
    with pytest.raises(RuntimeError, match=r"Block.step: decoding runs in eval mode"):
        enc.blocks[0].step(torch.randn(1, 1, 3, 8), enc.blocks[0].attn.init_cache())
    enc.eval()
    x = torch.randn(1, 4, 3, 8)
    torch.testing.assert_close(_decode(enc, x, 0), enc(x), rtol=1e-5, atol=1e-5)
