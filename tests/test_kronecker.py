"""hoformer.functional.kronecker against dense references (float64)."""
from __future__ import annotations

import itertools

import pytest
import torch

from hoformer.functional import (
    cosine_scores,
    elu_feature_map,
    full_attention,
    kron_apply,
    kron_dense,
    kron_sum_apply,
    kron_sum_dense,
    kronecker_attention,
    mode_attention_factors,
    tanimoto_scores,
)

SHAPES = [(4,), (3, 5), (2, 3, 4), (2, 3, 2, 3), (3, 13), (2, 3, 13)]  # 13 > 2 d: unfolded mode products
f64 = torch.float64


def _dense_apply(mat, v):
    b, h = v.shape[:2]
    return (mat @ v.reshape(b, h, -1, v.shape[-1])).view_as(v)


@pytest.mark.parametrize("sizes", SHAPES)
def test_kron_apply_matches_torch_kron(sizes):
    b, h, d = 2, 3, 5
    v = torch.randn(b, h, *sizes, d, dtype=f64)
    fs = [torch.randn(b, h, n, n, dtype=f64) for n in sizes]
    # reference built with torch.kron, entry by entry over (b, h)
    ref = torch.empty_like(v)
    for i, j in itertools.product(range(b), range(h)):
        mat = fs[0][i, j]
        for s in fs[1:]:
            mat = torch.kron(mat, s[i, j])
        ref[i, j] = (mat @ v[i, j].reshape(-1, d)).view(*sizes, d)
    torch.testing.assert_close(kron_apply(fs, v), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kron_dense(fs), torch.stack([torch.stack([_kron_loop(fs, i, j) for j in range(h)]) for i in range(b)]))


def _kron_loop(fs, i, j):
    mat = fs[0][i, j]
    for s in fs[1:]:
        mat = torch.kron(mat, s[i, j])
    return mat


@pytest.mark.parametrize("sizes", SHAPES)
@pytest.mark.parametrize("normalize", [True, False])
def test_kron_sum_apply_matches_explicit_sum(sizes, normalize):
    b, h, d = 2, 2, 3
    v = torch.randn(b, h, *sizes, d, dtype=f64)
    fs = [torch.randn(b, h, n, n, dtype=f64) for n in sizes]
    # explicit Kronecker sum: sum_m I (x) .. (x) S_m (x) .. (x) I with torch.kron
    ref = torch.zeros_like(v)
    for i, j in itertools.product(range(b), range(h)):
        total = 0
        for m in range(len(sizes)):
            mat = torch.ones(1, 1, dtype=f64)
            for q, n in enumerate(sizes):
                mat = torch.kron(mat, fs[q][i, j] if q == m else torch.eye(n, dtype=f64))
            total = total + mat
        if normalize:
            total = total / len(sizes)
        ref[i, j] = (total @ v[i, j].reshape(-1, d)).view(*sizes, d)
    torch.testing.assert_close(kron_sum_apply(fs, v, normalize=normalize), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_dense_apply(kron_sum_dense(fs, normalize), v), ref)


def test_broadcast_factors():
    """Factors without batch/head dims or with size-1 ones broadcast, checked against explicit torch.kron."""
    v = torch.randn(3, 4, 5, 6, 2, dtype=f64)
    s1, s2 = torch.randn(5, 5, dtype=f64), torch.randn(1, 4, 6, 6, dtype=f64)
    ref = torch.stack([torch.stack([(torch.kron(s1, s2[0, j]) @ v[i, j].reshape(30, 2)).view(5, 6, 2)
                                    for j in range(4)]) for i in range(3)])
    torch.testing.assert_close(kron_apply([s1, s2], v), ref)
    ref_sum = torch.stack([torch.stack([((torch.kron(s1, torch.eye(6, dtype=f64)) + torch.kron(torch.eye(5, dtype=f64),
                                                                                               s2[0, j])) / 2
                                         @ v[i, j].reshape(30, 2)).view(5, 6, 2) for j in range(4)]) for i in range(3)])
    torch.testing.assert_close(kron_sum_apply([s1, s2], v), ref_sum)


def _pooled_qk(sizes, b=2, h=3, dqk=4):
    q = [torch.randn(b, h, n, dqk, dtype=f64) for n in sizes]
    k = [torch.randn(b, h, n, dqk, dtype=f64) for n in sizes]
    return q, k


@pytest.mark.parametrize("sizes", SHAPES)
@pytest.mark.parametrize("combine", ["product", "sum"])
def test_softmax_attention_dense_and_row_stochastic(sizes, combine):
    q, k = _pooled_qk(sizes)
    v = torch.randn(2, 3, *sizes, 5, dtype=f64)
    y, fs = kronecker_attention(q, k, v, combine=combine, return_factors=True)
    ref_fs = [torch.softmax(qi @ ki.transpose(-1, -2) / 2.0, -1) for qi, ki in zip(q, k)]  # Dqk=4 -> scale 1/2
    for a, r in zip(fs, ref_fs):
        torch.testing.assert_close(a, r)
    dense = kron_dense(ref_fs) if combine == "product" else kron_sum_dense(ref_fs, normalize=True)
    # Theorem 4.1 / Corollary 4.2: product and (1/k) sum of row-stochastic factors are row-stochastic
    torch.testing.assert_close(dense.sum(-1), torch.ones(dense.shape[:-1], dtype=f64))
    torch.testing.assert_close(y, _dense_apply(dense, v))


def test_scale_keyword_and_signed_score_fn():
    q, k = _pooled_qk((3, 4))
    v = torch.randn(2, 3, 3, 4, 2, dtype=f64)
    y, fs = kronecker_attention(q, k, v, scale=0.1, return_factors=True)
    torch.testing.assert_close(fs[0], torch.softmax(q[0] @ k[0].transpose(-1, -2) * 0.1, -1))
    y, fs = kronecker_attention(q, k, v, score_fn=tanimoto_scores, return_factors=True)
    qk = torch.einsum("...nd,...md->...nm", q[1], k[1])  # Weaver eq 29, written out: qk / (|q|^2 + |k|^2 - qk)
    tanimoto = qk / (q[1].square().sum(-1)[..., :, None] + k[1].square().sum(-1)[..., None, :] - qk)
    torch.testing.assert_close(fs[1], tanimoto, rtol=1e-5, atol=1e-6)  # the scores' eps = 1e-6 in the denominator
    torch.testing.assert_close(y, _dense_apply(kron_dense(fs), v))


def test_masks_and_fully_masked_rows():
    sizes = (4, 5)
    q, k = _pooled_qk(sizes)
    v = torch.randn(2, 3, *sizes, 3, dtype=f64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    pad = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    pad[0, :, 1, :] = False  # row 1 of sample 0 may attend nothing
    y, fs = kronecker_attention(q, k, v, masks=[pad, causal], return_factors=True)
    assert torch.isfinite(y).all()
    assert (fs[1].triu(1) == 0).all(), "causal mask must zero future keys"
    torch.testing.assert_close(fs[1].sum(-1), torch.ones(2, 3, 5, dtype=f64))
    assert (fs[0][0, :, 1] == 0).all() and (y[0, :, 1] == 0).all(), "fully masked rows give zeros"
    ref0 = torch.softmax((q[0] @ k[0].transpose(-1, -2) / 2).masked_fill(~pad, float("-inf")), -1).nan_to_num(0.0)
    torch.testing.assert_close(fs[0], ref0)
    torch.testing.assert_close(y, _dense_apply(kron_dense(fs), v))
    # gradients stay finite through fully-masked rows
    qg = [t.clone().requires_grad_() for t in q]
    kronecker_attention(qg, k, v, masks=[pad, causal]).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in qg)
    # signed kernels (Weaver valence attention): the factor is the raw score times the mask, so masked keys get
    # exactly 0 (not a softmax), fully masked rows are 0, and y is the dense Kronecker product of those factors
    for score_fn in (tanimoto_scores, cosine_scores):
        y, fs = kronecker_attention(q, k, v, masks=[pad, causal], score_fn=score_fn, return_factors=True)
        raw = [score_fn(qi, ki) for qi, ki in zip(q, k)]
        assert (raw[1][..., ~causal] != 0).all() and (raw[0][0, :, 1] != 0).all()  # the masks remove something
        ref = [torch.where(m, r, 0.0) for r, m in zip(raw, (pad, causal))]
        for a, r in zip(fs, ref):
            torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
        assert (fs[1].triu(1) == 0).all() and (fs[0][0, :, 1] == 0).all(), score_fn.__name__
        torch.testing.assert_close(y, _dense_apply(kron_dense(ref), v), rtol=1e-12, atol=1e-12)
        assert (y[0, :, 1] == 0).all()
    # the Kronecker sum with the same masks: (1/k) sum of I (x) S_m (x) I over the masked softmax / signed factors
    ref1 = torch.softmax((q[1] @ k[1].transpose(-1, -2) / 2).masked_fill(~causal, float("-inf")), -1)
    for score_fn, want in ((None, [ref0, ref1]),
                           (tanimoto_scores, [torch.where(m, tanimoto_scores(qi, ki), 0.0)
                                              for qi, ki, m in zip(q, k, (pad, causal))])):
        y = kronecker_attention(q, k, v, masks=[pad, causal], combine="sum", score_fn=score_fn)
        torch.testing.assert_close(y, _dense_apply(kron_sum_dense(want, normalize=True), v), rtol=1e-12, atol=1e-12)


def _linear_ref(q, k, masks):
    """Dense linear-kernel factors: ``A = phi(q) phi(k)^T`` with masked entries 0, rows normalised (0 if empty)."""
    fs = []
    for qi, ki, m in zip(q, k, masks):
        a = elu_feature_map(qi) @ elu_feature_map(ki).transpose(-1, -2)
        a = a if m is None else torch.where(m, a, 0.0)
        s = a.sum(-1, keepdim=True)
        fs.append(torch.where(s > 0, a / s, 0.0))
    return fs


_ROUTES = {"explicit": lambda n, f, p: True, "associative": lambda n, f, p: False,
           "mixed": lambda n, f, p: n <= 3, "cost": None}


@pytest.mark.parametrize("sizes", [(5,), (3, 4), (2, 3, 4), (3, 13)])
@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("route", list(_ROUTES))
def test_linear_kernel_equals_dense_phi(monkeypatch, sizes, combine, route):
    """Whichever way each factor is applied (formed and applied by the cache-blocked kernels, by associativity, a mix
    of both, or as the cost rule picks), the linear kernel is the dense row-normalised ``phi(q_i) phi(k_i)^T``."""
    from hoformer.functional import kronecker as kr

    if _ROUTES[route] is not None:
        monkeypatch.setattr(kr, "forms_linear_factor", _ROUTES[route])
    q, k = _pooled_qk(sizes)
    v = torch.randn(2, 3, *sizes, 2, dtype=f64)
    y, fs = kronecker_attention(q, k, v, combine=combine, kernel="linear", return_factors=True)
    ref = _linear_ref(q, k, [None] * len(sizes))
    for a, r in zip(fs, ref, strict=True):
        torch.testing.assert_close(a, r)
    dense = kron_dense(ref) if combine == "product" else kron_sum_dense(ref, normalize=True)
    torch.testing.assert_close(dense.sum(-1), torch.ones(dense.shape[:-1], dtype=f64))  # row-stochastic (Thm 4.1)
    torch.testing.assert_close(y, _dense_apply(dense, v))
    torch.testing.assert_close(kronecker_attention(q, k, v, combine=combine, kernel="linear"), y)


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("route", ["cost", "associative"])
def test_linear_kernel_masks_and_fully_masked_rows(monkeypatch, combine, route):
    """Per-mode masks with the linear kernel (any bool pattern: a masked mode's factor is formed, whatever the cost
    rule says about the others): masked entries of ``phi(q) phi(k)^T`` are 0 before the row normalisation, a query
    whose keys are all masked gives zeros, and the gradients equal the dense computation's."""
    from hoformer.functional import kronecker as kr

    if _ROUTES[route] is not None:
        monkeypatch.setattr(kr, "forms_linear_factor", _ROUTES[route])
    sizes = (4, 5, 3)
    q, k = _pooled_qk(sizes)
    for t in (*q, *k):
        t.requires_grad_(True)
    v = torch.randn(2, 3, *sizes, 3, dtype=f64, requires_grad=True)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    pad = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    pad[0, :, 1, :] = False  # query 1 of sample 0 may attend nothing
    pad[1, :, :, 2] = False  # key 2 of sample 1 is padding
    masks = [pad, causal, None]
    y, fs = kronecker_attention(q, k, v, combine=combine, kernel="linear", masks=masks, return_factors=True)
    ref = _linear_ref(q, k, masks)
    for a, r in zip(fs, ref, strict=True):
        torch.testing.assert_close(a, r)
    assert (fs[1].triu(1) == 0).all() and (fs[0][1, :, :, 2] == 0).all()
    assert (fs[0][0, :, 1] == 0).all() and (fs[1].sum(-1) > 0.999).all()
    dense = kron_dense(ref) if combine == "product" else kron_sum_dense(ref, normalize=True)
    want = _dense_apply(dense, v)
    torch.testing.assert_close(y, want)
    if combine == "product":
        assert (y[0, :, 1] == 0).all(), "a fully masked query row gives zeros"
    g = torch.randn_like(y)
    got = torch.autograd.grad((y * g).sum(), [*q, *k, v])
    exp = torch.autograd.grad((want * g).sum(), [*q, *k, v])
    for a, b in zip(got, exp):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("route", ["cost", "associative"])
def test_linear_kernel_rows_without_mass_have_finite_gradients(monkeypatch, route):
    """A query whose features are all 0 (a non-negative feature map such as relu allows it) gets a zero row and finite
    gradients on both routes; the row sums used to be clamped at the dtype's smallest normal number, whose reciprocal
    overflowed in backward (NaN key gradients)."""
    from hoformer.functional import kronecker as kr

    if _ROUTES[route] is not None:
        monkeypatch.setattr(kr, "forms_linear_factor", _ROUTES[route])
    q, k = _pooled_qk((4, 3))
    q[0][..., 1, :] = -1.0  # relu features of query 1 of mode 0: all 0
    for t in (*q, *k):
        t.requires_grad_(True)
    v = torch.randn(2, 3, 4, 3, 2, dtype=f64, requires_grad=True)
    y = kronecker_attention(q, k, v, kernel="linear", feature_map=torch.relu)
    assert (y[:, :, 1] == 0).all()
    grads = torch.autograd.grad((y * 100.0).sum(), [*q, *k, v])
    assert all(torch.isfinite(g).all() for g in grads)


def test_linear_kernel_half_precision_keeps_small_row_sums():
    """FAVOR+ row sums are often below fp16's smallest normal number (6e-5); clamping them there rescaled rows that
    have mass (14% error in fp16). Now fp16 is as close to float64 as its precision allows."""
    from hoformer.layers import KroneckerAttention

    torch.manual_seed(0)
    att = KroneckerAttention(64, 4, kernel="linear", num_modes=2).double().eval()
    x = torch.randn(2, 8, 8, 64, dtype=f64)
    want = att(x)
    got = att.half()(x.half()).double()
    assert (got - want).abs().max() / want.abs().max() < 0.01


@pytest.mark.parametrize("route", ["explicit", "associative"])
@pytest.mark.parametrize("dtype, scale", [(torch.float16, 1e-4), (torch.float32, 1e-21)])
def test_linear_kernel_tiny_features_stay_finite_and_exact(monkeypatch, route, dtype, scale):
    """Features so small that the row sums are subnormal (fp16: ~5e-6; float32: ~1e-40): the reciprocal of such a sum
    overflowed (every output non-finite). Features are rescaled by detached maxima (factors that cancel in the row
    normalisation) and fp16 runs in float32, so outputs match float64 and gradients stay finite on both routes."""
    from hoformer.functional import kronecker as kr

    monkeypatch.setattr(kr, "forms_linear_factor", _ROUTES[route])
    g = torch.Generator().manual_seed(0)
    q, k = (torch.rand(1, 1, 64, 8, generator=g, dtype=f64) * scale for _ in range(2))
    v = torch.randn(1, 1, 64, 2, generator=g, dtype=f64)
    want = kronecker_attention([q], [k], v, kernel="linear", feature_map=lambda t: t)
    qd, kd = q.to(dtype).requires_grad_(), k.to(dtype).requires_grad_()
    got = kronecker_attention([qd], [kd], v.to(dtype), kernel="linear", feature_map=lambda t: t)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-3 if dtype == torch.float16 else 1e-6)
    got.float().sum().backward()
    assert torch.isfinite(qd.grad).all() and torch.isfinite(kd.grad).all()


def test_linear_kernel_cost_rule():
    """The factor of a mode is formed when ``2 n^2 (f + p)`` flops (form, apply) are at most the ``4 n f p`` of the
    associative route: short modes (HOT's 7-32) with many random features are formed, a long mode is not."""
    from hoformer.functional.kronecker import forms_linear_factor

    assert forms_linear_factor(16, 44, 4096) and forms_linear_factor(32, 64, 24 * 16)
    assert not forms_linear_factor(512, 16, 4 * 16) and not forms_linear_factor(96, 16, 7 * 16)
    assert forms_linear_factor(16, 10, 40) and not forms_linear_factor(17, 10, 40)  # the boundary: n (f + p) = 2 f p


def test_gradcheck_product_sum_linear():
    sizes = (2, 3)
    q = [torch.randn(1, 2, n, 3, dtype=f64, requires_grad=True) for n in sizes]
    k = [torch.randn(1, 2, n, 3, dtype=f64, requires_grad=True) for n in sizes]
    v = torch.randn(1, 2, *sizes, 2, dtype=f64, requires_grad=True)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    for combine, kernel, masks in [("product", "softmax", None), ("sum", "softmax", None), ("product", "linear", None),
                                   ("product", "linear", [None, causal]), ("sum", "linear", [None, causal])]:
        fn = lambda *a: kronecker_attention(list(a[:2]), list(a[2:4]), a[4], combine=combine, kernel=kernel,
                                            masks=masks)
        assert torch.autograd.gradcheck(fn, (*q, *k, v), fast_mode=True)
    fs = [torch.randn(1, 1, n, n, dtype=f64, requires_grad=True) for n in (2, 2, 3)]
    vv = torch.randn(1, 1, 2, 2, 3, 2, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c, x: kron_apply([a, b, c], x), (*fs, vv), fast_mode=True)
    assert torch.autograd.gradcheck(lambda a, b, c, x: kron_sum_apply([a, b, c], x), (*fs, vv), fast_mode=True)


def test_full_attention_matches_flattened_softmax():
    q, k, v = (torch.randn(2, 2, 3, 4, 5, dtype=f64) for _ in range(3))
    y = full_attention(q, k, v)
    a = torch.softmax(q.reshape(2, 2, 12, 5) @ k.reshape(2, 2, 12, 5).transpose(-1, -2) / 5**0.5, -1)
    torch.testing.assert_close(y, (a @ v.reshape(2, 2, 12, 5)).view_as(v))
    mask = torch.rand(12, 12, generator=torch.Generator().manual_seed(0)) < 0.5
    mask |= torch.eye(12, dtype=torch.bool)
    mask[3] = False  # a fully masked query row: zeros
    ym = full_attention(q, k, v, mask=mask)
    logits = q.reshape(2, 2, 12, 5) @ k.reshape(2, 2, 12, 5).transpose(-1, -2) / 5**0.5
    ref = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ v.reshape(2, 2, 12, 5)
    torch.testing.assert_close(ym, ref.view_as(v))
    assert (ym.reshape(2, 2, 12, 5)[:, :, 3] == 0).all() and not torch.allclose(ym, y)


@pytest.mark.parametrize("combine", ["product", "sum"])
def test_dropout_hits_the_factors_with_rescale(combine):
    """``dropout_p`` drops entries of each factor S_i (scaled by 1 / (1 - p)) before the Kronecker combination, in
    mode order; ``return_factors`` gives the factors before dropout."""
    q, k = _pooled_qk((3, 4))
    v = torch.randn(2, 3, 3, 4, 2, dtype=f64)
    clean = kronecker_attention(q, k, v, combine=combine, return_factors=True)[1]
    torch.manual_seed(7)
    y, fs = kronecker_attention(q, k, v, combine=combine, dropout_p=0.3, return_factors=True)
    for a, b in zip(fs, clean):
        torch.testing.assert_close(a, b)
    torch.manual_seed(7)
    from hoformer.functional import dropout  # the library's dropout (tests/test_dropout.py: F.dropout's distribution)

    dropped = [dropout(s, p=0.3) for s in clean]
    assert all(((d == 0) | torch.isclose(d, s / 0.7)).all() and (d == 0).any() for d, s in zip(dropped, clean))
    dense = kron_dense(dropped) if combine == "product" else kron_sum_dense(dropped) / 2
    torch.testing.assert_close(y, _dense_apply(dense, v))


def test_bf16_runs_and_is_close():
    """bf16 end to end vs the float64 result on the same (bf16-rounded) inputs: only the computation's rounding is
    left. Measured max abs error 4.0e-3 (about one bf16 half-ulp at |y| ~ 1; reference std 0.27, max |y| 0.96);
    the bound is 2x that."""
    sizes = (6, 7)
    q, k = _pooled_qk(sizes)
    v = torch.randn(2, 3, *sizes, 4, dtype=f64)
    qb, kb, vb = [t.bfloat16() for t in q], [t.bfloat16() for t in k], v.bfloat16()
    ref = kronecker_attention([t.double() for t in qb], [t.double() for t in kb], vb.double())
    y = kronecker_attention(qb, kb, vb)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ref, rtol=0, atol=8e-3)


# --------------------------------------------------------------------------------------------- bad input
def test_bad_inputs_name_the_argument():
    v = torch.randn(2, 3, 4, 5, 6)
    good = [torch.rand(4, 4), torch.rand(5, 5)]
    with pytest.raises(ValueError, match=r"factors\[1\].*\(B, H, 5, 5\).*\(4, 4\)"):
        kron_apply([good[0], torch.rand(4, 4)], v)
    with pytest.raises(ValueError, match="has 2 modes.*3 factors"):
        kron_apply(good + [torch.rand(2, 2)], v)
    with pytest.raises(ValueError, match="`v` must have at least 4 dims"):
        kron_apply(good, torch.randn(2, 4, 5))
    with pytest.raises(TypeError, match="`v` must be a floating-point tensor"):
        kron_apply(good, torch.ones(2, 3, 4, 5, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        kron_apply([torch.rand(0, 0), good[1]], torch.randn(2, 3, 0, 5, 6))
    with pytest.raises(ValueError, match="do not broadcast"):
        kron_apply([torch.rand(3, 3, 4, 4), good[1]], v)
    with pytest.raises(TypeError, match="factors"):
        kron_apply(torch.rand(4, 4), v)
    q = [torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)]
    with pytest.raises(ValueError, match=r"`k\[1\]` must have shape \(B, H, 5, Dqk\)"):
        kronecker_attention(q, [q[0], torch.randn(2, 3, 6, 8)], v)
    with pytest.raises(ValueError, match="combine"):
        kronecker_attention(q, q, v, combine="outer")
    with pytest.raises(TypeError, match=r"masks\[0\].*bool"):
        kronecker_attention(q, q, v, masks=[torch.ones(4, 4), None])
    with pytest.raises(ValueError, match=r"masks\[1\].*\(\.\.\., 5, 5\)"):
        kronecker_attention(q, q, v, masks=[None, torch.ones(4, 4, dtype=torch.bool)])


def test_kron_apply_custom_backward_partial_grads_and_autocast():
    v = torch.randn(2, 2, 3, 4, 5, dtype=f64, requires_grad=True)
    fs = [torch.randn(2, 2, 3, 3, dtype=f64), torch.randn(1, 1, 4, 4, dtype=f64, requires_grad=True)]
    assert torch.autograd.gradcheck(lambda a, b: kron_apply([fs[0], a], b), (fs[1], v))
    assert torch.autograd.gradcheck(lambda b: kron_apply(fs, b), (v,))
    assert torch.autograd.gradcheck(lambda a, b: kron_sum_apply([fs[0], a], b), (fs[1], v))
    assert torch.autograd.gradcheck(lambda a: kron_sum_apply([a, fs[1]], v.detach()), (fs[0].clone().requires_grad_(),))
    # only an early (first / middle) factor needs a gradient, v does not
    f3 = [torch.randn(1, 2, n, n, dtype=f64) for n in (2, 3, 2)]
    v3 = torch.randn(1, 2, 2, 3, 2, 3, dtype=f64)
    for i in (0, 1):
        for apply in (kron_apply, kron_sum_apply):
            def fn(a, i=i, apply=apply):
                return apply([a if j == i else f for j, f in enumerate(f3)], v3)

            assert torch.autograd.gradcheck(fn, (f3[i].clone().requires_grad_(),)), (i, apply.__name__)
    x = torch.randn(2, 4, 5, 16, requires_grad=True)
    from hoformer.layers import KroneckerAttention

    for combine in ("product", "sum"):
        att = KroneckerAttention(16, 2, num_modes=2, combine=combine)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = att(x)
        assert y.dtype == torch.bfloat16
        y.float().sum().backward()
        assert torch.isfinite(x.grad).all() and att.to_qk[0].weight.grad is not None


# (batch, head) pairs per chunk with b=3, h=4: 1 pair / 3 heads (partial head groups) / all heads of 2 batch entries
# (a short last chunk) / everything in one chunk
@pytest.mark.parametrize("rotates", [False, True], ids=["in-place-layout", "rotating-layout"])
@pytest.mark.parametrize("pairs", [1, 3, 8, 1 << 20])
@pytest.mark.parametrize("sizes", [(3, 5), (2, 3, 4), (2, 7), (2, 3, 7), (2, 3, 2, 3)])  # 7 > 2 d: unfolded
def test_cache_blocked_chunks_match_dense_with_strided_values(monkeypatch, pairs, sizes, rotates):
    """The cache blocking (chunks of (batch, head) pairs) is invisible: values and all gradients equal the dense
    Kronecker product / sum for every chunk size, with a head-split (strided) value view and broadcast factors; the
    output keeps the value's memory layout, so merging the heads is a view. Both product kernels: the CPU's (in
    place of layout) and the accelerators' (rotating the layout), run here on the CPU."""
    import hoformer.functional.products as kr

    monkeypatch.setattr(kr, "_chunk_pairs", lambda v: pairs)
    monkeypatch.setattr(kr, "_rotates", lambda v: rotates)
    b, h, d = 3, 4, 2
    base = torch.randn(b, *sizes, h, d, dtype=f64, requires_grad=True)  # (b, n.., h, d) memory, like a projection
    v = base.movedim(-2, 1)
    fs = [torch.randn(b, h, sizes[0], sizes[0], dtype=f64, requires_grad=True)]
    fs += [torch.randn(1, h, n, n, dtype=f64, requires_grad=True) for n in sizes[1:]]  # broadcast over batch
    full = [f.expand(b, h, -1, -1) for f in fs]
    for fn, dense in ((kron_apply, kron_dense), (lambda f, x: kron_sum_apply(f, x), lambda f: kron_sum_dense(f, True))):
        y = fn(fs, v)
        assert y.movedim(1, -2).is_contiguous()  # same memory layout as the value view
        ref = _dense_apply(dense(full), v)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        w = torch.randn_like(y)
        got = torch.autograd.grad((y * w).sum(), [base, *fs])
        want = torch.autograd.grad((ref * w).sum(), [base, *fs])
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sizes", [(4,), (3, 5), (2, 3, 4)])
def test_rotating_kernel_gradients_of_only_the_value_or_only_the_factors(monkeypatch, sizes):
    """The accelerators' product kernel (run on the CPU here) when only ``v`` or only the factors need a gradient
    (its backward then skips the recomputation or the last product)."""
    import hoformer.functional.products as kr

    monkeypatch.setattr(kr, "_rotates", lambda v: True)
    b, h, d = 2, 3, 4
    v = torch.randn(b, *sizes, h, d, dtype=f64).movedim(-2, 1)
    fs = [torch.randn(b, h, n, n, dtype=f64) for n in sizes]
    ref = _dense_apply(kron_dense(fs), v)
    w = torch.randn_like(ref)
    vr = v.detach().requires_grad_()
    (gv,) = torch.autograd.grad((kron_apply(fs, vr) * w).sum(), [vr])
    (want,) = torch.autograd.grad((_dense_apply(kron_dense(fs), vr) * w).sum(), [vr])
    torch.testing.assert_close(gv, want, rtol=1e-10, atol=1e-12)
    fr = [f.requires_grad_() for f in fs]
    got = torch.autograd.grad((kron_apply(fr, v) * w).sum(), fr)
    want = torch.autograd.grad((_dense_apply(kron_dense(fr), v) * w).sum(), fr)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_kronecker_attention_rejects_arguments_it_would_ignore():
    q, k = _pooled_qk((3, 4))
    v = torch.randn(2, 3, 3, 4, 2, dtype=f64)
    with pytest.raises(ValueError, match="scale"):
        kronecker_attention(q, k, v, kernel="linear", scale=2.0)
    with pytest.raises(ValueError, match="dropout_p"):
        kronecker_attention(q, k, v, kernel="linear", dropout_p=0.5)
    with pytest.raises(ValueError, match="scale"):
        kronecker_attention(q, k, v, score_fn=tanimoto_scores, scale=2.0)
    for p in (-0.1, 1.0, 1.5, True, "0.1"):  # outside [0, 1) (or not a number): rejected, not silently clipped
        with pytest.raises(ValueError, match=r"`dropout_p` must be a float in \[0, 1\)"):
            kronecker_attention(q, k, v, dropout_p=p)
        with pytest.raises(ValueError, match=r"`dropout_p` must be a float in \[0, 1\)"):
            full_attention(*(torch.randn(1, 1, 2, 3, 4, dtype=f64) for _ in range(3)), dropout_p=p)


def test_mode_attention_factors_validates_its_inputs():
    q, k = _pooled_qk((3, 4))
    with pytest.raises(TypeError, match=r"masks\[0\].*bool"):
        mode_attention_factors(q, k, masks=[torch.ones(3, 3), None])
    with pytest.raises(ValueError, match="`k` has 1"):
        mode_attention_factors(q, k[:1])
    with pytest.raises(ValueError, match=r"masks\[1\]"):
        mode_attention_factors(q, k, masks=[None, torch.ones(3, 3, dtype=torch.bool)])


def test_masked_softmax_rule():
    from hoformer.functional import masked_softmax

    logits = torch.randn(2, 3, 4, dtype=f64)
    mask = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    a = masked_softmax(logits, mask)
    torch.testing.assert_close(a[:, 2], logits[:, 2].softmax(-1))  # fully allowed row: plain softmax
    assert (a[:, 1] == 0).all() and (a[:, 0, [1, 3]] == 0).all()  # no allowed key: zeros, masked keys: exact 0
    torch.testing.assert_close(a[:, 0, [0, 2]], logits[:, 0, [0, 2]].softmax(-1))
    assert torch.isfinite(masked_softmax(torch.full((2, 4), float("-inf")), mask[:2])).all()
    torch.testing.assert_close(masked_softmax(logits), logits.softmax(-1))
    for bad in (mask.float(), mask.long(), [[True] * 4] * 3):  # a 0/1 float mask is not True = attend: rejected
        with pytest.raises(TypeError, match=r"masked_softmax: `mask` must be a bool tensor.*got"):
            masked_softmax(logits, bad)


def _assert_compiled_matches_eager(fn, x):
    """``torch.compile(fn, backend="eager")`` (Dynamo only, no C++ toolchain) gives eager's output and input gradient."""
    import torch._dynamo as dynamo

    dynamo.reset()
    y = torch.compile(fn, backend="eager")(x)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    y0 = fn(x)
    (g0,) = torch.autograd.grad(y0.square().sum(), x)
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(g, g0)


def test_torch_compile_treats_the_kernels_as_opaque_calls():
    """Under torch.compile the hand-written kernels are one opaque custom op each (hoformer::kron_apply /
    kron_sum_apply): the softmax path of kronecker_attention is a single graph without breaks, and compiled (eager
    backend: Dynamo only, no C++ toolchain needed) forward + backward equal the eager ones."""
    import torch._dynamo as dynamo

    q, k = _pooled_qk((4, 5))
    v = torch.randn(2, 3, 4, 5, 2, dtype=f64, requires_grad=True)
    for combine in ("product", "sum"):
        def fn(v, combine=combine):
            return kronecker_attention(q, k, v, combine=combine)

        ex = dynamo.explain(fn)(v)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), (combine, ex.break_reasons)
        _assert_compiled_matches_eager(fn, v)


def test_torch_compile_traces_the_linear_kernel_whole():
    """The linear kernel is plain batched matmuls, so it is left to the compiler: a kronecker_linear layer (FAVOR+
    features, product and sum) is one graph without breaks (with the kernel opaque: 3 graphs), and compiled (eager
    backend) forward + backward equal the eager ones."""
    import torch._dynamo as dynamo

    from hoformer.layers import KroneckerAttention

    x = torch.randn(2, 4, 5, 16, dtype=f64, requires_grad=True)
    for combine in ("product", "sum"):
        att = KroneckerAttention(16, 2, combine=combine, kernel="linear", num_modes=2).double()
        dynamo.reset()
        ex = dynamo.explain(att)(x)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), (combine, ex.break_reasons)
        _assert_compiled_matches_eager(att, x)
    dynamo.reset()


def test_full_attention_scale_keyword():
    from hoformer.functional import full_attention

    q, k, v = (torch.randn(1, 2, 3, 4, 5, dtype=torch.float64) for _ in range(3))
    a = torch.softmax(q.reshape(1, 2, 12, 5) @ k.reshape(1, 2, 12, 5).transpose(-1, -2) * 0.3, -1)
    torch.testing.assert_close(full_attention(q, k, v, scale=0.3), (a @ v.reshape(1, 2, 12, 5)).view_as(v))


def test_kronecker_attention_names_mismatched_batch_dtype_and_masks():
    """Mismatches that used to surface as raw torch errors (or blamed kron_apply's `factors[0]`, which the caller
    never passed) name the argument; broadcastable size-1 batch / head dims stay allowed; a feature map with negative
    values (NaN through the row normaliser) is refused."""
    v = torch.randn(2, 2, 3, 4, 5)
    q = [torch.randn(2, 2, 3, 5), torch.randn(2, 2, 4, 5)]
    k = [torch.randn(2, 2, 3, 5), torch.randn(2, 2, 4, 5)]
    lead = r"must have leading dims broadcastable to \(B, H\) = \(2, 2\)"
    with pytest.raises(ValueError, match=rf"`q\[0\]` {lead}"):
        kronecker_attention([torch.randn(3, 2, 3, 5), q[1]], k, v)
    for m in (torch.ones(5, 2, 3, 3, dtype=torch.bool), torch.ones(1, 2, 2, 3, 3, dtype=torch.bool)):
        with pytest.raises(ValueError, match=rf"`masks\[0\]` {lead}"):
            kronecker_attention(q, k, v, masks=[m, None])
    with pytest.raises(TypeError, match=r"`q\[0\]` \(torch.float32\) and `k\[0\]` \(torch.float64\) must share"):
        kronecker_attention(q, [k[0].double(), k[1]], v)
    y = kronecker_attention([q[0][:1], q[1][:, :1]], k, v, masks=[torch.ones(1, 2, 3, 3, dtype=torch.bool), None])
    assert y.shape == v.shape and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="`feature_map` must return non-negative features, got a minimum of -"):
        kronecker_attention(q, k, v, kernel="linear", feature_map=lambda x: x)
    assert torch.isfinite(kronecker_attention(q, k, v, kernel="linear", feature_map=torch.exp)).all()


def test_linear_factor_is_the_applied_operator_also_on_rows_without_mass():
    """The explicit linear-kernel factor (recorded maps, analysis) floors the row sums like the operator attention
    applies: a query whose features are all 0 gets a zero row in both (the recorded map used to be NaN there)."""
    from hoformer.functional.kronecker import linear_factor

    fq, fk = torch.rand(2, 1, 3, 4, dtype=torch.float64), torch.rand(2, 1, 3, 4, dtype=torch.float64)
    fq[:, :, 1] = 0
    v = torch.randn(2, 1, 3, 5, dtype=torch.float64)
    y = kronecker_attention([fq], [fk], v, kernel="linear", feature_map=lambda t: t)
    s = linear_factor(fq, fk)
    assert torch.isfinite(s).all() and (s[:, :, 1] == 0).all()
    torch.testing.assert_close(y, s @ v)


def test_full_attention_zeroes_fully_masked_rows_whatever_sdpa_gives(monkeypatch):
    """hoformer's masking rule does not rely on the SDPA kernel: kernels that give NaN on a row whose mask allows no
    key (older torch, some GPU backends; this CPU build gives 0) still give zeros through ``sdpa`` /
    ``full_attention``."""
    import torch.nn.functional as F

    import hoformer.functional.dense as dense
    from hoformer.functional import full_attention

    real = F.scaled_dot_product_attention

    def nan_rows(q, k, v, attn_mask=None, **kw):
        y = real(q, k, v, attn_mask=attn_mask, **kw)
        return y if attn_mask is None else y.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(dense.F, "scaled_dot_product_attention", nan_rows)
    q, k, v = (torch.randn(2, 2, 3, 2, 4, dtype=f64) for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[3] = False
    y = full_attention(q, k, v, mask=mask)
    assert torch.isfinite(y).all()
    assert (y.reshape(2, 2, 6, 4)[:, :, 3] == 0).all()
    y2 = dense.sdpa(q.reshape(2, 2, 6, 4), k.reshape(2, 2, 6, 4), v.reshape(2, 2, 6, 4), mask=mask)
    torch.testing.assert_close(y2, y.reshape(2, 2, 6, 4))


def test_kron_apply_refuses_non_square_factors():
    """Every factor must be square (n_m x n_m): a factor with the right last dim but the wrong number of rows is named
    in a ValueError (product and sum), not a shape error deep in the kernel or a silently reshaped result."""
    v = torch.randn(1, 2, 4, 5, 3, dtype=f64)
    good = torch.softmax(torch.randn(1, 2, 5, 5, dtype=f64), -1)
    for bad in (torch.rand(1, 2, 3, 4, dtype=f64), torch.rand(1, 2, 6, 4, dtype=f64)):
        for fn in (kron_apply, kron_sum_apply):
            with pytest.raises(ValueError, match=r"`factors\[0\]` must have shape \(B, H, 4, 4\)"):
                fn([bad, good], v)


def _naive_sdpa(q, k, v, mask=None):
    """softmax(q k^T / sqrt(E)) v over the last two dims, a row whose mask allows no key giving zeros."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, -1)
    return (a.nan_to_num(0.0) if mask is not None else a) @ v


@pytest.mark.parametrize("mask_shape", [None, (4, 4), (2, 1, 1, 4, 4), (1, 3, 5, 4, 4), (3, 1, 4, 4)])
def test_sdpa_with_more_than_two_batch_dims_matches_naive_attention(mask_shape):
    """``sdpa`` on 5-D inputs (two heads-like batch dims, as the axial layers give: permuted, non-contiguous) with
    masks broadcast over any of them, a fully masked row and ``Lk != Lq``, against the naive float64 formula."""
    from hoformer.functional.dense import sdpa

    q = torch.randn(2, 3, 4, 5, 6, dtype=f64).movedim(2, -2)  # (2, 3, 5, 4, 6)
    k, v = (torch.randn(2, 3, 4, 5, 6, dtype=f64).movedim(2, -2) for _ in range(2))
    mask = None
    if mask_shape is not None:
        mask = torch.rand(mask_shape) > 0.3
        mask[..., 1, :] = False  # row 1: no key allowed
        mask[..., 2, 0] = True  # row 2: never empty
    torch.testing.assert_close(sdpa(q, k, v, mask=mask), _naive_sdpa(q, k, v, mask))
    k2, v2 = k[..., :3, :], v[..., :3, :]  # fewer keys than queries (a decoding cache)
    m2 = None if mask is None else mask[..., :3]
    torch.testing.assert_close(sdpa(q, k2, v2, mask=m2), _naive_sdpa(q, k2, v2, m2))


@pytest.mark.slow  # two Inductor (C++) compiles
def test_sdpa_on_permuted_5d_inputs_compiles_to_the_eager_result():
    """Inductor's attention-fusion patterns (torch 2.13) would rewrite an SDPA on permuted 5-D inputs (axial
    attention along a mode of ``(B, H, N1, N2, E)``) as the 4-D ``transpose(1, 2)`` one, attending along the wrong
    mode with a wrong output shape (with a mask: a graph that fails to compile); through ``sdpa`` the compiled result
    is eager's."""
    from hoformer.functional.dense import sdpa

    def along_first_mode(q, k, v, mask):
        q, k, v = (t.movedim(2, -2) for t in (q, k, v))  # (b, h, n2, n1, e): attend along n1
        return sdpa(q, k, v, mask=mask)

    q, k, v = (torch.randn(2, 2, 4, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 1, 4, 4) > 0.3
    for m in (None, mask):
        torch._dynamo.reset()
        got = torch.compile(along_first_mode, backend="inductor", fullgraph=True)(q, k, v, m)
        torch.testing.assert_close(got, along_first_mode(q, k, v, m), rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
