"""Causality along one mode (``causal_mode``): the prefix property of every attention that accepts it, exact zero
gradients from the future, the causal Kronecker math against a float64 reference with explicit loops over the query
index and dense Kronecker matrices, and the project-then-pool reference of ``qk_bias``.

Axis legend: ``b`` batch, ``h`` heads, ``t`` the causal mode, ``n`` another mode, ``e`` head dim, ``d`` model dim.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from hoformer.functional import causal_kronecker_attention, kron_dense, kron_sum_dense
from hoformer.functional.kronecker import elu_feature_map
from hoformer.layers import ATTENTION_TYPES, KroneckerAttention, build_attention, record_attention


def _with_maps(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` and the maps it recorded (every recorded list, in call order, concatenated)."""
    with record_attention(layer) as rec:
        y = layer(*args, **kwargs)
    return y, [m for _, ms in rec for m in ms]


F64 = torch.float64
KRONECKER = ["kronecker_product", "kronecker_sum", "kronecker_linear", "kronecker_tanimoto", "kronecker_cosine"]
DENSE = ["full", "axial", "axial_sequential", "divided"]


def _make(name, causal_mode, nmodes, **kw):
    torch.manual_seed(0)
    layer = build_attention(name, 16, 2, num_modes=nmodes, causal_mode=causal_mode, rope_modes=(causal_mode,), **kw)
    for p in layer.parameters():  # non-trivial norms / biases
        if p.ndim == 1:
            torch.nn.init.normal_(p, std=0.5)
    return layer.double().eval()


def _take(y, mode, t):
    return y.select(1 + mode, t)


def _prefix(x, mode, t):
    return x.narrow(1 + mode, 0, t + 1)


CASES = [(sizes, c) for sizes in [(5, 3), (4, 3, 2)] for c in range(len(sizes))]


def test_every_attention_type_accepts_causal_mode():
    assert set(ATTENTION_TYPES) == set(KRONECKER + DENSE)


@pytest.mark.parametrize("sizes,causal_mode", CASES)
@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_prefix_property(name, sizes, causal_mode):
    """``layer(x)`` at index ``t`` of the causal mode equals ``layer(x[:t+1])`` at its last index (float64), with RoPE
    on the causal mode; and the input after ``t`` matters for later outputs (the layer is not trivially local)."""
    layer = _make(name, causal_mode, len(sizes))
    x = torch.randn(2, *sizes, 16, dtype=F64)
    y = layer(x)
    for t in range(sizes[causal_mode]):
        torch.testing.assert_close(_take(y, causal_mode, t), _take(layer(_prefix(x, causal_mode, t)), causal_mode, t),
                                   rtol=1e-10, atol=1e-10)
    x2 = x.clone()
    x2.select(1 + causal_mode, 0).add_(1.0)  # the first index feeds every later one
    assert (layer(x2) - y).abs().amax() > 1e-3


@pytest.mark.parametrize("sizes,causal_mode", CASES)
@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_no_gradient_from_the_future(name, sizes, causal_mode):
    """``d y[t] / d x[t']`` is exactly zero for every ``t' > t`` and not zero for ``t' = t``."""
    layer = _make(name, causal_mode, len(sizes))
    x = torch.randn(1, *sizes, 16, dtype=F64, requires_grad=True)
    y = layer(x)
    n = sizes[causal_mode]
    for t in range(n):
        (g,) = torch.autograd.grad(_take(y, causal_mode, t).sum(), x, retain_graph=True)
        assert (_take(g, causal_mode, t) != 0).any()
        for later in range(t + 1, n):
            assert (_take(g, causal_mode, later) == 0).all(), (t, later)


@pytest.mark.parametrize("pool", ["sum", "mean"])
@pytest.mark.parametrize("qk_bias", [False, True])
@pytest.mark.parametrize("name", KRONECKER)
def test_causal_kronecker_equals_the_non_causal_layer_on_each_prefix(name, pool, qk_bias):
    """With the same weights, the causal layer at ``t`` is the non-causal layer run on ``x[:t+1]`` (read at its last
    index): prefix pools are its pools, the lower-triangular row its unmasked last row."""
    sizes, c = (4, 3, 2), 1
    causal = _make(name, c, 3, pool=pool, qk_bias=qk_bias)
    plain = build_attention(name, 16, 2, num_modes=3, rope_modes=(c,), pool=pool, qk_bias=qk_bias).double().eval()
    plain.load_state_dict(causal.state_dict())
    x = torch.randn(2, *sizes, 16, dtype=F64)
    y = causal(x)
    for t in range(sizes[c]):
        torch.testing.assert_close(_take(y, c, t), _take(plain(_prefix(x, c, t)), c, t), rtol=1e-10, atol=1e-10)


def test_reproduction_changes_only_the_last_step():
    torch.manual_seed(0)
    T, N, D = 8, 5, 32
    for combine, kernel in itertools.product(["product", "sum"], ["softmax", "linear"]):
        attn = KroneckerAttention(D, num_heads=4, combine=combine, kernel=kernel, num_modes=2, causal_mode=0).eval()
        x = torch.randn(1, T, N, D)
        x2 = x.clone()
        x2[:, -1] += 10 * torch.randn(N, D)
        change = (attn(x) - attn(x2)).abs().amax(dim=(0, 2, 3))
        assert change[-1] > 1e-2
        torch.testing.assert_close(change[:-1], torch.zeros(T - 1), rtol=0, atol=1e-6)  # FAVOR+: rounding only


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("sizes,causal_mode", [((8,), 0), ((8, 3), 0), ((3, 8), 1), ((3, 8, 2), 1)])
def test_a_large_future_input_leaves_the_past_unchanged(sizes, causal_mode, combine, qk_norm, dtype):
    """FAVOR+ along the causal mode: one future index scaled x1000 (its keys far above the past ones) changes no
    earlier output, and decoding step by step gives the full forward on that input. A key stabiliser shared by every
    key of the causal mode would flush the past keys' features to 0 (0.4-0.7 off in either dtype)."""
    torch.manual_seed(0)
    layer = KroneckerAttention(16, 2, combine=combine, kernel="linear", qk_norm=qk_norm, num_modes=len(sizes),
                               causal_mode=causal_mode).to(dtype).eval()
    x = torch.randn(2, *sizes, 16, dtype=dtype)
    t0 = 5
    x2 = x.clone()
    x2.select(1 + causal_mode, t0).mul_(1000.0)
    y, y2 = layer(x), layer(x2)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y2.narrow(1 + causal_mode, 0, t0), y.narrow(1 + causal_mode, 0, t0), rtol=0, atol=tol)
    assert torch.isfinite(y2).all()
    assert (y2 - y).narrow(1 + causal_mode, t0, 1).abs().amax() > 1e-2  # the scaled index itself does change
    cache = layer.init_cache()
    steps = torch.cat([layer.step(x2.narrow(1 + causal_mode, t, 1), cache) for t in range(sizes[causal_mode])],
                      dim=1 + causal_mode)
    tol = 1e-5 if dtype == torch.float32 else 1e-10  # rounding relative to the scaled index's outputs (~100)
    torch.testing.assert_close(steps, y2, rtol=tol, atol=tol * float(y2.detach().abs().amax()))


def test_per_mode_mask_alone_is_not_causal():
    """What the causal mode fixes: a lower-triangular mask on mode 0 leaves the other factors pooled over the future."""
    torch.manual_seed(0)
    attn = KroneckerAttention(16, num_heads=2, num_modes=2).double().eval()
    x = torch.randn(1, 6, 4, 16, dtype=F64)
    x2 = x.clone()
    x2[:, -1] += 1.0
    mask = [torch.ones(6, 6, dtype=torch.bool).tril(), None]
    assert (attn(x, masks=mask) - attn(x2, masks=mask))[:, 0].abs().amax() > 1e-6


@pytest.mark.parametrize("name", KRONECKER + DENSE)
def test_causal_mode_is_checked(name):
    with pytest.raises(ValueError, match="causal_mode"):
        build_attention(name, 16, 2, num_modes=2, causal_mode=2)
    with pytest.raises(ValueError, match="causal_mode"):
        build_attention(name, 16, 2, causal_mode=-1)
    layer = build_attention(name, 16, 2, causal_mode=2)
    with pytest.raises(ValueError, match="causal_mode=2"):
        layer(torch.randn(1, 3, 4, 16))


def test_causal_mode_combines_with_a_mask_on_the_causal_mode():
    """A mask on the causal mode is ANDed with the lower-triangular one (here: a padding mask)."""
    layer = _make("kronecker_product", 0, 2)
    x = torch.randn(1, 5, 3, 16, dtype=F64)
    pad = torch.ones(5, 5, dtype=torch.bool)
    pad[:, 1] = False
    y, (s0, s1) = _with_maps(layer, x, masks=[pad, None])
    assert (s0[..., 1] == 0).all() and (s0.triu(1) == 0).all()
    assert s1.shape == (1, 2, 5, 3, 3)


# ------------------------------------------------------------------------------------------ functional
def _naive_causal(q, k, v, c, combine, kernel, masks):
    """Float64, one ``(b, h)`` and one query index ``t`` at a time: factors written from their definition (softmax or
    row-normalised ``phi(q) phi(k)^T`` over the allowed keys), the other modes' ``(x)`` / ``(+)`` as dense matrices."""
    b_, h_, sizes = v.shape[0], v.shape[1], v.shape[2:-1]
    nm, T = len(sizes), sizes[c]
    rest = [i for i in range(nm) if i != c]
    vp = v.movedim(2 + c, 2)  # (b, h, t, rest.., e)
    y = torch.zeros_like(vp)

    def factor(qq, kk, mask):
        n = qq.shape[0]
        s = torch.zeros(n, kk.shape[0], dtype=F64)
        for i in range(n):
            for j in range(kk.shape[0]):
                if mask is not None and not mask[i, j]:
                    continue
                s[i, j] = (qq[i] @ kk[j] / math.sqrt(qq.shape[-1])).exp() if kernel == "softmax" else (
                    elu_feature_map(qq[i]) @ elu_feature_map(kk[j]))
            s[i] = s[i] / s[i].sum() if s[i].sum() > 0 else s[i]
        return s

    for b, h in itertools.product(range(b_), range(h_)):
        mc = torch.ones(T, T, dtype=torch.bool).tril()
        if masks[c] is not None:
            mc = mc & masks[c]
        s_c = factor(q[c][b, h], k[c][b, h], mc)
        for t in range(T):
            s_rest = [factor(q[i][b, h, t], k[i][b, h, t], masks[i]) for i in rest]
            z = sum(s_c[t, tp] * vp[b, h, tp].reshape(-1, v.shape[-1]) for tp in range(T))
            if combine == "product":
                out = kron_dense(s_rest) @ z if rest else z
            else:
                out = z + (kron_sum_dense(s_rest) @ vp[b, h, t].reshape(-1, v.shape[-1]) if rest else 0)
                out = out / nm
            y[b, h, t] = out.view(vp.shape[3:])
    return y.movedim(2, 2 + c)


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("sizes,causal_mode", [((4,), 0), ((4, 3), 0), ((4, 3), 1), ((3, 2, 3), 1), ((3, 2, 3), 2)])
def test_causal_kronecker_attention_matches_naive_reference(sizes, causal_mode, combine, kernel):
    torch.manual_seed(0)
    b, h, e = 2, 2, 3
    T = sizes[causal_mode]
    q = [torch.randn(b, h, T, e, dtype=F64) if i == causal_mode else torch.randn(b, h, T, n, e, dtype=F64)
         for i, n in enumerate(sizes)]
    k = [torch.randn_like(t) for t in q]
    v = torch.randn(b, h, *sizes, 4, dtype=F64)
    masks = [None] * len(sizes)
    other = [i for i in range(len(sizes)) if i != causal_mode]
    if other:  # a static mask on another mode (diagonal kept: no empty row)
        n = sizes[other[0]]
        masks[other[0]] = (torch.rand(n, n) < 0.5) | torch.eye(n, dtype=torch.bool)
    y, factors = causal_kronecker_attention(q, k, v, causal_mode=causal_mode, combine=combine, kernel=kernel,
                                            masks=masks, return_factors=True)
    torch.testing.assert_close(y, _naive_causal(q, k, v, causal_mode, combine, kernel, masks))
    assert factors[causal_mode].shape == (b, h, T, T) and (factors[causal_mode].triu(1) == 0).all()
    for i in other:
        assert factors[i].shape == (b, h, T, sizes[i], sizes[i])


def _inputs(sizes, c, b=2, h=2, e=3, dv=4, seed=0):
    torch.manual_seed(seed)
    T = sizes[c]
    q = [torch.randn(b, h, T, e, dtype=F64) if i == c else torch.randn(b, h, T, n, e, dtype=F64)
         for i, n in enumerate(sizes)]
    return q, [torch.randn_like(t) for t in q], torch.randn(b, h, *sizes, dv, dtype=F64)


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("sizes,causal_mode", [((4, 3), 0), ((3, 2, 4), 2)])
def test_a_mask_on_the_causal_mode_and_per_head_masks_match_the_reference(sizes, causal_mode, combine, kernel):
    """A mask on the causal mode itself (combined with the triangle; one query row left with no key: a zero row) and
    a per-sample, per-head mask ``(B, H, n, n)`` on another mode, against the loop reference run per ``(b, h)``."""
    q, k, v = _inputs(sizes, causal_mode)
    T, b, h = sizes[causal_mode], v.shape[0], v.shape[1]
    mc = (torch.rand(T, T) < 0.6) | torch.eye(T, dtype=torch.bool)
    mc[1] = False  # query 1 may attend nothing
    other = next(i for i in range(len(sizes)) if i != causal_mode)
    n = sizes[other]
    mo = (torch.rand(b, h, n, n) < 0.5) | torch.eye(n, dtype=torch.bool)
    masks = [None] * len(sizes)
    masks[causal_mode], masks[other] = mc, mo
    y = causal_kronecker_attention(q, k, v, causal_mode=causal_mode, combine=combine, kernel=kernel, masks=masks)
    for bi, hi in itertools.product(range(b), range(h)):
        one = lambda t: t[bi:bi + 1, hi:hi + 1]
        per = [m if i != other else mo[bi, hi] for i, m in enumerate(masks)]
        ref = _naive_causal([one(t) for t in q], [one(t) for t in k], one(v), causal_mode, combine, kernel, per)
        torch.testing.assert_close(one(y), ref)
    assert (y.select(2 + causal_mode, 1) == 0).all() if combine == "product" else True  # no key: no causal term


def _apply_factors(factors, v, c, combine):
    """Float64 loops: the causal output from given factors (the causal mode's ``(B, H, T, T)`` and every other
    mode's ``(B, H, T, Ni, Ni)``, mode order), as in :func:`_naive_causal`."""
    nm, T = v.ndim - 3, v.shape[2 + c]
    rest = [i for i in range(nm) if i != c]
    vp = v.movedim(2 + c, 2)
    y = torch.zeros_like(vp)
    for b, h, t in itertools.product(range(v.shape[0]), range(v.shape[1]), range(T)):
        z = sum(factors[c][b, h, t, tp] * vp[b, h, tp].reshape(-1, v.shape[-1]) for tp in range(T))
        s_rest = [factors[i][b, h, t] for i in rest]
        if combine == "product":
            out = kron_dense(s_rest) @ z if rest else z
        else:
            out = (z + (kron_sum_dense(s_rest) @ vp[b, h, t].reshape(-1, v.shape[-1]) if rest else 0)) / nm
        y[b, h, t] = out.view(vp.shape[3:])
    return y.movedim(2, 2 + c)


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("sizes,causal_mode", [((4, 3), 0), ((3, 2, 4), 2)])
def test_causal_dropout_drops_the_returned_factors_and_keeps_causality(sizes, causal_mode, combine):
    """``dropout_p > 0``: the output is that of the returned (undropped) factors after hoformer's dropout, drawn in
    the kernel's order (the causal mode's factor, then the others in mode order) from the same seed; outputs at
    query ``t`` still get no gradient from values after ``t``."""
    from hoformer.functional import dropout

    q, k, v = _inputs(sizes, causal_mode)
    v.requires_grad_(True)
    torch.manual_seed(7)
    y, factors = causal_kronecker_attention(q, k, v, causal_mode=causal_mode, combine=combine, dropout_p=0.3,
                                            return_factors=True)
    torch.manual_seed(7)
    order = [causal_mode] + [i for i in range(len(sizes)) if i != causal_mode]
    dropped = dict(zip(order, (dropout(factors[i].detach(), p=0.3) for i in order)))
    assert any((dropped[i] == 0).any() and (factors[i] > 0).all() for i in order[1:]) or len(sizes) == 1
    torch.testing.assert_close(y, _apply_factors([dropped[i] for i in range(len(sizes))], v, causal_mode, combine))
    t = 1
    y.select(2 + causal_mode, t).sum().backward()
    assert (v.grad.narrow(2 + causal_mode, t + 1, sizes[causal_mode] - t - 1) == 0).all()


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("sizes,causal_mode", [((3, 2), 0), ((2, 3, 2), 1)])
def test_causal_kronecker_attention_gradcheck(sizes, causal_mode, combine, kernel):
    """Gradients of queries, keys and values (the linear kernel's detached stabilisers included) by finite
    differences, float64, with a static mask on another mode."""
    q, k, v = _inputs(sizes, causal_mode, b=1, h=2, e=2, dv=2)
    other = next(i for i in range(len(sizes)) if i != causal_mode)
    masks = [None] * len(sizes)
    masks[other] = torch.eye(sizes[other], dtype=torch.bool) | (torch.rand(sizes[other], sizes[other]) < 0.5)
    m = len(sizes)

    def f(*ts):
        return causal_kronecker_attention(list(ts[:m]), list(ts[m:2 * m]), ts[-1], causal_mode=causal_mode,
                                          combine=combine, kernel=kernel, masks=masks)

    assert torch.autograd.gradcheck(f, [t.requires_grad_(True) for t in (*q, *k, v)])


def test_causal_kronecker_attention_checks_its_inputs():
    v = torch.randn(1, 2, 4, 3, 5)
    q = [torch.randn(1, 2, 4, 5), torch.randn(1, 2, 4, 3, 5)]
    with pytest.raises(ValueError, match=r"`q\[1\]` must have shape \(B, H, 4, 3, E\)"):
        causal_kronecker_attention([q[0], torch.randn(1, 2, 3, 5)], q, v)
    with pytest.raises(ValueError, match="causal_mode"):
        causal_kronecker_attention(q, q, v, causal_mode=2)
    with pytest.raises(ValueError, match=r"`q\[0\]` must have shape \(B, H, 3, 4, E\)"):
        causal_kronecker_attention(q, q, v, causal_mode=1)


# ---------------------------------------------------------------------------------------------- qk_bias
def _project_then_pool_reference(att, x):
    """The reference implementation's order for ``qk_bias=True``: every token projected with weight and bias at full
    resolution, then sum-pooled over the other modes, then the per-head norm and softmax factors, applied as the
    Kronecker product to the values; written with dense matrices in float64."""
    b_, sizes = x.shape[0], x.shape[1:-1]
    k_, heads, e = len(sizes), att.heads, att.dim_head
    factors = []
    for i in range(k_):
        proj = att.to_qk[i]
        full = x @ proj.weight.T + proj.bias  # (b, n.., 2 h e)
        pooled = full.sum(dim=[1 + j for j in range(k_) if j != i])  # (b, n_i, 2 h e)
        q, k = pooled.view(b_, sizes[i], 2, heads, e).permute(2, 0, 3, 1, 4)
        q, k = att.q_norm(q), att.k_norm(k)
        factors.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(e), -1))
    v = (x @ att.to_v.weight.T + att.to_v.bias).reshape(b_, -1, heads, e)  # (b, N, h, e)
    out = torch.einsum("bhij,bjhe->bihe", kron_dense(factors), v)
    return out.reshape(b_, *sizes, heads * e) @ att.to_out[0].weight.T + att.to_out[0].bias


def test_qk_bias_reproduces_project_then_pool_with_bias():
    torch.manual_seed(0)
    att = KroneckerAttention(16, 2, num_modes=3, qk_bias=True).double().eval()
    for lin in att.to_qk:
        torch.nn.init.normal_(lin.bias)
    x = torch.randn(2, 3, 4, 2, 16, dtype=F64)
    torch.testing.assert_close(att(x), _project_then_pool_reference(att, x))
    plain = KroneckerAttention(16, 2, num_modes=3).double().eval()
    plain.load_state_dict({k: v for k, v in att.state_dict().items() if not k.endswith("to_qk.0.bias")
                           and not k.endswith("to_qk.1.bias") and not k.endswith("to_qk.2.bias")})
    assert not torch.allclose(plain(x), att(x))  # the bias matters, scaled by the pooled counts
