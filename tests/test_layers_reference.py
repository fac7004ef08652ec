"""hoformer.layers against float64 references written from the equations with explicit loops / dense matrices.

* Full / axial / divided attention with per-mode masks of every documented shape (``(n, n)``, per head
  ``(H, n, n)``, per sample ``(B, 1, n, n)``, ``(B, H, n, n)``), maps and outputs, SDPA and explicit paths.
* FAVOR+ features against the softmax kernel they estimate.
* RMSNorm, SwiGLU, DropPath, Block, AbsolutePositionalEncoding / sincos_1d closed forms.

Axis legend: ``b`` batch, ``h`` heads, ``n`` tokens along one mode, ``N`` flattened tokens, ``e`` head dim,
``d`` model dim.
"""
from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from hoformer.layers import (
    AbsolutePositionalEncoding,
    AxialAttention,
    Block,
    DividedAttention,
    DropPath,
    FavorFeatures,
    FullAttention,
    RMSNorm,
    SwiGLU,
    record_attention,
    sincos_1d,
)


def _with_maps(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` and the maps it recorded (every recorded list, in call order, concatenated)."""
    with record_attention(layer) as rec:
        y = layer(*args, **kwargs)
    return y, [m for _, ms in rec for m in ms]


F64 = torch.float64



# --------------------------------------------------------------------------------------------- references
def _naive_attention(q, k, v, mask=None):
    """One head, one fibre: ``q, k (n, e)``, ``v (n, e)``, ``mask (n, n)`` bool (True = attend) or None.

    Row ``i`` is the softmax of ``q_i . k_j / sqrt(e)`` over the allowed ``j`` only, written out element by element;
    a row with no allowed key is all zeros (hoformer's masking rule). Returns ``(A v, A)``.
    """
    n, e = q.shape
    a = torch.zeros(n, k.shape[0], dtype=q.dtype)
    for i in range(n):
        allowed = [j for j in range(k.shape[0]) if mask is None or bool(mask[i, j])]
        if not allowed:
            continue
        logits = torch.stack([q[i] @ k[j] for j in allowed]) / math.sqrt(e)
        w = (logits - logits.max()).exp()
        a[i, allowed] = w / w.sum()
    return a @ v, a


def _linear(layer: torch.nn.Linear, x):
    """``x W^T + b`` from the layer's parameters (the projection written out, not the module's forward)."""
    y = torch.einsum("...d,fd->...f", x, layer.weight)
    return y if layer.bias is None else y + layer.bias


def _qkv(layer, x, heads):
    """``(.., d) -> (.., 3, H, E)``: hoformer's qkv layout is ``[q heads | k heads | v heads]``."""
    y = _linear(layer, x)
    return y.view(*y.shape[:-1], 3, heads, y.shape[-1] // (3 * heads))


def _mask_at(m, n, b, h):
    """The ``(n, n)`` mask of sample ``b`` and head ``h`` from one per-mode entry broadcast like SDPA's attn_mask
    (``None`` = nothing masked along this mode)."""
    if m is None:
        return torch.ones(n, n, dtype=torch.bool)
    m = m.reshape((1,) * (4 - m.ndim) + tuple(m.shape))
    return m[b if m.shape[0] > 1 else 0, h if m.shape[1] > 1 else 0]


def _kron_mask(masks, sizes, b, h):
    """Dense mask over the row-major flattened tokens: ``M_1 (x) .. (x) M_k`` of the per-mode masks."""
    return functools.reduce(torch.kron, [_mask_at(m, n, b, h).long() for m, n in zip(masks, sizes)]).bool()


def _full_reference(att, x, masks):
    """Flattened multi-head attention (HOT eqs 1-2), one ``(b, h)`` at a time, mask = Kronecker AND of mode masks."""
    b_, sizes, heads = x.shape[0], tuple(x.shape[1:-1]), att.heads
    masks = masks or [None] * len(sizes)
    n = math.prod(sizes)
    qkv = _qkv(att.to_qkv, x.reshape(b_, n, -1), heads)  # (b, N, 3, h, e)
    out = torch.zeros(b_, n, heads, att.dim_head, dtype=F64)
    maps = torch.zeros(b_, heads, n, n, dtype=F64)
    for b, h in itertools.product(range(b_), range(heads)):
        q, k, v = qkv[b, :, :, h].unbind(1)
        if isinstance(att.q_norm, torch.nn.LayerNorm):  # qk_norm: per-head LayerNorm of q and k
            q = torch.nn.functional.layer_norm(q, (att.dim_head,), att.q_norm.weight, att.q_norm.bias)
            k = torch.nn.functional.layer_norm(k, (att.dim_head,), att.k_norm.weight, att.k_norm.bias)
        out[b, :, h], maps[b, h] = _naive_attention(q, k, v, _kron_mask(masks, sizes, b, h))
    return _linear(att.to_out[0], out.flatten(-2)).view(x.shape), maps


def _rot(x, positions, theta=10000.0):
    """RoPE written out on ``x (n, d)``: the pair ``(j, j + d/2)`` of row ``i`` rotated by the angle
    ``positions[i] * theta^(-2j/d)``."""
    n, d = x.shape
    out = x.clone()
    for i, j in itertools.product(range(n), range(d // 2)):
        ang = float(positions[i]) * theta ** (-2 * j / d)
        a, b = x[i, j], x[i, j + d // 2]
        out[i, j] = a * math.cos(ang) - b * math.sin(ang)
        out[i, j + d // 2] = b * math.cos(ang) + a * math.sin(ang)
    return out


def _axial_rot(x, sizes, modes):
    """N-d RoPE on the row-major flattened tokens ``x (prod(sizes), d)``: feature chunk ``j`` (of even size
    ``(d // len(modes)) // 2 * 2``) rotated by each token's coordinate along ``modes[j]``; the rest unrotated."""
    if not modes:
        return x
    coords = list(itertools.product(*[range(n) for n in sizes]))
    c = (x.shape[-1] // len(modes)) // 2 * 2
    out = x.clone()
    for j, m in enumerate(modes):
        out[:, j * c : (j + 1) * c] = _rot(x[:, j * c : (j + 1) * c], [p[m] for p in coords])
    return out


def _along_reference(qkv, mode, mask, rope=False):
    """Attention along ``mode`` for every fibre of the other modes: ``qkv (B, N1..Nk, 3, H, E)`` ->
    ``(B, N1..Nk, H, E)`` and the maps ``(B, H, *other modes, n, n)``; ``rope``: q and k rotated along the fibre."""
    b_, sizes, heads = qkv.shape[0], qkv.shape[1:-3], qkv.shape[-2]
    n = sizes[mode]
    out = torch.zeros(*qkv.shape[:-3], *qkv.shape[-2:], dtype=F64)
    others = [s for i, s in enumerate(sizes) if i != mode]
    maps = torch.zeros(b_, heads, *others, n, n, dtype=F64)
    for b, h in itertools.product(range(b_), range(heads)):
        for idx in itertools.product(*[range(s) for s in others]):
            full = list(idx)
            full.insert(mode, slice(None))
            q, k, v = qkv[(b, *full)][:, :, h].unbind(1)  # each (n, e)
            if rope:
                q, k = _rot(q, range(n)), _rot(k, range(n))
            out[(b, *full, h)], maps[(b, h, *idx)] = _naive_attention(q, k, v, _mask_at(mask, n, b, h))
    return out, maps


def _axial_reference(att, x, masks, modes, rope_modes=()):
    sizes = tuple(x.shape[1:-1])
    masks = masks or [None] * len(sizes)
    qkv = _qkv(att.to_qkv, x, att.heads)
    maps = []
    if att.combine == "sum":  # (1/|modes|) sum_m attn_m(x), one shared projection
        total = 0
        for m in modes:
            y, a = _along_reference(qkv, m, masks[m], m in rope_modes)
            total, maps = total + y, maps + [a]
        y = total / len(modes)
    else:  # mode after mode; each later mode projects the current heads with its own qkv
        for j, m in enumerate(modes):
            if j > 0:
                qkv = _qkv(att.extra[j - 1], y.flatten(-2), att.heads)
            y, a = _along_reference(qkv, m, masks[m], m in rope_modes)
            maps.append(a)
    return _linear(att.to_out[0], y.flatten(-2)), maps


def _divided_reference(att, x, masks, fm, rope_modes=()):
    """TimeSformer divided attention as in ``DividedAttention.forward``: ``y = T + S`` with ``T`` the attention along
    ``first_mode`` (``att.first``'s weights) for every fibre of the other modes, and ``S`` the flattened attention
    over the other modes (``att.rest``'s weights) of each ``first_mode`` slice of ``x + T``."""
    b_, sizes, heads = x.shape[0], tuple(x.shape[1:-1]), att.first.heads
    masks = masks or [None] * len(sizes)
    t_heads, a_t = _along_reference(_qkv(att.first.to_qkv, x, heads), fm, masks[fm], fm in rope_modes)
    t = _linear(att.first.to_out[0], t_heads.flatten(-2))
    h_in = x + t
    rest = [i for i in range(len(sizes)) if i != fm]
    rest_sizes = [sizes[i] for i in rest]
    rope_rest = [rest.index(m) for m in rope_modes if m != fm]  # numbered among the other modes
    nr = math.prod(rest_sizes)
    s = torch.zeros_like(x)
    a_s = torch.zeros(b_, sizes[fm], heads, nr, nr, dtype=F64)
    for b, i in itertools.product(range(b_), range(sizes[fm])):
        tokens = h_in[b].select(fm, i).reshape(nr, -1)  # the other modes, row-major
        qkv = _qkv(att.rest.to_qkv, tokens, heads)
        out = torch.zeros(nr, heads, att.rest.dim_head, dtype=F64)
        for h in range(heads):
            mask = _kron_mask([masks[j] for j in rest], rest_sizes, b, h)
            q, k, v = qkv[:, :, h].unbind(1)
            q, k = _axial_rot(q, rest_sizes, rope_rest), _axial_rot(k, rest_sizes, rope_rest)
            out[:, h], a_s[b, i, h] = _naive_attention(q, k, v, mask)
        s[b].select(fm, i).copy_(_linear(att.rest.to_out[0], out.flatten(-2)).view(*rest_sizes, -1))
    return t + s, [a_t.flatten(2, -3), a_s.flatten(0, 1)]


# ------------------------------------------------------------------------------------------------ masks
def _rand_mask(*shape, p=0.5, gen=None):
    """Random bool mask with the diagonal allowed (no empty row unless made so on purpose)."""
    n = shape[-1]
    return (torch.rand(*shape, generator=gen) < p) | torch.eye(n, dtype=torch.bool)


def _masks(case, sizes, batch, heads):
    """Per-mode mask lists for ``sizes``; every case but "causal" makes the per-sample / per-head masks differ."""
    g = torch.Generator().manual_seed(1)
    k = len(sizes)
    causal_last = torch.ones(sizes[-1], sizes[-1], dtype=torch.bool).tril()
    if case == "none_and_causal":  # None must mean "every pair of this mode", not "the same index only"
        return [None] * (k - 1) + [causal_last]
    if case == "empty_row":  # a token that may attend to nothing gets a zero row (no NaN from SDPA)
        m = _rand_mask(sizes[0], sizes[0], gen=g)
        m[1] = False
        return [m] + [None] * (k - 2) + [causal_last]
    if case == "per_sample":  # (B, 1, n, n): each sample its own mask
        return [_rand_mask(batch, 1, n, n, gen=g) for n in sizes]
    if case == "per_head":  # (H, n, n) and (B, H, n, n)
        return [_rand_mask(heads, n, n, gen=g) if i % 2 == 0 else _rand_mask(batch, heads, n, n, gen=g)
                for i, n in enumerate(sizes)]
    raise AssertionError(case)


MASK_CASES = ["none_and_causal", "empty_row", "per_sample", "per_head"]


def _per_sample_loop(att, x, masks):
    """The layer run on one sample at a time with that sample's slice of every per-sample mask."""
    outs = []
    for b in range(x.shape[0]):
        mb = [m if m is None or m.ndim < 4 or m.shape[0] == 1 else m[b : b + 1] for m in masks]
        outs.append(att(x[b : b + 1], masks=mb))
    return torch.cat(outs)


# ---------------------------------------------------------------------------------------- full attention
@pytest.mark.parametrize("case", MASK_CASES)
def test_full_attention_masks_match_dense_reference(case):
    torch.manual_seed(0)
    att = FullAttention(8, 2, qk_norm=False).double().eval()
    x = torch.randn(2, 3, 4, 8, dtype=F64)
    masks = _masks(case, (3, 4), 2, 2)
    ref_y, ref_a = _full_reference(att, x, masks)
    y, (a,) = _with_maps(att, x, masks=masks)  # explicit softmax path
    torch.testing.assert_close(a, ref_a)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(att(x, masks=masks), ref_y)  # SDPA path
    torch.testing.assert_close(_per_sample_loop(att, x, masks), ref_y)
    if case == "empty_row":  # the flattened tokens (1, *) attend to nothing: zero rows, output = to_out's bias
        assert (a.view(2, 2, 3, 4, 12)[:, :, 1] == 0).all()
        torch.testing.assert_close(y[:, 1], att.to_out[0].bias.expand(2, 4, 8))


def test_full_attention_qk_norm_matches_dense_reference():
    """``qk_norm=True`` (every model's default): a per-head LayerNorm (non-trivial affine) on q and k."""
    torch.manual_seed(0)
    att = FullAttention(8, 2, qk_norm=True).double().eval()
    for p in (*att.q_norm.parameters(), *att.k_norm.parameters()):
        torch.nn.init.normal_(p)
    x = torch.randn(2, 3, 4, 8, dtype=F64)
    masks = _masks(MASK_CASES[-1], (3, 4), 2, 2)
    ref_y, ref_a = _full_reference(att, x, masks)
    y, (a,) = _with_maps(att, x, masks=masks)
    torch.testing.assert_close(a, ref_a)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(att(x, masks=masks), ref_y)  # SDPA path


def test_full_attention_masks_change_the_output():
    """The reference above is not vacuous: masking moves the output away from the unmasked one."""
    att = FullAttention(8, 2, qk_norm=False).double().eval()
    x = torch.randn(2, 3, 4, 8, dtype=F64)
    for case in MASK_CASES:
        assert not torch.allclose(att(x, masks=_masks(case, (3, 4), 2, 2)), att(x))


# --------------------------------------------------------------------------------------- axial attention
@pytest.mark.parametrize("dim_head", [None, 3])  # 3: heads * dim_head = 6 != dim = 8
@pytest.mark.parametrize("combine", ["sum", "sequential"])
@pytest.mark.parametrize("case", MASK_CASES)
def test_axial_attention_masks_match_per_fibre_reference(case, combine, dim_head):
    torch.manual_seed(0)
    att = AxialAttention(8, 2, qk_norm=False, combine=combine, num_modes=3, dim_head=dim_head).double().eval()
    x = torch.randn(2, 2, 3, 4, 8, dtype=F64)
    masks = _masks(case, (2, 3, 4), 2, 2)
    ref_y, ref_maps = _axial_reference(att, x, masks, (0, 1, 2))
    y, maps = _with_maps(att, x, masks=masks)
    for a, r in zip(maps, ref_maps, strict=True):
        torch.testing.assert_close(a.expand_as(r), r)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(att(x, masks=masks), ref_y)
    torch.testing.assert_close(_per_sample_loop(att, x, masks), ref_y)


# ------------------------------------------------------------------------------------- divided attention
@pytest.mark.parametrize("first_mode", [0, 1])
@pytest.mark.parametrize("case", [None, *MASK_CASES])
def test_divided_attention_is_T_plus_S_of_x_plus_T(first_mode, case):
    """``DividedAttention.forward``: ``t`` = ``first`` along ``first_mode``; ``h = x + t``; ``s`` = ``rest`` over the
    other modes of each ``first_mode`` slice of ``h``; returns ``t + s``. Reference: explicit loops of both stages."""
    torch.manual_seed(0)
    att = DividedAttention(8, 2, qk_norm=False, first_mode=first_mode).double().eval()
    x = torch.randn(2, 3, 4, 2, 8, dtype=F64)
    masks = None if case is None else _masks(case, (3, 4, 2), 2, 2)
    ref_y, ref_maps = _divided_reference(att, x, masks, first_mode)
    y, maps = _with_maps(att, x, masks=masks)
    assert len(maps) == 2
    for a, r in zip(maps, ref_maps):
        torch.testing.assert_close(a.expand_as(r), r)
    torch.testing.assert_close(y, ref_y)
    torch.testing.assert_close(att(x, masks=masks), ref_y)
    if masks is not None:
        torch.testing.assert_close(_per_sample_loop(att, x, masks), ref_y)


# ------------------------------------------------------------------------------------ rope_modes per mode
@pytest.mark.parametrize("combine", ["sum", "sequential"])
@pytest.mark.parametrize("rope_mode", [0, 1, 2])
def test_axial_attention_rotates_exactly_its_rope_modes(combine, rope_mode):
    """RoPE along ``rope_modes`` only, each along its own fibres; a layer rotating a neighbouring mode fails (the
    reference with the neighbour rotated is checked to differ). The layer's angles are float32, the reference's
    exact: 1e-5."""
    torch.manual_seed(0)
    att = AxialAttention(8, 2, qk_norm=False, combine=combine, num_modes=3, rope_modes=(rope_mode,)).double().eval()
    x = torch.randn(2, 3, 4, 3, 8, dtype=F64)
    ref_y, _ = _axial_reference(att, x, None, (0, 1, 2), rope_modes=(rope_mode,))
    torch.testing.assert_close(att(x), ref_y, rtol=1e-5, atol=1e-5)
    for wrong in {(rope_mode + 1) % 3, (rope_mode - 1) % 3}:
        other, _ = _axial_reference(att, x, None, (0, 1, 2), rope_modes=(wrong,))
        assert (other - ref_y).abs().amax() > 1e-3


@pytest.mark.parametrize("first_mode", [0, 1])
@pytest.mark.parametrize("rope_modes", [(0,), (1,), (2,), (0, 2), (1, 2)])
def test_divided_attention_rotates_exactly_its_rope_modes(first_mode, rope_modes):
    """``first_mode`` rotated along its fibres if listed; the others by N-d RoPE over the other modes' coordinates
    (head dim split between them in the listed order)."""
    torch.manual_seed(0)
    att = DividedAttention(8, 2, qk_norm=False, first_mode=first_mode, rope_modes=rope_modes).double().eval()
    x = torch.randn(2, 3, 4, 3, 8, dtype=F64)
    ref_y, _ = _divided_reference(att, x, None, first_mode, rope_modes)
    torch.testing.assert_close(att(x), ref_y, rtol=1e-5, atol=1e-5)
    shifted = tuple(sorted({(m + 1) % 3 for m in rope_modes}))
    other, _ = _divided_reference(att, x, None, first_mode, shifted)
    assert (other - ref_y).abs().amax() > 1e-3


# --------------------------------------------------------------------------------------------- FAVOR+
def test_favor_features_estimate_the_softmax_kernel():
    """Row-normalised ``phi(q) phi(k)^T`` ~ ``softmax(q k^T / sqrt(d))`` with many features (Performer eq. for the
    positive random features). Measured error at this seed: 0.0098; without the ``-|x|^2 / 2`` term: 0.064."""
    torch.manual_seed(0)
    favor = FavorFeatures(16, num_features=8192).double()  # 512 tiny QRs: fast on one thread (see _one_thread)
    q = torch.randn(6, 16, dtype=F64) * 0.5
    k = torch.randn(7, 16, dtype=F64) * 0.5
    ref = (q @ k.T / math.sqrt(16)).softmax(-1)
    a = favor(q, is_query=True) @ favor(k, is_query=False).T
    a = a / a.sum(-1, keepdim=True)
    assert (a - ref).abs().max() < 0.02
    # the query stabiliser (per-row max) cancels in the row normalisation: a global one gives the same estimate
    b = favor(q, is_query=False) @ favor(k, is_query=False).T
    torch.testing.assert_close(b / b.sum(-1, keepdim=True), a, rtol=0, atol=1e-4)  # up to the +1e-6 floor


# --------------------------------------------------------------------------------------------- blocks
def test_rmsnorm_closed_form():
    torch.manual_seed(0)
    norm = RMSNorm(6, eps=0.1).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6, dtype=F64))
    x = torch.randn(2, 3, 6, dtype=F64)
    x[0, 0] *= 1e-2  # a small row, where eps matters
    ref = torch.empty_like(x)
    for idx in itertools.product(range(2), range(3)):
        row = x[idx]
        ref[idx] = row / math.sqrt(sum(float(v) ** 2 for v in row) / 6 + 0.1) * norm.weight
    torch.testing.assert_close(norm(x), ref, rtol=1e-12, atol=1e-14)  # float64 is not rounded through float32
    y16 = norm.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.double(), ref, rtol=2e-2, atol=2e-2)


def test_swiglu_closed_form():
    torch.manual_seed(0)
    sw = SwiGLU(6, 5, out=4).double().eval()
    x = torch.randn(3, 6, dtype=F64)
    w1, w3 = sw.w13.weight[:5], sw.w13.weight[5:]
    b1, b3 = sw.w13.bias[:5], sw.w13.bias[5:]
    for i in range(3):
        a, g = w1 @ x[i] + b1, w3 @ x[i] + b3
        hidden = a / (1 + torch.exp(-a)) * g  # silu(W1 x) * W3 x
        torch.testing.assert_close(sw(x[i]), sw.w2.weight @ hidden + sw.w2.bias)


def test_drop_path_per_sample_unbiased_and_eval_identity():
    torch.manual_seed(0)
    p, n = 0.25, 20000
    dp = DropPath(p).train()
    x = torch.randn(1, 3, 2, dtype=F64).expand(n, 3, 2).contiguous()
    y = dp(x)
    kept = (y != 0).flatten(1).all(1)
    dropped = (y == 0).flatten(1).all(1)
    assert (kept | dropped).all()  # a whole sample is kept or dropped, never part of one
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))  # kept samples are rescaled by 1 / (1 - p)
    assert abs(dropped.double().mean().item() - p) < 0.015  # 5 sigma at n = 20000
    torch.testing.assert_close(y.mean(0), x[0], rtol=0.03, atol=0.0)  # E[DropPath(x)] = x
    assert dp.eval()(x) is x
    assert DropPath(0.0).train()(x) is x
    for bad in (1.0, 1.5, -0.1, "0.1", None):
        with pytest.raises(ValueError, match=r"DropPath: `p` must be a float in \[0, 1\)"):
            DropPath(bad)


@pytest.mark.parametrize("attention,mlp,norm", [
    ("full", "gelu", "layernorm"),
    ("kronecker_product", "swiglu", "rmsnorm"),
    ("divided", "gelu", "rmsnorm"),
])
def test_block_is_pre_norm_residual_composition(attention, mlp, norm):
    torch.manual_seed(0)
    kw = {"num_modes": 2} if attention.startswith("kronecker") else {}
    blk = Block(8, 2, attention=attention, mlp=mlp, norm=norm, drop_path=0.3, **kw).double().eval()
    x = torch.randn(2, 3, 4, 8, dtype=F64)
    masks = [None, torch.ones(4, 4, dtype=torch.bool).tril()]
    for m in (None, masks):
        h = x + blk.attn(blk.norm1(x), masks=m)
        ref = h + blk.mlp(blk.norm2(h))
        torch.testing.assert_close(blk(x, masks=m), ref)  # eval: drop path is the identity
        y, maps = _with_maps(blk, x, masks=m)
        torch.testing.assert_close(y, ref)
        for a, r in zip(maps, _with_maps(blk.attn, blk.norm1(x), masks=m)[1], strict=True):
            torch.testing.assert_close(a, r)
    # training: stochastic depth acts on each residual branch (not on the stream), same draws in the same order
    blk.train()
    torch.manual_seed(5)
    y = blk(x)
    torch.manual_seed(5)
    h = x + blk.drop_path(blk.attn(blk.norm1(x)))
    torch.testing.assert_close(y, h + blk.drop_path(blk.mlp(blk.norm2(h))))
    with pytest.raises(ValueError, match="DropPath"):
        Block(8, 2, attention="full", drop_path=1.0)


# -------------------------------------------------------------------------------------- positional codes
def test_sincos_1d_closed_form():
    tab = sincos_1d(5, 6, temperature=100.0)
    assert tab.shape == (5, 6)
    for pos, i in itertools.product(range(5), range(3)):
        ang = pos / 100.0 ** (i / 3)
        assert math.isclose(tab[pos, i].item(), math.sin(ang), abs_tol=1e-6)
        assert math.isclose(tab[pos, 3 + i].item(), math.cos(ang), abs_tol=1e-6)


@pytest.mark.parametrize("sizes,dim,modes", [((3, 4, 5), 14, (0, 2)), ((2, 3), 8, None), ((4, 3), 10, (1,))])
def test_sincos_encoding_is_1d_table_in_each_modes_chunk(sizes, dim, modes):
    pe = AbsolutePositionalEncoding(sizes, dim, kind="sincos", modes=modes)
    enc_modes = tuple(range(len(sizes))) if modes is None else modes
    c = (dim // len(enc_modes)) // 2 * 2
    x = torch.randn(2, *sizes, dim)
    out = pe(x) - x
    for idx in itertools.product(*[range(n) for n in sizes]):
        want = torch.zeros(dim)
        for j, m in enumerate(enc_modes):
            want[j * c : (j + 1) * c] = sincos_1d(sizes[m], c)[idx[m]]
        torch.testing.assert_close(out[(0, *idx)], want, atol=1e-6, rtol=0)
        torch.testing.assert_close(out[(1, *idx)], want, atol=1e-6, rtol=0)


def test_learned_encoding_adds_one_table_per_mode_and_trains():
    pl = AbsolutePositionalEncoding((3, 4), 8, kind="learned", modes=(1,))
    assert [tuple(t.shape) for t in pl.tables] == [(4, 8)]
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    y = pl(x)
    for b, i, j in itertools.product(range(2), range(3), range(4)):
        torch.testing.assert_close(y[b, i, j], x[b, i, j] + pl.tables[0][j])
    y.sum().backward()
    torch.testing.assert_close(pl.tables[0].grad, torch.full((4, 8), 6.0))  # each row used by 2 samples x 3 rows
    both = AbsolutePositionalEncoding((3, 4), 8, kind="learned")
    z = both(torch.zeros(1, 3, 4, 8))
    torch.testing.assert_close(z[0, 2, 1], both.tables[0][2] + both.tables[1][1])
