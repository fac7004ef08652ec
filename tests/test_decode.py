"""Incremental decoding along the causal mode: ``init_cache`` / ``step`` of causal Kronecker layers and of an
``Encoder`` of them reproduce the full causal forward, one index of the causal mode (a full slice of the other
modes) at a time.

Axis legend: ``b`` batch, ``t`` the causal mode, ``n`` other modes, ``d`` model dim.
"""
from __future__ import annotations

import pytest
import torch

from hoformer.layers import DecodingCache, Encoder, KroneckerAttention, build_attention

NAMES = ["kronecker_product", "kronecker_sum", "kronecker_linear", "kronecker_tanimoto"]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _decode(model, x, c):
    cache = model.init_cache()
    return torch.cat([model.step(x.narrow(1 + c, t, 1), cache) for t in range(x.shape[1 + c])], dim=1 + c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sizes,causal_mode", [((6, 3), 0), ((4, 6), 1), ((3, 5, 2), 1), ((5,), 0)])
@pytest.mark.parametrize("name", NAMES)
def test_layer_steps_equal_the_full_causal_forward(name, sizes, causal_mode, dtype):
    torch.manual_seed(0)
    layer = build_attention(name, 16, 2, num_modes=len(sizes), causal_mode=causal_mode,
                            rope_modes=(causal_mode,)).to(dtype).eval()
    x = torch.randn(2, *sizes, 16, dtype=dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(_decode(layer, x, causal_mode), layer(x), rtol=tol, atol=tol)


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
@pytest.mark.parametrize("attention", ["kronecker_product", "kronecker_sum", "kronecker_linear"])
def test_encoder_steps_equal_the_full_causal_forward(attention, dtype):
    torch.manual_seed(0)
    enc = Encoder(16, depth=3, num_heads=2, attention=attention, num_modes=2, causal_mode=0,
                  rope_modes=(0,)).to(dtype).eval()
    x = torch.randn(2, 7, 3, 16, dtype=dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(_decode(enc, x, 0), enc(x), rtol=tol, atol=tol)


def test_cache_grows_beyond_its_first_capacity():
    torch.manual_seed(0)
    layer = KroneckerAttention(8, 2, num_modes=2, causal_mode=0).double().eval()
    x = torch.randn(1, 40, 2, 8, dtype=torch.float64)  # more steps than the initial buffer of 16
    torch.testing.assert_close(_decode(layer, x, 0), layer(x), rtol=1e-10, atol=1e-10)


def test_decoding_errors():
    plain = KroneckerAttention(8, 2, num_modes=2)
    with pytest.raises(ValueError, match="causal_mode"):
        plain.init_cache()
    layer = KroneckerAttention(8, 2, num_modes=2, causal_mode=0).eval()
    cache = layer.init_cache()
    assert isinstance(cache, DecodingCache)
    with pytest.raises(ValueError, match="size 1 along it"):
        layer.step(torch.randn(1, 2, 3, 8), cache)
    layer.step(torch.randn(1, 1, 3, 8), cache)
    with pytest.raises(ValueError, match="other modes"):
        layer.step(torch.randn(1, 1, 4, 8), cache)
    with pytest.raises(ValueError, match=r"`masks\[0\]`"):
        layer.step(torch.randn(1, 1, 3, 8), cache, masks=[torch.ones(1, 1, dtype=torch.bool), None])
    with pytest.raises(TypeError, match="init_cache"):
        layer.step(torch.randn(1, 1, 3, 8), {})


def test_encoder_of_layers_without_a_cache_says_so():
    enc = Encoder(16, depth=1, num_heads=2, attention="full", causal_mode=0)
    with pytest.raises(TypeError, match="FullAttention has no decoding cache"):
        enc.init_cache()
    enc = Encoder(16, depth=1, num_heads=2, attention="kronecker_product", num_modes=2)
    with pytest.raises(ValueError, match="causal_mode"):
        enc.init_cache()
