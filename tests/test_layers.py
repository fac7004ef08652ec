"""hoformer.layers: KroneckerAttention semantics, baselines, positional encodings, blocks."""
from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

from hoformer.functional import kron_apply, kron_sum_apply
from hoformer.layers import (
    ATTENTION_TYPES,
    AbsolutePositionalEncoding,
    AxialAttention,
    Block,
    Encoder,
    KroneckerAttention,
    PatchEmbed,
    RotaryEmbedding,
    axial_rotary,
    build_attention,
    record_attention,
)

def _with_maps(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` and the maps it recorded (every recorded list, in call order, concatenated)."""
    with record_attention(layer) as rec:
        y = layer(*args, **kwargs)
    return y, [m for _, ms in rec for m in ms]


D64 = torch.float64


def test_one_mode_equals_standard_multihead_attention():
    torch.manual_seed(0)
    dim, heads = 16, 4
    att = KroneckerAttention(dim, heads, qk_norm=False, num_modes=1).double()
    x = torch.randn(2, 7, dim, dtype=torch.float64)
    mha = torch.nn.MultiheadAttention(dim, heads, bias=True, batch_first=True).double()
    wq, wk = att.to_qk[0].weight.chunk(2, 0)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([wq, wk, att.to_v.weight]))
        mha.in_proj_bias.copy_(torch.cat([torch.zeros(2 * dim, dtype=torch.float64), att.to_v.bias]))
        mha.out_proj.weight.copy_(att.to_out[0].weight)
        mha.out_proj.bias.copy_(att.to_out[0].bias)
    ref, _ = mha(x, x, x)
    torch.testing.assert_close(att(x), ref)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("pool", ["sum", "mean"])
def test_pool_then_project_equals_project_then_pool(pool, qk_norm):
    """Per-mode q / k: pooled then projected = projected at full resolution then pooled (paper eqs 5-6); with
    ``qk_norm`` a per-head LayerNorm follows, and RoPE (mode 1 here) comes after the norm."""
    att = KroneckerAttention(12, 3, num_modes=3, pool=pool, qk_norm=qk_norm, rope_modes=(1,)).double()
    if qk_norm:  # non-trivial affine parameters
        for p in (*att.q_norm.parameters(), *att.k_norm.parameters()):
            torch.nn.init.normal_(p)
    x = torch.randn(2, 3, 4, 5, 12, dtype=torch.float64)
    qs, ks = att.mode_qk(x)
    for i in range(3):
        full = att.to_qk[i](x)  # project at full resolution (paper eqs 5-6)
        others = [1 + j for j in range(3) if j != i]
        pooled = full.sum(others) if pool == "sum" else full.mean(others)
        q, k = pooled.view(2, x.shape[1 + i], 2, 3, 4).permute(2, 0, 3, 1, 4)
        if qk_norm:
            q = torch.nn.functional.layer_norm(q, (4,), att.q_norm.weight, att.q_norm.bias)
            k = torch.nn.functional.layer_norm(k, (4,), att.k_norm.weight, att.k_norm.bias)
        if i == 1:
            q, k = att.rotary(q), att.rotary(k)
        torch.testing.assert_close(qs[i], q)
        torch.testing.assert_close(ks[i], k)


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("combine", ["product", "sum"])
def test_layer_output_reproduced_from_recorded_factors(combine, kernel):
    """``y = to_out(S v)`` with ``S`` the dense ``S_1 (x) S_2 (x) S_3`` (or ``(1/3) sum_m I (x) S_m (x) I``) built with
    ``torch.kron`` from the recorded factors, per sample and head; for FAVOR+ (``kernel="linear"``) the factors are
    the row-normalised ``phi(q_i) phi(k_i)^T`` the output is computed from."""
    att = KroneckerAttention(16, 2, combine=combine, kernel=kernel, num_modes=3, rope_modes=(2,)).double()
    x = torch.randn(2, 3, 4, 5, 16, dtype=torch.float64)
    with record_attention(att) as rec:
        y = att(x)
    (_, fs), = rec
    assert len(fs) == 3
    for f in fs:
        assert (f >= 0).all()
        torch.testing.assert_close(f.sum(-1), torch.ones_like(f.sum(-1)))
    if kernel == "softmax":  # each factor is softmax(q_i k_i^T / sqrt(e)) of the layer's mode queries and keys
        for f, q, k in zip(fs, *att.mode_qk(x)):
            torch.testing.assert_close(f, torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1))
    v = att.to_v(x).view(2, 60, 2, 8)  # (b, N, h, e), tokens row-major
    z = torch.empty_like(v)
    for b, h in itertools.product(range(2), range(2)):
        mats = [f[b, h] for f in fs]
        if combine == "product":
            dense = functools.reduce(torch.kron, mats)
        else:
            eyes = [torch.eye(m.shape[0], dtype=torch.float64) for m in mats]
            dense = sum(functools.reduce(torch.kron, eyes[:i] + [mats[i]] + eyes[i + 1:]) for i in range(3)) / 3
        z[b, :, h] = dense @ v[b, :, h]
    torch.testing.assert_close(y, att.to_out(z.reshape(2, 3, 4, 5, 16)))
    torch.testing.assert_close(att(x), y)  # recording / returning maps does not change outputs
    z_fast = kron_apply(fs, v.view(2, 3, 4, 5, 2, 8).movedim(-2, 1)) if combine == "product" else \
        kron_sum_apply(fs, v.view(2, 3, 4, 5, 2, 8).movedim(-2, 1))
    torch.testing.assert_close(z_fast.movedim(1, -2).reshape(z.shape), z)


def test_rope_is_relative():
    rot = RotaryEmbedding(8).double()
    q, k = torch.randn(1, 8, dtype=torch.float64), torch.randn(1, 8, dtype=torch.float64)
    def score(i, j):
        pos = torch.tensor([i, j])
        qq = rot(q.expand(2, 8), pos)[0]
        kk = rot(k.expand(2, 8), pos)[1]
        return qq @ kk
    torch.testing.assert_close(score(3, 1), score(10, 8))
    torch.testing.assert_close(score(0, 5), score(7, 12))
    # inside the layer: with content constant along the rotated mode, logits depend only on j - i, so
    # log S[i, j] - log S[i, j'] is invariant to shifting (i, j, j') together
    att = KroneckerAttention(16, 2, num_modes=2, rope_modes=(1,)).double()
    x = torch.randn(1, 3, 1, 16, dtype=torch.float64).expand(1, 3, 6, 16)
    _, (_, s1) = _with_maps(att, x)
    ls = s1.log()
    for i, j, jp, shift in [(0, 1, 3, 2), (1, 0, 4, 1), (2, 2, 0, 3)]:
        torch.testing.assert_close(ls[..., i, j] - ls[..., i, jp], ls[..., i + shift, j + shift] - ls[..., i + shift, jp + shift])
    att_norope = KroneckerAttention(16, 2, num_modes=2).double()
    _, (_, s_flat) = _with_maps(att_norope, x)
    torch.testing.assert_close(s_flat, torch.full_like(s_flat, 1 / 6))  # no position info without RoPE


def test_favor_features_buffer_and_redraw():
    att = KroneckerAttention(16, 2, kernel="linear", num_modes=2, redraw_interval=2)
    assert "favor.projection" in att.state_dict()
    x = torch.randn(2, 4, 5, 16)
    p0 = att.favor.projection.clone()
    att.train()
    att(x); att(x)
    assert torch.equal(p0, att.favor.projection)
    att(x)
    assert not torch.equal(p0, att.favor.projection)
    assert int(att.favor.calls) == 3
    # the schedule resumes from a checkpoint: a copy loaded after 3 calls redraws at its 2nd forward (call 5)
    resumed = KroneckerAttention(16, 2, kernel="linear", num_modes=2, redraw_interval=2).train()
    resumed(x)  # its own count (1) is overwritten by the load
    resumed.load_state_dict(att.state_dict())
    p3 = resumed.favor.projection.clone()
    resumed(x)
    assert int(resumed.favor.calls) == 4 and torch.equal(p3, resumed.favor.projection)
    resumed(x)
    assert int(resumed.favor.calls) == 5 and not torch.equal(p3, resumed.favor.projection)
    att.eval()
    y1, y2 = att(x), att(x)
    torch.testing.assert_close(y1, y2)
    # FAVOR+ approximates softmax attention: factors are row-stochastic and positive
    _, maps = _with_maps(att, x)
    for m in maps:
        assert (m > 0).all()
        torch.testing.assert_close(m.sum(-1), torch.ones_like(m.sum(-1)))


@pytest.mark.parametrize("name", sorted(ATTENTION_TYPES))
@pytest.mark.parametrize("sizes", [(6,), (3, 4), (2, 3, 4), (2, 2, 2, 3)])
def test_every_attention_any_order(name, sizes):
    kw = {"num_modes": len(sizes)} if name.startswith("kronecker") or name == "axial_sequential" else {}
    att = build_attention(name, 16, 2, rope_modes=(len(sizes) - 1,), **kw)
    x = torch.randn(2, *sizes, 16, requires_grad=True)
    y, maps = _with_maps(att, x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    for n, p in att.named_parameters():
        assert p.grad is not None, f"{name}: {n} has no grad"
    torch.testing.assert_close(att(x), y)  # recording does not change outputs


# Layer-level masks of FullAttention / AxialAttention / DividedAttention against dense and per-fibre float64
# references: tests/test_layers_reference.py


@pytest.mark.parametrize("combine", ["sum", "sequential"])
@pytest.mark.parametrize("modes", [(0,), (2,), (2, 0)])
def test_axial_attention_along_chosen_modes_equals_per_fiber_loop(modes, combine):
    torch.manual_seed(0)
    att = AxialAttention(8, 2, qk_norm=False, combine=combine, modes=modes, num_modes=3).double().eval()
    x = torch.randn(2, 3, 4, 5, 8, dtype=torch.float64)
    q, k, v = att.qkv(x)  # (b, h, n1, n2, n3, e)

    def along(q, k, v, m):  # explicit loop over every fiber of the other modes
        out = torch.empty_like(v)
        sizes = v.shape[2:-1]
        others = [range(s) if i != m else [slice(None)] for i, s in enumerate(sizes)]
        for idx in itertools.product(*others):
            sl = (slice(None), slice(None), *idx)
            a = (q[sl] @ k[sl].transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1)
            out[sl] = a @ v[sl]
        return out

    if combine == "sum":
        ref = sum(along(q, k, v, m) for m in modes) / len(modes)
    else:
        ref = along(q, k, v, modes[0])
        for j, m in enumerate(modes[1:]):
            cur = ref.movedim(1, -2).flatten(-2)
            q2, k2, v2 = (t.movedim(-2, 1) for t in
                          att.extra[j](cur).view(*cur.shape[:-1], 3, att.heads, att.dim_head).unbind(-3))
            ref = along(q2, k2, v2, m)
    torch.testing.assert_close(att(x), att.out(ref))
    _, maps = _with_maps(att, x)
    assert [tuple(a.shape[-2:]) for a in maps] == [(x.shape[1 + m],) * 2 for m in modes]
    with pytest.raises(ValueError, match="only 2 modes"):
        AxialAttention(8, 2, modes=(2,))(torch.randn(1, 3, 4, 8))
    with pytest.raises(ValueError, match="distinct non-negative"):
        AxialAttention(8, 2, modes=(1, 1))
    with pytest.raises(TypeError, match="`modes` must be a sequence of 0-based mode indices"):
        AxialAttention(8, 2, modes=1)


@pytest.mark.parametrize("name", ["full", "axial", "divided", "kronecker_product"])
def test_attn_dropout_is_separate_from_output_dropout(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 16)
    kw = {"num_modes": 2} if name.startswith("kronecker") else {}
    no_attn = build_attention(name, 16, 2, dropout=0.0, attn_dropout=0.0, **kw).train()
    with_attn = build_attention(name, 16, 2, dropout=0.0, attn_dropout=0.5, **kw).train()
    with_attn.load_state_dict(no_attn.state_dict())
    torch.testing.assert_close(no_attn(x), no_attn.eval()(x))  # attn_dropout=0: training forward is deterministic
    assert not torch.allclose(with_attn(x), no_attn(x))
    inherited = [m.attn_dropout for m in build_attention(name, 16, 2, dropout=0.3, **kw).modules()
                 if hasattr(m, "attn_dropout")]
    assert inherited and all(p == 0.3 for p in inherited)  # default: attn_dropout = dropout


@pytest.mark.parametrize("ndim, chans, patch, size", [(1, 1, 4, (96,)), (1, 3, 96, (96,)), (2, 2, (2, 4), (6, 8)),
                                                      (3, 1, 4, (8, 8, 12)), (3, 2, (1, 2, 4), (3, 4, 8))])
def test_patch_embed_is_its_conv(ndim, chans, patch, size):
    """The patch matmul is the conv with kernel = stride = patch (its own ``proj``), forward and gradients of input,
    weight and bias in float64, channels last and contiguous; gradcheck on a small one."""
    torch.manual_seed(0)
    emb = PatchEmbed(chans, 8, patch, ndim=ndim, act="relu").double()
    x = torch.randn(2, chans, *size, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y = emb(x)
    ref = torch.relu(emb.proj(xr).movedim(1, -1))
    assert y.is_contiguous() and y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    y.backward(g)
    grads = [x.grad, emb.proj.weight.grad.clone(), emb.proj.bias.grad.clone()]
    emb.zero_grad()
    ref.backward(g)
    for a, b in zip(grads, [xr.grad, emb.proj.weight.grad, emb.proj.bias.grad]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if ndim == 1 and chans == 1:
        small = PatchEmbed(1, 3, 4, ndim=1).double()
        assert torch.autograd.gradcheck(small, (torch.randn(2, 1, 8, dtype=torch.float64, requires_grad=True),))


def test_blocks_patch_embed_positional():
    emb = PatchEmbed(2, 16, (2, 4, 4), ndim=3, act="relu")
    x = emb(torch.randn(2, 2, 4, 8, 8))
    assert x.shape == (2, 2, 2, 2, 16)
    pe = AbsolutePositionalEncoding((2, 2, 2), 16, kind="sincos")
    pl = AbsolutePositionalEncoding((2, 2, 2), 16, kind="learned", modes=(1, 2))
    enc = Encoder(16, depth=2, num_heads=2, attention="kronecker_sum", mlp="swiglu", num_modes=3, drop_path=0.1)
    with record_attention(enc) as rec:
        y = enc(pl(pe(x)))
    maps = [ms for _, ms in rec]
    assert y.shape == x.shape and len(maps) == 2 and len(maps[0]) == 3
    with pytest.raises(ValueError, match="divisible"):
        emb(torch.randn(2, 2, 5, 8, 8))
    with pytest.raises(ValueError, match=r"\(B, 2, S, S, S\)"):
        emb(torch.randn(2, 3, 4, 8, 8))


def test_bad_inputs():
    att = KroneckerAttention(16, 2, num_modes=2)
    with pytest.raises(ValueError, match="last dim must equal dim=16"):
        att(torch.randn(2, 3, 4, 8))
    with pytest.raises(ValueError, match="expected 2 modes"):
        att(torch.randn(2, 3, 4, 5, 16))
    with pytest.raises(TypeError, match="floating point"):
        att(torch.ones(2, 3, 4, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="empty mode"):
        att(torch.randn(2, 0, 4, 16))
    with pytest.raises(ValueError, match=r"masks\[1\]"):
        att(torch.randn(2, 3, 4, 16), masks=[None, torch.ones(5, 5, dtype=torch.bool)])
    with pytest.raises(ValueError, match="not divisible"):
        KroneckerAttention(10, 3)
    with pytest.raises(ValueError, match="unknown attention"):
        build_attention("nope", 16, 2)
    with pytest.raises(ValueError, match="mlp"):
        Block(16, 2, mlp="relu", num_modes=1)


def test_bad_positional_inputs():
    """Bad arguments of the positional encodings raise a ValueError naming the argument (no all-zero encoding, no raw
    IndexError / broadcasting error)."""
    with pytest.raises(ValueError, match=r"dim >= 2 \* len\(modes\) = 6.*got dim=4"):
        AbsolutePositionalEncoding((3, 4, 5), 4, kind="sincos")  # 3 modes need 3 sin/cos pairs
    with pytest.raises(ValueError, match="dim >= 2"):
        AbsolutePositionalEncoding((3, 4), 3, kind="sincos")
    AbsolutePositionalEncoding((3, 4, 5), 4, kind="sincos", modes=(0, 2))  # 2 modes fit in 4 features
    for modes in ((5,), (-1,), (0, 0), (1.0,)):
        with pytest.raises(ValueError, match=r"`modes` must be distinct 0-based mode indices in \[0, 2\)"):
            AbsolutePositionalEncoding((3, 4), 8, kind="learned", modes=modes)
        with pytest.raises(ValueError, match="`modes`"):
            AbsolutePositionalEncoding((3, 4), 8, kind="sincos", modes=modes)
    for sizes in ((), (3, 0), (3, 2.5)):
        with pytest.raises(ValueError, match="`sizes`"):
            AbsolutePositionalEncoding(sizes, 8)
    with pytest.raises(ValueError, match="`dim`"):
        AbsolutePositionalEncoding((3, 4), 0)
    with pytest.raises(ValueError, match=r"\(B, 3, 4, 8\), got \(2, 4, 3, 8\)"):
        AbsolutePositionalEncoding((3, 4), 8)(torch.randn(2, 4, 3, 8))
    x = torch.randn(2, 12, 8)
    for bad in ((2,), (-1,), (0, 5)):
        with pytest.raises(ValueError, match=r"axial_rotary: `rope_modes` must be 0-based mode indices in \[0, 2\)"):
            axial_rotary(x, (3, 4), bad)
    with pytest.raises(ValueError, match=r"prod\(sizes\)=12"):
        axial_rotary(torch.randn(2, 10, 8), (3, 4), (1,))
    with pytest.raises(ValueError, match=r"`positions` must be a 1-D tensor of length x.shape\[-2\]=12"):
        RotaryEmbedding(8)(x, torch.arange(5))
    with pytest.raises(ValueError, match="`dim` must be even"):
        RotaryEmbedding(7)


def test_axial_rotary_rotates_each_chunk_by_its_modes_coordinate():
    """Reference: chunk ``j`` of the head dim is rotated by 1-D RoPE at the coordinate along ``rope_modes[j]``."""
    x = torch.randn(2, 12, 10, dtype=torch.float64)  # head dim 10, 2 modes: chunks of 4, features 8..9 unrotated
    y = axial_rotary(x, (3, 4), (1, 0))
    rot, tokens = RotaryEmbedding(4), torch.arange(12)  # token t = (i, j) = (t // 4, t % 4), row-major
    torch.testing.assert_close(y[..., :4], rot(x[..., :4], tokens % 4))  # first chunk: mode 1, coordinate j
    torch.testing.assert_close(y[..., 4:8], rot(x[..., 4:8], tokens // 4))  # second chunk: mode 0, coordinate i
    torch.testing.assert_close(y[..., 8:], x[..., 8:])


@pytest.mark.parametrize("sizes", [(5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("mean", [False, True])
def test_mode_pools_values_and_fused_backward(sizes, mean):
    from hoformer.layers.kronecker import mode_pools

    x = torch.randn(2, *sizes, 3, dtype=torch.float64, requires_grad=True)
    k = len(sizes)
    pools = mode_pools(x, mean=mean)
    for i, p in enumerate(pools):
        others = [1 + j for j in range(k) if j != i]
        ref = x if not others else (x.mean(dim=others) if mean else x.sum(dim=others))
        torch.testing.assert_close(p, ref)
    assert torch.autograd.gradcheck(lambda t: tuple(mode_pools(t, mean=mean)), (x,))
    if k > 1:  # only one pooled output used: the others' gradients are None inside the fused backward
        (g,) = torch.autograd.grad(mode_pools(x, mean=mean)[-1].sum(), x)
        others = list(range(1, k))
        (ref,) = torch.autograd.grad((x.mean(dim=others) if mean else x.sum(dim=others)).sum(), x)
        torch.testing.assert_close(g, ref)


@pytest.mark.parametrize("name", ["kronecker_product", "axial_sequential"])
def test_lazily_built_projections_follow_module_dtype(name):
    att = build_attention(name, 16, 2).double()  # no num_modes: q/k (or per-mode qkv) layers built at first forward
    x = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    y = att(x)
    assert y.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in att.parameters())


def test_rope_frequencies_survive_a_bf16_cast():
    rot = RotaryEmbedding(64).to(torch.bfloat16)
    cos, sin = rot.angles(torch.arange(512))
    ref_cos, ref_sin = RotaryEmbedding(64).angles(torch.arange(512))
    assert cos.dtype == torch.float32
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)


@pytest.mark.parametrize("name", ["full", "axial", "divided"])
def test_baseline_layers_reject_unknown_keywords(name):
    with pytest.raises(TypeError, match="qk_nrom"):
        build_attention(name, 16, 2, qk_nrom=False)
    att = build_attention(name, 16, 2, bias=False, num_modes=2)
    assert all(not n.endswith("bias") or "norm" in n for n, _ in att.named_parameters())


@pytest.mark.parametrize("name", ["kronecker_product", "full", "axial", "divided"])
def test_rope_modes_out_of_range_raise(name):
    att = build_attention(name, 16, 2, rope_modes=(2,))
    with pytest.raises(ValueError, match="rope_modes"):
        att(torch.randn(1, 3, 4, 16))


@pytest.mark.parametrize("name", ["kronecker_product", "kronecker_linear", "full", "axial", "divided"])
def test_mask_shapes_broadcast_like_sdpa(name):
    att = build_attention(name, 16, 2).double().eval()
    x = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    m = torch.ones(2, 4, 4, dtype=torch.bool)
    m3 = torch.ones(3, 4, 4, dtype=torch.bool)  # (3, n, n): neither 1 nor H=2 heads (3-D masks broadcast as heads)
    with pytest.raises(ValueError, match=r"masks\[1\].*head dim"):
        att(x, masks=[None, m3])
    y0 = att(x)
    for ok in (m[:1], m[:, None], torch.ones(1, 2, 4, 4, dtype=torch.bool), m):  # (1|H, n, n), (B|1, H|1, n, n)
        torch.testing.assert_close(att(x, masks=[None, ok]), y0)  # all-True masks of every shape change nothing
    with pytest.raises(ValueError, match=r"masks\[1\]"):
        att(x, masks=[None, torch.ones(3, 1, 4, 4, dtype=torch.bool)])  # batch 3 != 2
    # the documented (B, 1, n, n) form, different per sample, on both modes: equal to one sample at a time
    g = torch.Generator().manual_seed(0)
    per_sample = [(torch.rand(2, 1, n, n, generator=g) < 0.5) | torch.eye(n, dtype=torch.bool) for n in (3, 4)]
    y = att(x, masks=per_sample)
    for b in range(2):
        torch.testing.assert_close(y[b : b + 1], att(x[b : b + 1], masks=[p[b : b + 1] for p in per_sample]))
    assert not torch.allclose(y[1:], att(x[1:], masks=[p[:1] for p in per_sample]))  # sample 0's masks differ


@pytest.mark.parametrize("name", ["kronecker_product", "kronecker_sum", "kronecker_linear"])
def test_causal_masks_are_exact_for_every_kronecker_kernel(name):
    """One mode under a causal mask: changing the future leaves past outputs unchanged to rounding. The FAVOR+ key
    features used to add their 1e-6 floor after subtracting a max over *all* keys, so future keys moved past outputs
    by ~1e-5; the linear kernel refused masks before it learnt to form masked factors."""
    torch.manual_seed(0)
    att = build_attention(name, 16, 2, num_modes=1).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    causal = [torch.ones(6, 6, dtype=torch.bool).tril()]
    y = att(x, masks=causal)
    x2 = x.clone()
    x2[:, 4:] *= 25.0  # a large change of the future keys' features (and of the FAVOR+ key stabiliser)
    torch.testing.assert_close(att(x2, masks=causal)[:, :4], y[:, :4], rtol=0, atol=1e-12)
    assert not torch.allclose(att(x2)[:, :4], y[:, :4])  # without the mask the future does reach the past


def test_divided_attention_one_mode_masks_both_stages():
    """With one mode both stages attend along it, with the masks, whether or not maps are recorded (a causal mask
    must hold in plain forward calls too)."""
    torch.manual_seed(0)
    att = build_attention("divided", 16, 2).eval()
    x = torch.randn(2, 5, 16)
    causal = [torch.ones(5, 5, dtype=torch.bool).tril()]
    y = att(x, masks=causal)
    torch.testing.assert_close(y, _with_maps(att, x, masks=causal)[0])
    x2 = x.clone()
    x2[:, 3:] += 10.0  # change the future: the first three outputs must not move
    torch.testing.assert_close(att(x2, masks=causal)[:, :3], y[:, :3])


def test_divided_attention_records_both_stages():
    att = build_attention("divided", 16, 2)
    x = torch.randn(2, 3, 4, 16)
    with record_attention(att) as rec:
        att(x)
    names = [n for n, _ in rec]
    assert names == ["first", "rest"], names
    assert [tuple(m.shape) for _, ms in rec for m in ms] == [(2, 2, 4, 3, 3), (6, 2, 4, 4)]  # rest: (B * N1, H, N2, N2)


def test_hot_stack_with_dropout_trains_under_torch_compile_aot_eager():
    """PatchEmbed returns channels-last *memory* and Block makes its input contiguous, so a HOT stack with dropout
    trains under torch.compile(backend="aot_eager") (no C++ toolchain needed): with a strided residual stream the
    traced backward ``view``s a dropout gradient whose eager CPU strides differ from the traced ones
    (aten.native_dropout_backward; the Kronecker kernels' graph breaks expose the stream to it) and fails. The
    compiled forward and gradients equal eager ones, for the PatchEmbed path and for a non-contiguous input given to
    the Encoder directly."""
    import torch._dynamo as dynamo

    emb = PatchEmbed(1, 16, 4, ndim=2, act="relu")
    enc = Encoder(16, depth=1, num_heads=2, attention="kronecker_product", dropout=0.1, num_modes=2)
    assert emb(torch.randn(2, 1, 12, 16)).is_contiguous()
    cases = [(torch.nn.Sequential(emb, enc).train(), torch.randn(2, 1, 12, 16)),
             (enc.train(), torch.randn(2, 16, 4, 3).transpose(1, 3))]  # (2, 3, 4, 16), not contiguous
    for model, x in cases:
        def step(fn):
            torch.manual_seed(1)
            y = fn(x)
            w = torch.linspace(-1, 1, y.numel()).view_as(y)
            return y, torch.autograd.grad((y * w).sum(), list(model.parameters()))

        dynamo.reset()
        y, g = step(torch.compile(model, backend="aot_eager"))
        y0, g0 = step(model)
        torch.testing.assert_close(y, y0)
        for a, b in zip(g, g0):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["kronecker_product", "kronecker_sum", "full", "axial", "axial_sequential",
                                  "divided", "kronecker_tanimoto"])
def test_attention_dropout_is_off_in_eval(name):
    """Attention and output dropout act in training only: in eval a layer with p=0.5 equals the same weights at p=0."""
    from hoformer.layers import build_attention

    kw = {"num_modes": 2} if name.startswith("kronecker") or name == "axial_sequential" else {}
    x = torch.randn(2, 3, 4, 16)
    drop = build_attention(name, 16, 2, attn_dropout=0.5, dropout=0.5, **kw).eval()
    ref = build_attention(name, 16, 2, **kw).eval()
    ref.load_state_dict(drop.state_dict())
    torch.testing.assert_close(drop(x), ref(x))
    torch.testing.assert_close(_with_maps(drop, x)[0], ref(x))


@pytest.mark.parametrize("name", ["kronecker_product", "kronecker_linear", "full", "axial", "divided"])
def test_layer_sizes_rates_and_rope_modes_are_checked(name):
    """0 is not "use the default" (dim_head=0 built dim_head=dim//heads), rates outside [0, 1) are refused at
    construction by every layer (AxialAttention trained with attn_dropout=-1), a bare int for rope_modes names the
    argument instead of "'int' object is not iterable", num_heads=0 no longer divides by zero."""
    cases = [({"dim_head": 0}, ValueError, "`dim_head` must be an int >= 1 or None, got 0"),
             ({"num_heads": 0}, ValueError, "`num_heads` must be an int >= 1, got 0"),
             ({"attn_dropout": -1.0}, ValueError, r"`attn_dropout` must be a float in \[0, 1\), got -1.0"),
             ({"dropout": 1.0}, ValueError, r"`dropout` must be a float in \[0, 1\), got 1.0"),
             ({"dropout": None}, ValueError, r"`dropout` must be a float in \[0, 1\), got None"),
             ({"rope_modes": 1}, TypeError, "`rope_modes` must be a sequence of 0-based mode indices")]
    if name == "kronecker_linear":
        cases.append(({"num_features": 0}, ValueError, "`num_features` must be an int >= 1 or None, got 0"))
    for kw, exc, msg in cases:
        args = {"num_heads": 2, **kw}
        with pytest.raises(exc, match=msg):
            build_attention(name, 16, args.pop("num_heads"), **args)
    with pytest.raises(ValueError, match="Encoder: `depth` must be an int >= 0"):
        Encoder(16, depth=-1, num_heads=2)
    with pytest.raises(ValueError, match=r"an empty batch \(B = 0\)"):
        build_attention(name, 16, 2)(torch.randn(0, 3, 4, 16))



def test_rotary_theta_sets_the_frequencies():
    """RoPE with base theta: pair (i, i + d/2) of position n is rotated by n * theta^(-2i/d). Kills: theta ignored
    (10000 hard-coded)."""
    d, theta, n = 8, 100.0, 5
    rot = RotaryEmbedding(d, theta)
    x = torch.randn(2, n, d, dtype=D64)
    freqs = theta ** (-torch.arange(0, d, 2, dtype=D64) / d)  # (d/2,)
    ang = torch.arange(n, dtype=D64)[:, None] * freqs  # (n, d/2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    ref = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)
    torch.testing.assert_close(rot(x), ref, rtol=1e-6, atol=1e-6)  # angles are float32 by design


def test_encoder_drop_path_grows_linearly_with_depth():
    """Stochastic depth 0 .. drop_path linearly over the blocks (timm / DeiT). Kills: the same rate in every block."""
    enc = Encoder(16, depth=4, num_heads=2, drop_path=0.3)
    assert [b.drop_path.p for b in enc.blocks] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert [b.drop_path.p for b in Encoder(16, depth=1, num_heads=2, drop_path=0.3).blocks] == [0.0]


def test_sequential_axial_attention_normalises_every_modes_queries_and_keys():
    """``combine="sequential"`` with ``qk_norm=True``: every stage's fresh q/k go through the q/k LayerNorms, not only
    the first stage's. Explicit per-fibre loop. Kills: q/k norm skipped after the first mode."""
    torch.manual_seed(0)
    att = AxialAttention(8, 2, qk_norm=True, combine="sequential", num_modes=2).double().eval()
    for ln in (att.q_norm, att.k_norm):  # make the norms non-trivial
        torch.nn.init.normal_(ln.weight)
        torch.nn.init.normal_(ln.bias)
    x = torch.randn(2, 3, 4, 8, dtype=D64)

    def along(q, k, v, m):
        out = torch.empty_like(v)
        others = [range(s) if i != m else [slice(None)] for i, s in enumerate(v.shape[2:-1])]
        for idx in itertools.product(*others):
            sl = (slice(None), slice(None), *idx)
            out[sl] = (q[sl] @ k[sl].transpose(-1, -2) / q.shape[-1] ** 0.5).softmax(-1) @ v[sl]
        return out

    with torch.no_grad():
        q, k, v = att.qkv(x)  # first stage: normalised q/k
        y = along(q, k, v, 0)
        cur = y.movedim(1, -2).flatten(-2)
        q2, k2, v2 = (t.movedim(-2, 1) for t in
                      att.extra[0](cur).view(*cur.shape[:-1], 3, att.heads, att.dim_head).unbind(-3))
        ref = att.out(along(att.q_norm(q2), att.k_norm(k2), v2, 1))
        torch.testing.assert_close(att(x), ref)


@pytest.mark.parametrize("name", ["full", "axial", "divided"])
def test_attn_dropout_also_applies_when_maps_are_recorded(name):
    """In training, ``attn_dropout`` drops attention weights on the explicit-maps path too (while recording), not
    only on the SDPA path; the recorded maps are the weights before dropout."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 16)
    no_attn = build_attention(name, 16, 2, dropout=0.0, attn_dropout=0.0).train()
    with_attn = build_attention(name, 16, 2, dropout=0.0, attn_dropout=0.5).train()
    with_attn.load_state_dict(no_attn.state_dict())
    y0, maps0 = _with_maps(no_attn, x)
    y1, maps1 = _with_maps(with_attn, x)
    assert not torch.allclose(y1, y0)
    torch.testing.assert_close(maps1[0], maps0[0])  # (later stages of divided see the dropped-out first stage)
    torch.testing.assert_close(with_attn.eval()(x), y0)  # eval: no dropout


def test_axial_attention_refuses_negative_modes():
    with pytest.raises(ValueError, match="distinct non-negative"):
        AxialAttention(8, 2, modes=(-1,))
    with pytest.raises(ValueError, match="distinct non-negative"):
        AxialAttention(8, 2, modes=(0, -2))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(ATTENTION_TYPES))
def test_layers_validate_their_inputs_once(name, causal, monkeypatch):
    """A layer checks ``x`` and ``masks`` at its entry and then calls the unchecked functional internals: the public
    functional checks are never reached from a layer's forward, backward or recorded forward."""
    from hoformer.functional import kronecker as kron_mod
    from hoformer.functional import products as products_mod
    from hoformer.functional import scores as scores_mod

    def checked_again(*args, **kwargs):
        raise AssertionError("a layer's input was validated a second time")

    for mod, fname in [(kron_mod, "_check_qkv"), (products_mod, "_check_factors"), (kron_mod, "_check_qk_masks"),
                       (scores_mod, "_check_qk")]:
        monkeypatch.setattr(mod, fname, checked_again)
    layer = build_attention(name, 16, 2, num_modes=2, causal_mode=1 if causal else None)
    x = torch.randn(2, 3, 4, 16, requires_grad=True)
    masks = [torch.ones(3, 3, dtype=torch.bool).tril(), None]
    layer(x, masks=masks).sum().backward()
    with record_attention(layer) as maps:
        layer(x)
    assert maps


@pytest.mark.parametrize("shape", [(5, 3, 8), (7, 8)])
@pytest.mark.parametrize("out", [4, 16])
def test_linear_t_is_linear_with_its_gradients(shape, out):
    """``functional._linear.linear_t`` is ``F.linear`` without bias: output and both gradients in float64 (the
    transposed weight-gradient layout when out > in, the plain one otherwise), gradcheck, and only the gradients
    asked for."""
    from hoformer.functional._linear import linear_t

    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out, shape[-1], dtype=torch.float64, requires_grad=True)
    y = linear_t(x, w)
    ref = F.linear(x, w)
    torch.testing.assert_close(y, ref, rtol=1e-13, atol=1e-13)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(ref, (x, w), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(linear_t, (x[..., :3, :] if x.ndim == 3 else x[:3], w))
    frozen = torch.randn(out, shape[-1], dtype=torch.float64)
    (gx,) = torch.autograd.grad(linear_t(x, frozen), (x,), torch.randn(*shape[:-1], out, dtype=torch.float64))
    assert gx.shape == x.shape
