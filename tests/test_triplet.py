"""Triplet (HOBA) attention: fast chunked kernel vs naive references, windows, masks, gradients, layers."""
from __future__ import annotations

import math

import pytest
import torch

from hoformer.functional import (
    block_attention,
    block_attention_weights,
    cross_block_attention,
    cross_block_attention_weights,
    triplet_attention,
    triplet_attention_naive,
    triplet_attention_weights,
    triplet_grid_length,
    triplet_windows,
)
from hoformer.layers import (
    BlockAttention2D,
    CrossBlockAttention,
    HOBABlock,
    HOBAttention,
    build_text_attention,
    record_attention,
)

F64 = torch.float64


def _qkv(B=2, H=2, L=11, D=4, n=5, dtype=F64, grad=False):
    return [torch.randn(B, H, L, D, dtype=dtype, requires_grad=grad) for _ in range(n)]


def _mask(B, L, pad):
    m = torch.ones(B, L, dtype=torch.bool)
    if pad:
        m[0, L - pad:] = False
    return m


# ------------------------------------------------------------------------------------------------ windows
@pytest.mark.parametrize("L,b,ov,expected", [
    (10, 4, 0.0, [0, 4, 6]),          # final window [6, 10) covers the tail
    (12, 4, 0.0, [0, 4, 8]),
    (10, 4, 0.5, [0, 2, 4, 6]),
    (13, 4, 0.25, [0, 3, 6, 9]),      # stride round(3.0) = 3
    (3, 8, 0.0, [0]),                 # shorter than a block: one window
    (6, 4, 0.99, [0, 1, 2]),          # stride max(1, round(0.04)) = 1
])
def test_windows(L, b, ov, expected):
    assert triplet_windows(L, b, ov) == expected


@pytest.mark.parametrize("L,b,ov,grid", [
    (10, 4, 0.0, 12), (12, 4, 0.0, 12), (13, 4, 0.25, 16), (10, 4, 0.25, 13), (20, 16, 0.25, 28),
    (14, 16, 0.25, 28), (12, 16, 0.25, 12), (3, 8, 0.0, 3), (40, 16, 0.25, 52),
])
def test_grid_length_gives_the_fixed_window_grid(L, b, ov, grid):
    """Padded to triplet_grid_length, the windows are exactly the grid starts m * stride below L (eq 3), with no
    end-aligned window; L <= stride stays one window [0, L)."""
    assert triplet_grid_length(L, b, ov) == grid
    stride = max(1, round(b * (1 - ov)))
    assert triplet_windows(grid, b, ov) == ([0] if L <= stride else list(range(0, L, stride)))


def test_naive_matches_explicit_triple_loop():
    """Pins the spec (scores, joint softmax over key pairs, value products, eq 4 mean) with scalar loops."""
    B, H, L, D, b, ov = 1, 1, 5, 2, 3, 0.34
    q, k1, k2, v1, v2 = (x[0, 0] for x in _qkv(B, H, L, D))
    scale = 0.7
    out = torch.zeros(L, D, dtype=F64)
    cnt = torch.zeros(L, dtype=F64)
    for s in triplet_windows(L, b, ov):
        w = range(s, s + b)
        for i in w:
            t = {(j, l): scale * sum(q[i, d] * k1[j, d] * k2[l, d] for d in range(D)) for j in w for l in w}
            z = sum(math.exp(v) for v in t.values())
            for (j, l), v in t.items():
                out[i] += math.exp(v) / z * v1[j] * v2[l]
            cnt[i] += 1
    ref = out / cnt[:, None]
    got = triplet_attention_naive(*(x[None, None] for x in (q, k1, k2, v1, v2)), block_size=b, overlap=ov, scale=scale)
    torch.testing.assert_close(got[0, 0], ref)


# --------------------------------------------------------------------------------------- fast == naive
@pytest.mark.parametrize("L,b,ov,pad,chunk", [
    (8, 4, 0.0, 0, None),
    (11, 4, 0.25, 3, None),
    (13, 5, 0.5, 2, 7),       # one window and one query row per tile
    (13, 5, 0.5, 2, 60),      # row tiles of 2, 2, 1 inside a window (a short last tile)
    (13, 5, 0.5, 2, 375),     # 3 whole windows per tile, 20 (batch, head, window) triples: a short last tile
    (17, 6, 0.3, 5, 50),
    (3, 8, 0.0, 1, None),     # L < block: one window
    (8, 8, 0.0, 3, 1),        # one window, one row per tile
    (12, 3, 0.0, 7, None),    # a fully padded window
])
def test_fast_matches_naive_fp64_with_grads(L, b, ov, pad, chunk):
    if chunk in (60, 375):  # the tiling these cases are there for
        from hoformer.functional.triplet import _tile_rows, _window_index

        w = _window_index(L, b, ov, torch.device("cpu")).shape[0]
        assert _tile_rows(2 * 2 * w, b, 4, chunk) == ((1, 2) if chunk == 60 else (3, b)) and (2 * 2 * w) % 3
    _assert_fast_matches_naive(_qkv(L=L, grad=True), chunk, block_size=b, overlap=ov, mask=_mask(2, L, pad))


def _assert_fast_matches_naive(x, chunk, **kw):
    """Outputs and the five input gradients of the fast kernel (``chunk_elements=chunk``) equal the naive reference."""
    fast = triplet_attention(*x, **kw, **({} if chunk is None else {"chunk_elements": chunk}))
    ref = triplet_attention_naive(*x, **kw)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(ref)
    for a, r in zip(torch.autograd.grad(fast, x, g), torch.autograd.grad(ref, x, g)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def test_masking_semantics():
    x = _qkv(L=10)
    m = _mask(2, 10, 3)
    out = triplet_attention(*x, block_size=4, overlap=0.25, mask=m)
    assert (out[0, :, 7:] == 0).all()  # padded queries -> zeros
    y = [t.clone() for t in x]
    for t in y:
        t[0, :, 7:] = 1e3 * torch.randn_like(t[0, :, 7:])  # arbitrary content in padded positions
    torch.testing.assert_close(triplet_attention(*y, block_size=4, overlap=0.25, mask=m), out)


def test_rows_sum_to_one_and_padded_keys_get_no_weight():
    q, k1, k2 = _qkv(L=10, n=3)
    m = _mask(2, 10, 3)
    a = triplet_attention_weights(q, k1, k2, block_size=4, overlap=0.5, mask=m)  # b h w i j l
    idx = torch.tensor(triplet_windows(10, 4, 0.5))[:, None] + torch.arange(4)
    mw = m[:, idx]  # b w s
    sums = a.sum((-1, -2))
    torch.testing.assert_close(sums, mw[:, None].to(F64).expand_as(sums))
    pad_j = ~mw[:, None, :, None, :, None]
    pad_l = ~mw[:, None, :, None, None, :]
    assert (a.masked_select(pad_j.expand_as(a)) == 0).all() and (a.masked_select(pad_l.expand_as(a)) == 0).all()


def test_full_3d_is_one_window():
    L, scale = 7, 0.5
    x = _qkv(L=L)
    q, k1, k2, v1, v2 = x
    t = torch.einsum("bhid,bhjd,bhld->bhijl", q, k1, k2) * scale
    a = t.flatten(-2).softmax(-1).view_as(t)
    ref = torch.einsum("bhijl,bhjd,bhld->bhid", a, v1, v2)
    for bs in (L, L + 5):
        torch.testing.assert_close(triplet_attention(*x, block_size=bs, scale=scale), ref)
    w = triplet_attention_weights(q, k1, k2, block_size=L, scale=scale)
    assert w.shape == (2, 2, 1, L, L, L)
    torch.testing.assert_close(w[:, :, 0], a)


def test_gradcheck_tiny():
    x = _qkv(B=1, H=1, L=7, D=2, grad=True)
    m = torch.tensor([[1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda *t: triplet_attention(*t, block_size=3, overlap=0.34, mask=m, chunk_elements=5), x)


def test_fp32_and_bf16_dtype_and_accuracy():
    x = _qkv(B=2, H=2, L=40, D=8, dtype=torch.float32)
    ref = triplet_attention_naive(*[t.double() for t in x], block_size=16, overlap=0.25)
    out = triplet_attention(*x, block_size=16, overlap=0.25)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    xb = [t.bfloat16() for t in x]
    ob = triplet_attention(*xb, block_size=16, overlap=0.25)
    assert ob.dtype == torch.bfloat16
    # against the exact result on the bf16-rounded inputs: what is left is bf16 arithmetic and the rounding of the
    # output (measured max error 2-5e-3 on outputs of std ~0.16 over 5 seeds)
    ref_b = triplet_attention_naive(*[t.double() for t in xb], block_size=16, overlap=0.25)
    torch.testing.assert_close(ob.double(), ref_b, rtol=0, atol=1e-2)


def test_autocast_region_does_not_lower_the_kernel_precision():
    """Inside a bf16 autocast region the kernel still computes its scores, softmax and log-sum-exp in fp32, forward
    and backward alike (an autocast-lowered forward with an fp32 backward recompute gave rows summing to 0.9-1.2
    and ~10% gradient errors); fp32 inputs therefore give the fp32 result and gradients."""
    x = [t * 2 for t in _qkv(B=2, H=2, L=24, D=16, dtype=torch.float32)]
    m = torch.ones(2, 24, dtype=torch.bool)
    m[1, 20:] = False

    def run(autocast: bool):
        xs = [t.detach().requires_grad_() for t in x]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = triplet_attention(*xs, block_size=8, overlap=0.25, mask=m)
        y.backward(torch.ones_like(y))
        return y, [t.grad for t in xs]

    (y32, g32), (yac, gac) = run(False), run(True)
    assert yac.dtype == torch.float32
    torch.testing.assert_close(yac, y32, rtol=1e-5, atol=1e-6)
    for a, b in zip(gac, g32):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_window_index_cache_survives_inference_mode():
    """The per-shape window index is cached; one first built under ``torch.inference_mode`` (Lightning's validation
    sanity check) must still work in a later differentiable call (indexing saves the index for backward)."""
    x = _qkv(B=1, H=1, L=13, D=4, dtype=torch.float32)
    for fn in (triplet_attention, block_attention):
        with torch.inference_mode():
            fn(*x[: 5 if fn is triplet_attention else 3], block_size=5, overlap=0.4)
        xs = [t.clone().requires_grad_() for t in x]
        fn(*xs[: 5 if fn is triplet_attention else 3], block_size=5, overlap=0.4).sum().backward()
        assert xs[0].grad is not None


def test_saves_no_cubes_for_backward():
    """Autograd keeps O(B H L D) for the fast kernel (inputs, window outputs, log-sum-exp), not the cubes."""
    x = _qkv(B=1, H=2, L=64, D=4, dtype=torch.float32, grad=True)
    sizes = {}

    def pack(t):
        sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def saved(fn):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*x, block_size=16, overlap=0.25)
        return sum(sizes.values())

    inputs = sum(t.numel() * t.element_size() for t in x)
    fast, naive = saved(triplet_attention), saved(triplet_attention_naive)
    assert fast <= 3 * inputs, (fast, inputs)
    assert naive > 10 * fast


@pytest.mark.parametrize("kw,err,match", [
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=2.5), ValueError, "block_size"),
    (dict(block_size=4, overlap=1.0), ValueError, "overlap"),
    (dict(block_size=4, overlap=-0.1), ValueError, "overlap"),
    (dict(block_size=4, mask=torch.ones(2, 9, dtype=torch.bool)), ValueError, "mask"),
    (dict(block_size=4, mask=torch.ones(2, 10)), TypeError, "mask"),
    (dict(block_size=4, chunk_elements=0), ValueError, "chunk_elements"),
])
def test_bad_arguments(kw, err, match):
    x = _qkv(L=10)
    with pytest.raises(err, match=match):
        triplet_attention(*x, **kw)


def test_bad_tensors():
    q, k1, k2, v1, v2 = _qkv(L=10)
    with pytest.raises(ValueError, match=r"`k2`.*shape"):
        triplet_attention(q, k1, k2[:, :, :9], v1, v2, block_size=4)
    with pytest.raises(ValueError, match=r"\(B, H, L, D\)"):
        triplet_attention(q[0], k1[0], k2[0], v1[0], v2[0], block_size=4)
    with pytest.raises(TypeError, match="`v1`"):
        triplet_attention(q, k1, k2, v1.numpy(), v2, block_size=4)
    with pytest.raises(TypeError, match="floating"):
        triplet_attention(q.long(), k1, k2, v1, v2, block_size=4)


# ------------------------------------------------------------------------------------- 2D and cross-block
def test_block_attention_matches_loop():
    q, k, v = _qkv(L=11, n=3)
    m = _mask(2, 11, 3)
    out = block_attention(q, k, v, block_size=4, overlap=0.25, mask=m)
    a = block_attention_weights(q, k, block_size=4, overlap=0.25, mask=m)
    ref = torch.zeros_like(q)
    cnt = torch.zeros(11, dtype=F64)
    for s in triplet_windows(11, 4, 0.25):
        sl = slice(s, s + 4)
        t = (q[:, :, sl] @ k[:, :, sl].transpose(-1, -2)) * 4**-0.5
        t = t.masked_fill(~m[:, None, None, sl], float("-inf"))
        ref[:, :, sl] += t.softmax(-1).nan_to_num(0) @ v[:, :, sl]
        cnt[sl] += 1
    ref = ref / cnt[:, None] * m[:, None, :, None]
    torch.testing.assert_close(out, ref)
    assert a.shape == (2, 2, 4, 4, 4)
    idx = torch.tensor(triplet_windows(11, 4, 0.25))[:, None] + torch.arange(4)  # w s
    torch.testing.assert_close(a.sum(-1), m[:, idx][:, None].expand(-1, 2, -1, -1).to(F64))  # real query rows: 1


def test_cross_block_matches_equations():
    o = torch.randn(2, 2, 10, 4, dtype=F64)
    m = _mask(2, 10, 5)  # sample 0: tokens 5..9 padded -> block 2 (8, 9) has no real token
    out = cross_block_attention(o * m[:, None, :, None], block_size=4, mask=m)
    a = cross_block_attention_weights(o * m[:, None, :, None], block_size=4, mask=m)
    for bi in range(2):
        om = o[bi] * m[bi, None, :, None]
        blocks = [range(s, min(s + 4, 10)) for s in (0, 4, 8)]
        real = [[i for i in blk if m[bi, i]] for blk in blocks]
        r = torch.stack([om[:, idx].mean(1) if idx else torch.zeros(2, 4, dtype=F64) for idx in real], 1)  # h m d
        t = (r @ r.transpose(-1, -2)) * 0.5
        t[..., [not idx for idx in real]] = float("-inf")
        att = t.softmax(-1)
        ref = om + (att @ r)[:, torch.arange(10) // 4] * m[bi, None, :, None]
        torch.testing.assert_close(out[bi], ref)
        torch.testing.assert_close(a[bi], att)


# -------------------------------------------------------------------------------------------------- layers
@pytest.mark.parametrize("name", ["hoba", "triplet_full", "block2d", "full2d"])
def test_text_attention_layers(name):
    layer = build_text_attention(name, 16, 2, block_size=4, overlap=0.25).double()
    x = torch.randn(2, 10, 16, dtype=F64)
    m = _mask(2, 10, 3)
    with record_attention(layer) as rec:
        y = layer(x, mask=m)
    maps = rec[0][1]
    assert y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(layer(x, mask=m), y)
    # blocked: the fixed grid [0, 4), [3, 7), [6, 10), [9, 13) (padded to 13), not the functional's end window [6, 10)
    local = {"hoba": (2, 2, 4, 4, 4, 4), "triplet_full": (2, 2, 1, 10, 10, 10), "block2d": (2, 2, 4, 4, 4),
             "full2d": (2, 2, 10, 10)}[name]
    assert maps[0].shape == local
    if name in ("hoba", "block2d"):
        assert maps[1].shape == (2, 2, 3, 3)
    with record_attention(layer) as rec:
        layer(x, mask=m)
    assert len(rec) == 1 and rec[0][1][0].shape == local


def test_hoba_layer_is_triplet_then_cross_block():
    """HOBA = the triplet local outputs (eqs 1-4) + cross-block attention (eqs 5-7), then W_O. (The triplet and 2D
    layers themselves are checked against loop references in test_hoba_reference.py.)"""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 16, dtype=F64)
    m = _mask(2, 9, 2)
    hc = HOBAttention(16, 2, block_size=4).double()
    xs = hc.to_in(x).view(2, 9, 5, 2, 8).permute(2, 0, 3, 1, 4)
    g = triplet_grid_length(9, 4, 0.25)  # 10: the layer pads to the fixed window grid, then crops
    assert g == 10
    o = triplet_attention(*(torch.nn.functional.pad(t, (0, 0, 0, 1)) for t in xs), block_size=4, overlap=0.25,
                          mask=torch.nn.functional.pad(m, (0, 1)))[:, :, :9]
    o = cross_block_attention(o, block_size=4, mask=m)
    torch.testing.assert_close(hc(x, mask=m), hc.to_out(o.transpose(1, 2).reshape(2, 9, 16)))
    assert isinstance(hc.cross, CrossBlockAttention)


def test_layer_bad_input_and_block():
    layer = HOBAttention(16, 2, block_size=4)
    with pytest.raises(ValueError, match="mask"):
        layer(torch.randn(2, 9, 16), mask=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, L, 16\)"):
        layer(torch.randn(2, 9, 8))
    with pytest.raises(ValueError, match="divisible"):
        HOBAttention(15, 2)
    with pytest.raises(ValueError, match="unknown attention"):
        build_text_attention("nope", 16, 2)
    blk = HOBABlock(16, 2, attention="hoba", block_size=4, overlap=0.25)
    y = blk(torch.randn(2, 9, 16), mask=_mask(2, 9, 2))
    y.sum().backward()
    assert all(p.grad is not None for p in blk.parameters())


def test_full2d_all_padding_sample_with_maps_is_finite():
    layer = BlockAttention2D(16, 2, block_size=None).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False  # sample 1 is all padding
    with record_attention(layer) as rec:
        y = layer(x, mask=mask)
    maps = rec[0][1]
    assert torch.isfinite(y).all() and all(torch.isfinite(m).all() for m in maps)
    torch.testing.assert_close(y, layer(x, mask=mask))  # the explicit (maps) path equals the SDPA path


# ----------------------------------------------------------------------------- errors of the other entry points
def test_block_and_weights_errors_name_their_own_arguments():
    q, k, v = _qkv(L=10, n=3)
    with pytest.raises(ValueError, match=r"block_attention: `v` must have the shape of `q` \(2, 2, 10, 4\), got "
                                         r"\(2, 2, 9, 4\)"):
        block_attention(q, k, v[:, :, :9], block_size=4)
    with pytest.raises(ValueError, match=r"block_attention: `k` is torch.float32.*expected `q`'s torch.float64"):
        block_attention(q, k.float(), v, block_size=4)
    with pytest.raises(ValueError, match=r"block_attention: `block_size` must be an int >= 1, got 0"):
        block_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match=r"block_attention: `overlap` must be a float in \[0, 1\), got 1.0"):
        block_attention(q, k, v, block_size=4, overlap=1.0)
    with pytest.raises(TypeError, match=r"block_attention: `mask` must be a bool tensor.*torch.int64"):
        block_attention(q, k, v, block_size=4, mask=torch.ones(2, 10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"block_attention: `mask` must have shape \(B, L\) = \(2, 10\), got \(2, 11\)"):
        block_attention(q, k, v, block_size=4, mask=torch.ones(2, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"triplet_attention_weights: `k2` must have the shape of `q`"):
        triplet_attention_weights(q, k, v[:, :1], block_size=4)
    with pytest.raises(ValueError, match=r"triplet_attention: `k1` is torch.float32 on cpu, expected `q`'s "
                                         r"torch.float64"):
        triplet_attention(q, k.float(), k, v, v, block_size=4)


def test_cross_block_errors():
    o = torch.randn(2, 2, 10, 4, dtype=F64)
    with pytest.raises(TypeError, match=r"`o` must be a floating-point tensor.*torch.int64"):
        cross_block_attention(o.long(), block_size=4)
    with pytest.raises(TypeError, match=r"`o` must be a floating-point tensor.*ndarray"):
        cross_block_attention(o.numpy(), block_size=4)
    with pytest.raises(ValueError, match=r"`o` must have shape \(B, H, L, D\).*got \(2, 10, 4\)"):
        cross_block_attention(o[0], block_size=4)
    with pytest.raises(ValueError, match=r"`block_size` must be an int >= 1, got 0"):
        cross_block_attention(o, block_size=0)
    with pytest.raises(TypeError, match=r"`mask` must be a bool tensor.*torch.float32"):
        cross_block_attention(o, block_size=4, mask=torch.ones(2, 10))
    with pytest.raises(ValueError, match=r"`mask` must have shape \(B, L\) = \(2, 10\), got \(2, 9\)"):
        cross_block_attention(o, block_size=4, mask=torch.ones(2, 9, dtype=torch.bool))


@pytest.mark.parametrize("name", ["hoba", "triplet_full", "block2d", "full2d"])
def test_layer_maps_are_normalised_attention(name):
    """Returned maps are attention weights: local rows sum to 1 for real queries and 0 for padded ones, cross-block
    rows sum to 1 over blocks; padded keys get no weight."""
    layer = build_text_attention(name, 16, 2, block_size=4, overlap=0.25).double()
    m = _mask(2, 10, 3)
    with record_attention(layer) as rec:
        layer(torch.randn(2, 10, 16, dtype=F64), mask=m)
    maps = rec[0][1]
    local = maps[0]
    if name == "full2d":
        sums, keys = local.sum(-1), m[:, None, None, :].expand_as(local)
        torch.testing.assert_close(sums, m[:, None, :].to(F64).expand_as(sums))
    else:
        idx = torch.tensor(layer.window_starts(10))[:, None] + torch.arange(local.shape[3])
        mp = torch.nn.functional.pad(m, (0, int(idx.max()) + 1 - 10))  # the grid's padding is masked
        mw = mp[:, idx]  # b w s
        sums = local.flatten(4).sum(-1)  # b h w s
        torch.testing.assert_close(sums, mw[:, None].to(F64).expand_as(sums))
        keys = mw[:, None, :, None, :].expand(local.shape[:5])
        if local.ndim == 6:
            keys = (keys[..., :, None] & mw[:, None, :, None, None, :]).expand_as(local)
    assert (local[~keys] == 0).all()
    if name in ("hoba", "block2d"):
        torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 2, 3, dtype=F64))
        assert (maps[1][0, :, :, 2] == 0).all()  # sample 0: block 2 (tokens 8, 9) is all padding: no weight
        assert (maps[1][1] > 0).all()


@pytest.mark.parametrize("L,b,ov", [(1, 4, 0.0), (8, 4, 0.0), (13, 5, 0.5), (17, 6, 0.3), (128, 32, 0.25)])
def test_window_count_is_the_coverage_of_the_window_index(L, b, ov):
    """The host-counted divisor of eq 4 (no bincount, no device sync) = how often each token is in a window."""
    from hoformer.functional.triplet import _window_count, _window_index

    idx = _window_index(L, b, ov, torch.device("cpu"))
    count = _window_count(L, b, ov, torch.device("cpu"))
    torch.testing.assert_close(count, torch.bincount(idx.flatten(), minlength=L).float())
    assert (count >= 1).all()


def test_torch_compile_of_a_hoba_model_matches_eager():
    """The triplet / block / cross-block kernels are opaque to torch.compile (torch.compiler.disable); a compiled
    HOBA classifier (eager backend: Dynamo only) gives the eager logits and gradients."""
    from hoformer.models import create_model

    torch.manual_seed(0)
    m = create_model("hoba_classifier", vocab_size=50, num_classes=2, max_len=32, dim=16, depth=1, num_heads=2,
                     block_size=8).eval()  # no dropout: the two runs must see the same network
    ids, mask = torch.randint(0, 50, (2, 20)), torch.ones(2, 20, dtype=torch.bool)
    mask[1, 15:] = False
    torch._dynamo.reset()
    y = torch.compile(m, backend="eager")(ids, mask)
    g = torch.autograd.grad(y.sum(), list(m.parameters()))
    y0 = m(ids, mask)
    g0 = torch.autograd.grad(y0.sum(), list(m.parameters()))
    torch.testing.assert_close(y, y0)
    for a, b in zip(g, g0):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("scale,chunk", [(0.37, None), (1.3, 60)])
def test_fast_gradients_use_the_given_scale(scale, chunk):
    """The backward takes the forward's ``scale`` (folded into the queries), not the default ``D ** -0.5``: gradients
    with a non-default scale equal the naive reference's (whole windows and row chunks)."""
    torch.manual_seed(3)
    _assert_fast_matches_naive(_qkv(L=13, grad=True), chunk, block_size=5, overlap=0.5, mask=_mask(2, 13, 2),
                               scale=scale)
