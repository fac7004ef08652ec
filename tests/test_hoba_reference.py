"""HOBA (paper 004, section 3.2, eqs 2-7, Algorithm 1) against explicit float64 loops written from the equations.

Every reference here loops over windows / blocks / tokens with Python scalars or per-vector torch ops, so a bug in a
vectorised path (wrong scale, wrong softmax axis, wrong window set, mean vs sum over covering windows, masks applied
on one axis only, head / projection layout) cannot also be in the reference.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hoformer.functional import (
    block_attention,
    block_attention_weights,
    cross_block_attention,
    cross_block_attention_weights,
    triplet_attention,
    triplet_attention_naive,
    triplet_attention_weights,
)
from hoformer.layers import TEXT_ATTENTIONS, BlockAttention2D, CrossBlockAttention, HOBABlock, TripletAttention
from hoformer.layers import build_text_attention, record_attention

F64 = torch.float64


def _windows(L, b, ov):
    """Eq 3 written out: starts 0, stride, 2 stride, ... with stride round(b (1 - ov)), plus a final window flush
    with the end when the strided ones leave a tail (the documented convention); one window when L <= b."""
    if L <= b:
        return [(0, L)]
    stride = max(1, round(b * (1 - ov)))
    out, s = [], 0
    while s + b <= L:
        out.append((s, s + b))
        s += stride
    if out[-1][1] < L:
        out.append((L - b, L))
    return out


def _rand(*shape):
    return torch.randn(*shape, dtype=F64)


def _mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


# ------------------------------------------------------------------------------------------ loop references
def loop_triplet(q, k1, k2, v1, v2, b, ov, scale, mask=None):
    """Eqs 2-4 per (batch, head): for each window, T[i,j,l] = scale sum_d q_i k1_j k2_l, softmax over the real
    (j, l) pairs, C_i = sum A[i,j,l] v1_j * v2_l; o_i = mean over the windows covering i; padded i -> 0."""
    B, H, L, D = q.shape
    out = torch.zeros(B, H, L, D, dtype=F64)
    for bi in range(B):
        real = [True] * L if mask is None else mask[bi].tolist()
        for h in range(H):
            acc = [torch.zeros(D, dtype=F64) for _ in range(L)]
            cnt = [0] * L
            for s, e in _windows(L, b, ov):
                for i in range(s, e):
                    cnt[i] += 1
                    if not real[i]:
                        continue
                    pairs = [(j, l) for j in range(s, e) for l in range(s, e) if real[j] and real[l]]
                    t = [scale * float((q[bi, h, i] * k1[bi, h, j] * k2[bi, h, l]).sum()) for j, l in pairs]
                    mx = max(t)
                    z = sum(math.exp(x - mx) for x in t)
                    for (j, l), x in zip(pairs, t):
                        acc[i] += math.exp(x - mx) / z * v1[bi, h, j] * v2[bi, h, l]
            for i in range(L):
                out[bi, h, i] = acc[i] / cnt[i]
    return out


def loop_block2d(q, k, v, b, ov, scale, mask=None):
    """Pairwise softmax inside the same windows, mean over covering windows, padded queries 0; also the per-window
    maps (zeros on padded query rows and padded key columns)."""
    B, H, L, D = q.shape
    wins = _windows(L, b, ov)
    s_ = wins[0][1] - wins[0][0]
    out = torch.zeros(B, H, L, D, dtype=F64)
    maps = torch.zeros(B, H, len(wins), s_, s_, dtype=F64)
    for bi in range(B):
        real = [True] * L if mask is None else mask[bi].tolist()
        for h in range(H):
            for w, (s, e) in enumerate(wins):
                for i in range(s, e):
                    if not real[i]:
                        continue
                    keys = [j for j in range(s, e) if real[j]]
                    t = [scale * float(q[bi, h, i] @ k[bi, h, j]) for j in keys]
                    mx = max(t)
                    z = sum(math.exp(x - mx) for x in t)
                    for j, x in zip(keys, t):
                        a = math.exp(x - mx) / z
                        maps[bi, h, w, i - s, j - s] = a
                        out[bi, h, i] += a * v[bi, h, j]
            cnt = [sum(s <= i < e for s, e in wins) for i in range(L)]
            for i in range(L):
                out[bi, h, i] /= cnt[i]
    return out, maps


def loop_cross(o, b, scale, mask=None):
    """Eqs 5-7: r_m = mean of the real tokens of block [m b, (m+1) b); A[m, m'] = softmax over the non-empty blocks
    m' of scale r_m . r_m'; o_i + sum_m' A[m(i), m'] r_m' for real i (padded i unchanged)."""
    B, H, L, D = o.shape
    M = -(-L // b)
    out = o.clone()
    att = torch.zeros(B, H, M, M, dtype=F64)
    for bi in range(B):
        real = [True] * L if mask is None else mask[bi].tolist()
        for h in range(H):
            r, nonempty = [], []
            for m in range(M):
                toks = [i for i in range(m * b, min((m + 1) * b, L)) if real[i]]
                nonempty.append(bool(toks))
                r.append(sum((o[bi, h, i] for i in toks), torch.zeros(D, dtype=F64)) / max(len(toks), 1))
            for m in range(M):
                t = {m2: scale * float(r[m] @ r[m2]) for m2 in range(M) if nonempty[m2]}
                mx = max(t.values())
                z = sum(math.exp(x - mx) for x in t.values())
                for m2, x in t.items():
                    att[bi, h, m, m2] = math.exp(x - mx) / z
            for i in range(L):
                if real[i]:
                    out[bi, h, i] = o[bi, h, i] + sum(att[bi, h, i // b, m2] * r[m2] for m2 in range(M))
    return out, att


# ------------------------------------------------------------------------------------------ functional
MASKS = {
    "none": None,
    "tail": [[1] * 9 + [0] * 2, [1] * 11],
    "holes": [[1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]],  # non-prefix padding
    "empty_window": [[1, 1, 1] + [0] * 8, [1] * 11],  # windows / blocks with no real token
}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("b,ov,scale", [(4, 0.25, None), (3, 0.5, 0.37), (5, 0.0, 1.3), (11, 0.0, None),
                                        (16, 0.0, 0.8)])
def test_triplet_fast_and_naive_match_loop(mask, b, ov, scale):
    torch.manual_seed(1)
    x = [_rand(2, 2, 11, 3) for _ in range(5)]
    m = None if MASKS[mask] is None else _mask(MASKS[mask])
    ref = loop_triplet(*x, b, ov, 3**-0.5 if scale is None else scale, m)
    kw = dict(block_size=b, overlap=ov, scale=scale, mask=m)
    torch.testing.assert_close(triplet_attention_naive(*x, **kw), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(triplet_attention(*x, **kw), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(triplet_attention(*x, **kw, chunk_elements=5), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale", [None, 0.61])
def test_triplet_weights_match_loop_and_are_the_kernels_weights(scale):
    """``triplet_attention_weights`` cubes: the loop's softmax over real (j, l) pairs, zero rows for padded queries,
    and contracted with v1 (x) v2 and averaged over windows they give ``triplet_attention``'s output."""
    torch.manual_seed(2)
    q, k1, k2, v1, v2 = (_rand(2, 1, 7, 3) for _ in range(5))
    m = _mask([[1, 1, 0, 1, 1, 1, 0], [1] * 7])
    sc = 3**-0.5 if scale is None else scale
    a = triplet_attention_weights(q, k1, k2, block_size=4, overlap=0.5, scale=scale, mask=m)
    wins = _windows(7, 4, 0.5)
    assert a.shape == (2, 1, len(wins), 4, 4, 4)
    for bi in range(2):
        real = m[bi].tolist()
        for w, (s, e) in enumerate(wins):
            for i in range(s, e):
                ref = torch.zeros(4, 4, dtype=F64)
                if real[i]:
                    for j in range(s, e):
                        for l in range(s, e):
                            if real[j] and real[l]:
                                ref[j - s, l - s] = math.exp(sc * float((q[bi, 0, i] * k1[bi, 0, j] * k2[bi, 0, l]).sum()))
                    ref /= ref.sum()
                torch.testing.assert_close(a[bi, 0, w, i - s], ref, rtol=1e-12, atol=1e-14)
    out = torch.zeros_like(q)
    cnt = torch.zeros(7, dtype=F64)
    for w, (s, e) in enumerate(wins):
        out[:, :, s:e] += torch.einsum("bhijl,bhjd,bhld->bhid", a[:, :, w], v1[:, :, s:e], v2[:, :, s:e])
        cnt[s:e] += 1
    torch.testing.assert_close(triplet_attention(q, k1, k2, v1, v2, block_size=4, overlap=0.5, scale=scale, mask=m),
                               out / cnt[:, None], rtol=1e-12, atol=1e-12)


def test_overlap_average_is_mean_of_independent_windows():
    """Eq 4 without any shared code: each window on its own by the explicit loop of eqs 2-3 (one window, block = its
    length, the default scale D^-0.5); a token covered by k windows gets the mean of its k outputs."""
    torch.manual_seed(3)
    x = [_rand(1, 2, 10, 4) for _ in range(5)]
    wins = _windows(10, 4, 0.5)  # [0,4) [2,6) [4,8) [6,10): tokens 2..7 are in two windows
    per = {i: [] for i in range(10)}
    for s, e in wins:
        c = loop_triplet(*(t[:, :, s:e] for t in x), e - s, 0.0, 4**-0.5)
        for i in range(s, e):
            per[i].append(c[:, :, i - s])
    out = triplet_attention(*x, block_size=4, overlap=0.5)
    assert [len(per[i]) for i in range(10)] == [1, 1, 2, 2, 2, 2, 2, 2, 1, 1]
    for i in range(10):
        torch.testing.assert_close(out[:, :, i], sum(per[i]) / len(per[i]), rtol=1e-12, atol=1e-12)


def test_triplet_full_is_one_window_over_the_sequence():
    torch.manual_seed(4)
    x = [_rand(1, 1, 6, 2) for _ in range(5)]
    m = _mask([[1, 1, 1, 1, 0, 1]])
    ref = loop_triplet(*x, 6, 0.0, 0.9, m)
    for b in (6, 7, 100):
        torch.testing.assert_close(triplet_attention(*x, block_size=b, scale=0.9, mask=m), ref, rtol=1e-12, atol=1e-12)
    # and it is not the blocked result
    assert (triplet_attention(*x, block_size=3, scale=0.9, mask=m) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("b,ov,scale", [(4, 0.25, None), (3, 0.5, 0.37), (5, 0.0, 1.3), (16, 0.0, None)])
def test_block2d_matches_loop_outputs_and_maps(mask, b, ov, scale):
    torch.manual_seed(5)
    q, k, v = (_rand(2, 2, 11, 3) for _ in range(3))
    m = None if MASKS[mask] is None else _mask(MASKS[mask])
    ref, ref_maps = loop_block2d(q, k, v, b, ov, 3**-0.5 if scale is None else scale, m)
    out = block_attention(q, k, v, block_size=b, overlap=ov, scale=scale, mask=m)
    maps = block_attention_weights(q, k, block_size=b, overlap=ov, scale=scale, mask=m)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(maps, ref_maps, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("b,scale", [(4, None), (3, 0.45), (11, None), (20, 2.0)])
def test_cross_block_matches_loop(mask, b, scale):
    torch.manual_seed(6)
    o = _rand(2, 2, 11, 3)
    m = None if MASKS[mask] is None else _mask(MASKS[mask])
    if m is not None:
        o = o * m[:, None, :, None]  # as the local attention returns them
    ref, ref_att = loop_cross(o, b, 3**-0.5 if scale is None else scale, m)
    out = cross_block_attention(o, block_size=b, mask=m, scale=scale)
    att = cross_block_attention_weights(o, block_size=b, mask=m, scale=scale)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(att, ref_att, rtol=1e-12, atol=1e-14)
    if scale is None:  # the layer wrapper: default scale 1 / sqrt(per-head dim)
        torch.testing.assert_close(CrossBlockAttention(b)(o, mask=m), ref, rtol=1e-12, atol=1e-12)


def test_cross_block_and_block2d_gradcheck():
    torch.manual_seed(7)
    m = _mask([[1, 1, 1, 0, 1, 1, 0]])
    o = _rand(1, 1, 7, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: cross_block_attention(t, block_size=3, mask=m, scale=0.8), (o,))
    qkv = [_rand(1, 1, 7, 2).requires_grad_() for _ in range(3)]
    assert torch.autograd.gradcheck(lambda *t: block_attention(*t, block_size=3, overlap=0.34, mask=m, scale=0.7),
                                    qkv)


# ------------------------------------------------------------------------------------------------ layers
def _proj(layer, x, p, h):
    """Projection ``p`` (0 = q, 1 = k1/k, ...) of head ``h`` from the fused ``to_in`` weight, written out: rows
    ``(p * heads + h) * e ... + e`` of W (the fused layout is (proj, head, feature))."""
    e = layer.dim_head
    r = slice((p * layer.heads + h) * e, (p * layer.heads + h + 1) * e)
    return x @ layer.to_in.weight[r].T + layer.to_in.bias[r]


@torch.no_grad()
def _layer_ref(layer, x, mask, kind):
    """The layers' window rule: the fixed grid of eq 3, windows ``[m s, m s + b)`` for every start ``m s < L``
    (positions past ``L`` are absent, i.e. masked padding); the unblocked variants: one window."""
    B, L0, dim = x.shape
    if layer.block_size is not None:
        stride = max(1, round(layer.block_size * (1 - layer.overlap)))
        grid = ((L0 - 1) // stride) * stride + layer.block_size if L0 > stride else L0  # last grid start + block
        mask = torch.ones(B, L0, dtype=torch.bool) if mask is None else mask
        x, mask = F.pad(x, (0, 0, 0, grid - L0)), F.pad(mask, (0, grid - L0))
    B, L, dim = x.shape
    heads = []
    for h in range(layer.heads):
        if kind in ("hoba", "triplet_full"):
            q, k1, k2, v1, v2 = (_proj(layer, x, p, h)[:, None] for p in range(5))
            b = layer.block_size or L
            o = loop_triplet(q, k1, k2, v1, v2, b, layer.overlap, layer.dim_head**-0.5, mask)
        else:
            q, k, v = (_proj(layer, x, p, h)[:, None] for p in range(3))
            b = layer.block_size or L
            o = loop_block2d(q, k, v, b, layer.overlap, layer.dim_head**-0.5, mask)[0]
        o = o[:, :, :L0]
        if layer.cross is not None:  # on the real length (the block grid of eqs 5-7 does not move)
            o = loop_cross(o, layer.block_size, layer.dim_head**-0.5, None if mask is None else mask[:, :L0])[0]
        heads.append(o[:, 0])
    cat = torch.cat(heads, -1)  # head-major feature order
    lin = layer.to_out[0]
    return cat @ lin.weight.T + lin.bias


LAYERS = [
    ("hoba", dict(block_size=4, overlap=0.25, cross_block=True)),
    ("hoba", dict(block_size=3, overlap=0.5, cross_block=False)),
    ("triplet_full", {}),
    ("block2d", dict(block_size=4, overlap=0.5, cross_block=True)),
    ("block2d", dict(block_size=3, overlap=0.0, cross_block=False)),
    ("full2d", {}),
]


@pytest.mark.parametrize("name,kw", LAYERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(LAYERS)])
def test_text_attention_layer_matches_loop(name, kw):
    """Fused projections -> per-head local attention (eqs 2-4 or the 2D baseline) -> cross-block (eqs 5-7) on each
    head's normalised outputs -> concat heads -> W_O, against the loop references with the layer's own weights."""
    torch.manual_seed(8)
    layer = build_text_attention(name, 8, 2, **kw).double().eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = _rand(2, 10, 8)
    m = _mask([[1] * 7 + [0] * 3, [1, 1, 0, 1, 1, 1, 1, 1, 1, 1]])
    ref = _layer_ref(layer, x, m, name)
    torch.testing.assert_close(layer(x, mask=m), ref, rtol=1e-10, atol=1e-10)
    with record_attention(layer) as rec:  # the explicit-map path gives the same output
        y = layer(x, mask=m)
    assert len(rec) == 1 and rec[0][1]
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer(x), _layer_ref(layer, x, None, name), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", TEXT_ATTENTIONS)
def test_layer_output_does_not_depend_on_the_batch_padding(name):
    """A sentence's outputs are the same whatever its batch is padded to (fixed window grid): with the functional's
    end-aligned last window the blocked layers moved by up to 0.03 in logits between pad lengths 20 / 24 / 30 / 48,
    so accuracy depended on eval_batch_size."""
    torch.manual_seed(11)
    layer = build_text_attention(name, 8, 2, block_size=16, overlap=0.25).double().eval()
    x = _rand(1, 48, 8)
    ref = layer(x[:, :20])  # unpadded, no mask
    for L in (21, 24, 28, 30, 48):
        m = torch.zeros(1, L, dtype=torch.bool)
        m[:, :20] = True
        torch.testing.assert_close(layer(x[:, :L], mask=m)[:, :20], ref, rtol=1e-12, atol=1e-12, msg=f"L={L}")


@pytest.mark.parametrize("name", TEXT_ATTENTIONS)
def test_layer_padding_every_attention_type(name):
    """Layer-level key padding: padded positions' content changes nothing at real positions, padded queries come
    out as exactly zero (no bias), and real outputs equal those of the sequence with the padding cut off when the
    padding is a tail (blocks and windows then coincide)."""
    torch.manual_seed(9)
    layer = build_text_attention(name, 8, 2, block_size=4, overlap=0.25, bias=False).double().eval()
    x = _rand(2, 12, 8)
    m = torch.ones(2, 12, dtype=torch.bool)
    m[0, 8:] = False
    m[1, [2, 5]] = False
    y = layer(x, mask=m)
    x2 = x.clone()
    x2[~m] = 100 * _rand(int((~m).sum()), 8)
    with record_attention(layer) as rec:
        y2 = layer(x2, mask=m)
    maps = rec[0][1]
    torch.testing.assert_close(y2, y, rtol=1e-12, atol=1e-12)
    assert (y[~m] == 0).all() and (y[m].abs() > 0).all(dim=-1).all()
    # tail padding with block-aligned, non-overlapping windows: same as cutting the padding off
    flat = build_text_attention(name, 8, 2, block_size=4, overlap=0.0, bias=False).double().eval()
    flat.load_state_dict(layer.state_dict())
    torch.testing.assert_close(flat(x[:1, :8])[0], flat(x, mask=m)[0, :8], rtol=1e-12, atol=1e-12)
    local = maps[0]
    if local.ndim == 4:  # full 2D (B, H, L, L): padded keys get no weight
        assert (local[1][..., [2, 5]] == 0).all() and (local[0][..., 8:] == 0).all()
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("norm_first", [True, False])
def test_hoba_block_residual_structure(norm_first):
    """Pre-norm ``x + A(LN1 x)``, ``x + MLP(LN2 x)``; post-norm (RoBERTa) ``LN1(x + A x)``, ``LN2(x + MLP x)``."""
    torch.manual_seed(10)
    blk = HOBABlock(8, 2, attention="hoba", block_size=4, overlap=0.25, norm_first=norm_first).double().eval()
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = _rand(2, 9, 8)
    m = _mask([[1] * 9, [1] * 6 + [0] * 3])
    A = lambda t: blk.attn(t, mask=m)  # noqa: E731
    if norm_first:
        h = x + A(blk.norm1(x))
        ref = h + blk.mlp(blk.norm2(h))
    else:
        h = blk.norm1(x + A(x))
        ref = blk.norm2(h + blk.mlp(h))
    torch.testing.assert_close(blk(x, mask=m), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls,kw,err,match", [
    (TripletAttention, dict(block_size=0), ValueError, "block_size"),
    (TripletAttention, dict(block_size=True), ValueError, "block_size"),
    (TripletAttention, dict(block_size=2.0), ValueError, "block_size"),
    (TripletAttention, dict(overlap=1.0), ValueError, "overlap"),
    (TripletAttention, dict(overlap=-0.2), ValueError, "overlap"),
    (TripletAttention, dict(overlap="0.5"), TypeError, "overlap"),
    (BlockAttention2D, dict(block_size=None, cross_block=True), ValueError, "cross_block"),
])
def test_layer_constructor_errors(cls, kw, err, match):
    with pytest.raises(err, match=match):
        cls(8, 2, **kw)


@pytest.mark.parametrize("name", TEXT_ATTENTIONS)
def test_layer_forward_errors_name_argument_and_values(name):
    layer = build_text_attention(name, 8, 2, block_size=4)
    cls = type(layer).__name__
    x = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match=rf"{cls}: `mask` must be a bool tensor.*torch.float32"):
        layer(x, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"`mask` must have shape \(2, 5\).*got \(2, 6\)"):
        layer(x, mask=torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor.*torch.int64"):
        layer(x.long())
    with pytest.raises(ValueError, match=r"`x` must have shape \(B, L, 8\), got \(2, 5, 4\)"):
        layer(x[..., :4])
