"""Weaver (paper 003): valence kernels, P^2-KMV, phase dictionary, ATk-pooling, the model and its baselines."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from hoformer.functional import kron_apply, kron_dense, tanimoto_scores
from hoformer.functional.weaver import (
    atk_pool,
    cyclic_time_encoding,
    dictionary_retrieval,
    p2_kmv,
    pooling_informativeness,
    valence_attention,
)
from hoformer.layers import AxialAttention, Block, FullAttention, KroneckerAttention, record_attention
from hoformer.layers.weaver import (
    ATkPooling,
    KroneckerValenceAttention,
    StateTransition,
    TrafficEmbedding,
    TrafficPhaseDictionary,
    WeaverInput,
)
from hoformer.models import create_model
from hoformer.models.weaver import TrafficTransformer

D64 = torch.float64


# ------------------------------------------------------------------------------------------- valence kernels
def test_tanimoto_range_and_stationary_points():
    q, k = torch.randn(3, 40, 8, dtype=D64), torch.randn(3, 30, 8, dtype=D64)
    s = tanimoto_scores(q, k)
    assert s.shape == (3, 40, 30)
    assert s.min() >= -1 / 3 - 1e-9 and s.max() <= 1 + 1e-9
    for b, i, j in ((0, 0, 0), (1, 17, 29), (2, 39, 3)):  # eq 29 entry by entry
        qi, kj = q[b, i], k[b, j]
        dot = float(qi @ kj)
        assert abs(float(s[b, i, j]) - dot / (float(qi @ qi) + float(kj @ kj) - dot + 1e-6)) < 1e-12
    # q = k -> 1 (maximum), q = -k -> -1/3 (minimum); both are stationary points (zero gradient in q)
    for sign, value in ((1.0, 1.0), (-1.0, -1 / 3)):
        kk = torch.randn(5, 6, dtype=D64)
        qq = (sign * kk).clone().requires_grad_(True)
        t = tanimoto_scores(qq.unsqueeze(-2), kk.unsqueeze(-2), eps=0.0).squeeze()
        torch.testing.assert_close(t, torch.full_like(t, value))
        (g,) = torch.autograd.grad(t.sum(), qq)
        assert g.abs().max() < 1e-12


def test_valence_kernels():
    q, k = torch.randn(2, 3, 7, 4, dtype=D64), torch.randn(2, 3, 5, 4, dtype=D64)
    cos = valence_attention(q, k, "cosine")
    ref = torch.einsum("...nd,...md->...nm", q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(cos, ref, atol=1e-6, rtol=1e-6)
    sdpa = valence_attention(q, k, "sdpa")
    torch.testing.assert_close(sdpa, (q @ k.transpose(-1, -2) / 2.0).softmax(-1))
    assert (valence_attention(q, k, "tanimoto") < 0).any()  # signed: can subtract messages
    with pytest.raises(ValueError, match="kernel"):
        valence_attention(q, k, "relu")
    torch.testing.assert_close(valence_attention(q, k, "sdpa", scale=0.3), (q @ k.transpose(-1, -2) * 0.3).softmax(-1))
    for kernel in ("tanimoto", "cosine"):  # a signed map has no logit scale: an error, as in kronecker_attention
        with pytest.raises(ValueError, match=r"`scale` applies to kernel='sdpa' only.*scale=2.0"):
            valence_attention(q, k, kernel, scale=2.0)


# ------------------------------------------------------------------------------------------------ P^2-KMV
def _dense_apply(factors, v):
    b, h, *sizes, d = v.shape
    big = kron_dense(factors)  # (b, h, prod, prod)
    return (big @ v.reshape(b, h, -1, d)).reshape(v.shape)


def test_p2_kmv_matches_dense_kronecker_two_modes():
    tt, ts = torch.randn(2, 3, 4, 4, dtype=D64), torch.randn(2, 3, 5, 5, dtype=D64)
    u = torch.randn(2, 3, 4, 5, 6, dtype=D64)
    out = p2_kmv(tt, ts, u)
    torch.testing.assert_close(out, _dense_apply([tt, ts], u))
    # explicit loop form of eqs 55-57: z[i, r] = sum_{j, s} T[i, j] S[r, s] u[j, s]
    z = torch.zeros_like(u)
    for i in range(4):
        for r in range(5):
            for j in range(4):
                for s in range(5):
                    z[:, :, i, r] += (tt[:, :, i, j] * ts[:, :, r, s]).unsqueeze(-1) * u[:, :, j, s]
    torch.testing.assert_close(out, z)


def test_p_delta_kmv_three_modes_and_gradcheck():
    fs = [torch.randn(1, 2, n, n, dtype=D64) for n in (3, 4, 2)]
    u = torch.randn(2, 2, 3, 4, 2, 3, dtype=D64)
    torch.testing.assert_close(kron_apply(fs, u), _dense_apply([f.expand(2, -1, -1, -1) for f in fs], u))
    tt = torch.randn(1, 1, 3, 3, dtype=D64, requires_grad=True)
    ts = torch.randn(1, 1, 4, 4, dtype=D64, requires_grad=True)
    v = torch.randn(1, 1, 3, 4, 2, dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(p2_kmv, (tt, ts, v))


# ----------------------------------------------------------------------------------------- phase dictionary
def test_dictionary_weights_on_simplex_and_sparse():
    logits = torch.randn(4, 30, 16) * 3
    tau = torch.randn(30, 1)
    dictionary = torch.randn(16, 12)
    w, cof = dictionary_retrieval(logits, tau, dictionary)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 30))
    assert (w == 0).float().mean() > 0.3  # entmax-1.5 is sparse, unlike softmax
    torch.testing.assert_close(cof, w @ dictionary)
    # lower temperature -> sparser
    w_cold, _ = dictionary_retrieval(logits, torch.full((30, 1), -3.0), dictionary)
    w_hot, _ = dictionary_retrieval(logits, torch.full((30, 1), 3.0), dictionary)
    assert (w_cold == 0).sum() > (w_hot == 0).sum()
    with pytest.raises(ValueError, match="landmarks"):
        dictionary_retrieval(logits, tau, torch.randn(8, 12))
    # a (m,) temperature would broadcast over the landmarks, not the nodes, when n == m: only (n, 1) is accepted
    square = torch.randn(4, 16, 16)
    for bad in (torch.randn(16), torch.randn(1, 16), torch.randn(16, 16), torch.randn(8, 1), 1.0):
        with pytest.raises(ValueError, match=r"`temperature` must have shape \(n, 1\) = \(16, 1\)"):
            dictionary_retrieval(square, bad, dictionary)
    w64, cof64 = dictionary_retrieval(logits.double(), tau.double(), dictionary.double())
    assert w64.dtype == cof64.dtype == D64  # float64 stays float64 (only half precision is upcast)


def test_entmax15_custom_op_backward_by_finite_differences():
    """The hand-registered backward of ``hoformer::entmax15`` (what compiled and exported Weaver models use), float64,
    on logits whose support is away from its boundary (entmax-1.5 is not differentiable where an entry enters it)."""
    torch.manual_seed(0)
    z = torch.randn(3, 7, dtype=D64) * 3
    w = torch.ops.hoformer.entmax15(z, -1)
    assert ((w > 0) & (w < 1e-3)).sum() == 0 and (w == 0).any()  # sparse, no entry at the support's edge
    torch.testing.assert_close(w, _entmax15_ref(z), rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: torch.ops.hoformer.entmax15(t, -1), [z.requires_grad_(True)])


def _entmax15_ref(z: torch.Tensor) -> torch.Tensor:
    """Eq 34 by bisection on the threshold: ``p_i = ReLU(z_i / 2 - gamma)^2`` with ``sum_i p_i = 1`` (float64)."""
    half = z / 2
    hi = half.amax(-1, keepdim=True)  # sum(p) = 0 at gamma = max
    lo = hi - 1.0  # the largest entry alone gives sum(p) >= 1
    for _ in range(200):
        mid = (lo + hi) / 2
        big = (half - mid).clamp_min(0).pow(2).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
    return (half - (lo + hi) / 2).clamp_min(0).pow(2)


def _glu_ref(x, lin):
    a = torch.einsum("...i,oi->...o", x, lin.weight) + lin.bias
    sig, gate = a.chunk(2, dim=-1)
    return sig / (1 + torch.exp(-gate))


def _dictionary_ref(mod: TrafficPhaseDictionary, x: torch.Tensor):
    """Eqs 35-38 with explicit loops over the layouts; returns ``(xi (b, p, n, k), weights (b, n, m))``."""
    b, p, n, c = x.shape
    kw = mod.width
    states = torch.zeros(b, n, p * c, dtype=x.dtype)
    for i, j, r in itertools.product(range(b), range(p), range(n)):
        states[i, r, j * c:(j + 1) * c] = x[i, j, r]  # eq 35: node r's history, step-major
    tau = torch.log1p(torch.exp(mod.temperature))  # softplus, (n, 1)
    w = _entmax15_ref(_glu_ref(states, mod.query.proj) / tau)  # eq 36
    cof = torch.einsum("bnm,mf->bnf", w, mod.dictionary)  # eq 37, (b, n, p*k)
    xi = torch.zeros(b, p, n, kw, dtype=x.dtype)
    for i, j, r in itertools.product(range(b), range(p), range(n)):
        xi[i, j, r] = cof[i, r, j * kw:(j + 1) * kw]  # eq 38: step j's cofactors of node r
    return xi, w


def _randomize(mod: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter ~ N(0, 1) (zero-initialised or all-ones ones would hide a missing term)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in mod.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g, dtype=prm.dtype))


def test_phase_dictionary_matches_eqs_35_38():
    mod = TrafficPhaseDictionary(num_nodes=5, window=4, in_channels=2, num_landmarks=7, width=3, dropout=0.5)
    mod = mod.double().eval()
    _randomize(mod)
    x = torch.randn(2, 4, 5, 2, dtype=D64)
    xi, w = mod(x, return_weights=True)
    ref_xi, ref_w = _dictionary_ref(mod, x)
    assert (ref_w == 0).any() and ((ref_w > 0).sum(-1) > 1).any()  # sparse, yet rows that mix several landmarks
    torch.testing.assert_close(w, ref_w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(xi, ref_xi, rtol=1e-9, atol=1e-12)


def test_weaver_input_matches_eqs_35_41():
    for use_dictionary in (True, False):
        mod = WeaverInput(num_nodes=5, window=4, in_channels=2, dim=6, num_landmarks=7, width=3, dropout=0.5,
                          use_dictionary=use_dictionary).double().eval()
        _randomize(mod, seed=1)
        x = torch.randn(2, 4, 5, 2, dtype=D64)
        aug = torch.cat([x, _dictionary_ref(mod.dictionary, x)[0]], dim=-1) if use_dictionary else x  # X || Xi
        u = torch.einsum("bpni,ei->bpne", aug, mod.proj.weight) + mod.proj.bias  # eq 39
        eps = mod.norm.eps if mod.norm.eps is not None else torch.finfo(D64).eps
        normed = u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + eps) * mod.norm.weight  # RMSNorm
        ref = _glu_ref(normed, mod.glu.proj) + u  # eq 40: GLU(RMSNorm(u)) + residual
        torch.testing.assert_close(mod(x), ref, rtol=1e-9, atol=1e-12)
    # float32: the library RMSNorm with nn.RMSNorm's float32 eps gives nn.RMSNorm's numbers (the published runs
    # used nn.RMSNorm); bf16 inputs are normalised in float32 (no bf16 eps, no unfused mixed-dtype kernel)
    mod = WeaverInput(num_nodes=5, window=4, in_channels=2, dim=6).eval()
    ref_norm = torch.nn.RMSNorm(6)
    with torch.no_grad():
        ref_norm.weight.copy_(torch.randn(6))
        mod.norm.weight.copy_(ref_norm.weight)
    u = torch.randn(3, 6) * torch.tensor([[1.0], [1e-4], [1e3]])
    torch.testing.assert_close(mod.norm(u), ref_norm(u), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(mod.norm(u.bfloat16()).float(), ref_norm(u), rtol=2e-2, atol=2e-2)


def test_state_transition_matches_eqs_59_60():
    for window, horizon in ((6, 4), (5, 5)):  # with and without the learned P -> Q map over time
        mod = StateTransition(dim=8, out_channels=2, window=window, horizon=horizon, expansion=3, dropout=0.5)
        mod = mod.double().eval()
        z = torch.randn(2, window, 3, 8, dtype=D64)
        hid = torch.einsum("bpne,fe->bpnf", z, mod.up.weight) + mod.up.bias
        assert (hid < 0).float().mean() > 0.2  # the negative slope of LeakyReLU is exercised
        act = torch.where(hid > 0, hid, 0.01 * hid)  # LeakyReLU, slope 0.01
        z1 = torch.einsum("bpnf,ef->bpne", act, mod.down.weight) + mod.down.bias + z  # eq 59 (residual)
        y = torch.einsum("bpne,ce->bpnc", z1, mod.readout.weight) + mod.readout.bias  # eq 60
        if window != horizon:
            y = torch.einsum("bpnc,qp->bqnc", y, mod.time_map.weight) + mod.time_map.bias.view(1, -1, 1, 1)
        out = mod(z)
        assert out.shape == (2, horizon, 3, 2)
        torch.testing.assert_close(out, y, rtol=1e-12, atol=1e-12)


def test_traffic_embedding_matches_reference():
    mod = TrafficEmbedding(num_nodes=5, window=4, in_channels=2, dim=6).double()
    _randomize(mod, seed=2)
    x = torch.randn(2, 4, 5, 2, dtype=D64)
    time = torch.tensor([[[1435.0 - 5 * j, 6.0], [15.0 * j, 0.0]][i] for i in range(2) for j in range(4)],
                        dtype=D64).view(2, 4, 2)
    ref = torch.zeros(2, 4, 5, 6, dtype=D64)
    ref_t = torch.zeros(2, 4, 5, 6, dtype=D64)
    for i, j, r in itertools.product(range(2), range(4), range(5)):
        ref[i, j, r] = mod.proj.weight @ x[i, j, r] + mod.proj.bias + mod.node[r] + mod.step[j, 0]
        tod, dow = 2 * math.pi * time[i, j, 0] / 1440, 2 * math.pi * time[i, j, 1] / 7  # eqs 53-54
        enc = torch.stack([tod.sin(), tod.cos(), dow.sin(), dow.cos()])
        ref_t[i, j, r] = ref[i, j, r] + mod.time.weight @ enc + mod.time.bias
    torch.testing.assert_close(mod(x), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mod(x, time), ref_t, rtol=1e-12, atol=1e-12)


def test_phase_dictionary_module():
    mod = TrafficPhaseDictionary(num_nodes=9, window=6, in_channels=2, num_landmarks=10, width=3, dropout=0.0)
    xi, w = mod(torch.randn(2, 6, 9, 2), return_weights=True)
    assert xi.shape == (2, 6, 9, 3) and w.shape == (2, 9, 10)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 9))


# --------------------------------------------------------------------------------------------- ATk-pooling
def _atk_reference(u, w, ratio, dim):
    """Explicit per-sample / per-scorer loops (eqs 42-46)."""
    b, p, n, e = u.shape
    wn = w / w.norm(dim=0, keepdim=True)
    outs, chosen = [], []
    for i in range(b):
        pims = []
        for g in range(w.shape[1]):
            sc = u[i] @ wn[:, g]  # (p, n)
            pims.append(sc.var(dim=dim - 1, unbiased=False).sum())
        gbest = int(torch.stack(pims).argmax())
        chosen.append(gbest)
        sc = u[i] @ wn[:, gbest]
        size = u.shape[dim]
        k = math.ceil(Fraction(str(ratio)) * size)  # exact decimal ratio, no float noise
        if dim == 1:
            out = torch.stack([
                (sc[sc[:, c].topk(k).indices, c].softmax(0)[:, None] * u[i, sc[:, c].topk(k).indices, c]).sum(0)
                for c in range(n)])
        else:
            out = torch.stack([
                (sc[r, sc[r].topk(k).indices].softmax(0)[:, None] * u[i, r, sc[r].topk(k).indices]).sum(0)
                for r in range(p)])
        outs.append(out)
    return torch.stack(outs), torch.tensor(chosen)


@pytest.mark.parametrize("dim, ratio, shape", [(1, 0.6, (3, 6, 5, 4)), (2, 0.6, (3, 6, 5, 4)),
                                               (2, 0.55, (2, 3, 100, 4)), (1, 0.55, (2, 100, 3, 4))])
def test_atk_pool_matches_reference(dim, ratio, shape):
    # 0.55 * 100 is 55.00000000000001 in floating point: k must still be ceil(rho * P) = 55
    u, w = torch.randn(*shape, dtype=D64), torch.randn(4, 5, dtype=D64)
    out, idx = atk_pool(u, w, ratio, dim, return_index=True)
    ref, ref_idx = _atk_reference(u, w, ratio, dim)
    assert out.shape == shape[:dim] + shape[dim + 1:]
    torch.testing.assert_close(out, ref)
    assert torch.equal(idx, ref_idx)


def test_atk_selects_scorer_with_highest_pim():
    # feature 2 varies strongly over time, the others barely: the scorer aligned with feature 2 has the highest PIM
    u = torch.randn(2, 12, 7, 4) * 0.01
    u[..., 2] += torch.linspace(-3, 3, 12).view(1, 12, 1)
    w = torch.eye(4)[:, [0, 1, 3, 2, 0]] + 0.01
    pim = pooling_informativeness(torch.matmul(u, w / w.norm(dim=0)), dim=1)
    assert (pim.argmax(-1) == 3).all()
    _, idx = atk_pool(u, w, 0.5, 1, return_index=True)
    assert (idx == 3).all()
    # top-k over time picks the latest (largest) steps of feature 2
    out = atk_pool(u, w, 1 / 12, 1)  # k = 1
    torch.testing.assert_close(out[..., 2], u[:, -1, :, 2])
    with pytest.raises(ValueError, match="ratio"):
        atk_pool(u, w, 0.0, 1)


def test_cyclic_time_encoding():
    enc = cyclic_time_encoding(torch.tensor([[360.0, 0.0], [0.0, 3.5]]))
    torch.testing.assert_close(enc, torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, -1.0]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="time"):
        cyclic_time_encoding(torch.zeros(3, 4))


@pytest.mark.parametrize("bad, msg", [
    ([5000.0, 2.0], r"`time\[\.\.\., 0\]` \(minute of day\) must lie in \[0, 1440\).*5000"),
    ([1440.0, 2.0], r"minute of day\) must lie in \[0, 1440\)"),
    ([-5.0, 2.0], r"minute of day\) must lie in \[0, 1440\)"),
    ([float("nan"), 2.0], r"minute of day\) must lie in \[0, 1440\).*nan"),
    ([300.0, 7.0], r"`time\[\.\.\., 1\]` \(day of week\) must lie in \[0, 7\)"),
    ([300.0, float("inf")], r"day of week\) must lie in \[0, 7\)"),
    (None, r"looks like a fraction of the day"),  # [0.5, 0.503, ..]: fraction of day, all steps ~ midnight
])
def test_time_features_out_of_range_are_rejected(bad, msg):
    """A wrong time column (minute 5000, a fraction of the day, NaN, weekday 7) would give a wrong but finite
    encoding: every consumer rejects it, also under torch.no_grad and for models that ignore `time`."""
    time = torch.stack([torch.arange(12) * 5.0 + 480, torch.full((12,), 2.0)], -1).expand(2, 12, 2).clone()
    if bad is None:
        time[..., 0] = time[..., 0] / 1440
    else:
        time[1, 7] = torch.tensor(bad)
    with torch.no_grad():
        with pytest.raises(ValueError, match="cyclic_time_encoding: .*" + msg):
            cyclic_time_encoding(time)
        with pytest.raises(ValueError, match="cyclic_time_encoding: .*" + msg):
            TrafficEmbedding(num_nodes=3, window=12, in_channels=1, dim=4)(torch.randn(2, 12, 3, 1), time)
        with pytest.raises(ValueError, match="cyclic_time_encoding: .*" + msg):
            KroneckerValenceAttention(3, 8, num_heads=2)(torch.randn(2, 12, 3, 8), time)
        for name, kw in (("weaver", {"dim": 8, "num_heads": 2}), ("weaver", {"dim": 8, "num_heads": 2,
                                                                             "use_time": False}),
                         ("last_value", {}), ("traffic_alternating", {"dim": 8, "num_heads": 2})):
            model = create_model(name, num_nodes=3, **kw).eval()
            with pytest.raises(ValueError, match=f"{type(model).__name__}: .*" + msg):
                model(torch.randn(2, 12, 3, 1), time=time)
    cyclic_time_encoding(torch.tensor([[0.0, 0.0], [1439.0, 6.0], [0.0, 6.999]]))  # the edges are fine


@pytest.mark.parametrize("name", ["weaver", "traffic_alternating", "traffic_hot", "last_value"])
def test_model_forward_checks_time_once(monkeypatch, name):
    """The value check of `time` costs a host sync: a model forward runs it exactly once (in the model's input
    validation), not again in every layer that encodes `time`; layers called directly still check it."""
    import hoformer.functional.weaver as fw
    import hoformer.models.weaver as mw

    calls = []
    real = fw.check_time_features

    def spy(time, fn="cyclic_time_encoding"):
        calls.append(fn)
        return real(time, fn)

    monkeypatch.setattr(fw, "check_time_features", spy)
    monkeypatch.setattr(mw, "check_time_features", spy)
    kw = {} if name == "last_value" else {"dim": 8, "num_heads": 2}
    model = create_model(name, num_nodes=3, **kw)
    (x,), extra = model.example_inputs()
    model(x, **extra).sum()
    assert calls == [type(model).__name__]
    calls.clear()
    TrafficEmbedding(num_nodes=3, window=12, in_channels=1, dim=4)(x, extra["time"])
    KroneckerValenceAttention(3, 8, num_heads=2)(torch.randn(2, 12, 3, 8), extra["time"])
    assert calls == ["cyclic_time_encoding"] * 2


def test_layers_reject_wrong_sizes_with_clear_errors():
    """Layers called directly with a wrong P / N / C / E name the argument and the expected sizes (instead of a raw
    matmul / cat / broadcast error); bad pooling ratios fail at construction, not at the first forward."""
    x = torch.randn(2, 6, 5, 2)
    cases = [
        (TrafficPhaseDictionary(num_nodes=5, window=6, in_channels=2, num_landmarks=4, width=3), (), "x",
         r"\(B, P=6, N=5, C=2\)"),
        (WeaverInput(num_nodes=5, window=6, in_channels=2, dim=8, num_landmarks=4, width=3), (), "x",
         r"\(B, P=6, N=5, C=2\)"),
        (WeaverInput(num_nodes=5, window=6, in_channels=2, dim=8, use_dictionary=False), (), "x",
         r"\(B, P=6, N=5, C=2\)"),
        (TrafficEmbedding(num_nodes=5, window=6, in_channels=2, dim=8), (), "x", r"\(B, P=6, N=5, C=2\)"),
    ]
    for mod, extra, name, shape in cases:
        mod(x, *extra)  # the right sizes work
        for bad in (torch.randn(2, 7, 5, 2), torch.randn(2, 6, 4, 2), torch.randn(2, 6, 5, 1), torch.randn(6, 5, 2)):
            with pytest.raises(ValueError, match=rf"{type(mod).__name__}: `{name}` must have shape {shape}.*got"):
                mod(bad)
    kva = KroneckerValenceAttention(num_nodes=5, dim=8, num_heads=2, kern_dim=3, kern_layers=1)
    kva(torch.randn(2, 6, 5, 8))
    for bad in (torch.randn(2, 6, 4, 8), torch.randn(2, 6, 5, 6), torch.randn(6, 5, 8)):
        with pytest.raises(ValueError, match=r"KroneckerValenceAttention: `u` must have shape \(B, P, N=5, E=8\)"):
            kva(bad)
    with pytest.raises(ValueError, match=r"KroneckerValenceAttention: `time` must have shape \(B, P, 2\) = "
                                         r"\(2, 6, 2\)"):
        kva(torch.randn(2, 6, 5, 8), torch.zeros(2, 7, 2))
    with pytest.raises(ValueError, match=r"TrafficEmbedding: `time` must have shape \(B, P, 2\)"):
        TrafficEmbedding(num_nodes=5, window=6, in_channels=2, dim=8)(x, torch.zeros(2, 6, 3))
    for window, horizon in ((6, 4), (6, 6)):  # P == Q has no time map: P is still checked
        st = StateTransition(dim=8, out_channels=1, window=window, horizon=horizon)
        st(torch.randn(2, 6, 5, 8))
        for bad in (torch.randn(2, 7, 5, 8), torch.randn(2, 6, 5, 4)):
            with pytest.raises(ValueError, match=r"StateTransition: `z` must have shape \(B, P=6, N, E=8\)"):
                st(bad)
    with pytest.raises(TypeError, match=r"TrafficEmbedding: `x` must be a floating-point tensor"):
        TrafficEmbedding(num_nodes=5, window=6, in_channels=2, dim=8)(x.long())
    for ratio in (0, 0.0, -0.5, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match=r"ATkPooling: `ratio` .* in \(0, 1\]"):
            ATkPooling(8, ratio=ratio)
        with pytest.raises(ValueError, match=r"KroneckerValenceAttention: `ratio_space` must be a number in \(0, 1\]"):
            KroneckerValenceAttention(num_nodes=5, dim=8, ratio_space=ratio)
        with pytest.raises(ValueError, match=r"KroneckerValenceAttention: `ratio_time` must be a number in \(0, 1\]"):
            KroneckerValenceAttention(num_nodes=5, dim=8, ratio_time=ratio)
    ATkPooling(8, ratio=1)  # ints in range are fine


# ---------------------------------------------------------------------------------------------- layer / model
def test_kronecker_valence_attention_equals_dense_spatiotemporal_map():
    torch.manual_seed(1)
    layer = KroneckerValenceAttention(num_nodes=5, dim=8, num_heads=2, kern_dim=3, kern_layers=2).double()
    torch.nn.init.normal_(layer.mix.proj.weight)  # the signal half starts at zero (identity block): make it count
    u = torch.randn(2, 4, 5, 8, dtype=D64)
    time = torch.tensor([[[i * 5.0, 1.0] for i in range(4)]] * 2, dtype=D64)
    with record_attention(layer) as rec:
        out = layer(u, time)
    (_, (tt, ts)), = rec
    assert tt.shape == (2, 2, 4, 4) and ts.shape == (2, 2, 5, 5)
    big = kron_dense([tt, ts])  # (b, h, PN, PN) = Theta_T (x) Theta_S
    v = u.view(2, 4 * 5, 2, 4).transpose(1, 2)  # (b, h, PN, d)
    z = (big @ v).transpose(1, 2).reshape(2, 4, 5, 8)
    torch.testing.assert_close(out, layer.mix(z) + u)
    # and the maps themselves (eqs 42-54), rebuilt from the explicit ATk loops, the explicit Tanimoto formula
    # (eq 47) and an explicit head split (eq 49), with and without the time encoding
    tod_dow = time / torch.tensor([1440.0, 7.0], dtype=D64) * 2 * math.pi
    with torch.no_grad():
        for t in (time, None):
            g_s = layer.struct(torch.cat([_atk_reference(u, layer.pool_s.scorers, 0.6, 1)[0],
                                          layer.b_kern.expand(2, -1, -1)], -1))  # eq 51
            enc = (torch.stack([tod_dow[..., 0].sin(), tod_dow[..., 0].cos(), tod_dow[..., 1].sin(),
                                tod_dow[..., 1].cos()], -1) if t is not None else torch.zeros(2, 4, 4, dtype=D64))
            g_t = layer.time_proj(torch.cat([_atk_reference(u, layer.pool_t.scorers, 0.6, 2)[0], enc], -1))  # eq 52
            with record_attention(layer) as rec:
                layer(u, t)
            (_, (tt, ts)), = rec
            for theta, g, proj in ((ts, g_s, layer.qk_s), (tt, g_t, layer.qk_t)):
                q, k = (g @ proj.weight.T).split(8, -1)
                for b, h in itertools.product(range(2), range(2)):
                    qh, kh = q[b, :, 4 * h:4 * h + 4], k[b, :, 4 * h:4 * h + 4]
                    for i, j in itertools.product(range(qh.shape[0]), repeat=2):
                        dot = float(qh[i] @ kh[j])
                        ref = dot / (float(qh[i] @ qh[i]) + float(kh[j] @ kh[j]) - dot + 1e-6)
                        assert abs(float(theta[b, h, i, j]) - ref) < 1e-10, (t is None, b, h, i, j)


def test_kronecker_valence_attention_starts_as_identity_and_learns():
    """Zero-initialised signal half of the head-mixing GLU: the block is the identity at init for every kernel, and
    the zeroed weights still receive a gradient (the gate half is not zero)."""
    torch.manual_seed(0)
    u = torch.randn(2, 4, 5, 8)
    for kernel in ("tanimoto", "cosine", "sdpa"):
        layer = KroneckerValenceAttention(num_nodes=5, dim=8, num_heads=2, kern_dim=3, kern_layers=2, kernel=kernel)
        out = layer(u)
        torch.testing.assert_close(out, u)
        (out * torch.randn_like(out)).sum().backward()
        assert layer.mix.proj.weight.grad[:8].abs().sum() > 0


def test_weaver_public_api_forward_backward_with_and_without_time():
    model = create_model("weaver", num_nodes=207, window=12, horizon=12, in_channels=1)
    assert 0.30e6 < sum(p.numel() for p in model.parameters()) < 0.36e6  # Table 5: 0.34M (T)
    x = torch.randn(2, 12, 207, 1)
    (_, kwargs) = model.example_inputs(2)
    with torch.no_grad():
        y0 = model(x)
    y1 = model(x, time=kwargs["time"], mask=kwargs["mask"])
    assert y0.shape == y1.shape == (2, 12, 207, 1)
    y1.abs().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    nt = create_model("weaver", num_nodes=11, window=6, horizon=3, in_channels=2, use_time=False, dim=16,
                      num_heads=4, kernel="cosine")
    assert nt(torch.randn(2, 6, 11, 2)).shape == (2, 3, 11, 2)


def test_weaver_mask_ignores_missing_inputs_and_records_attention():
    model = create_model("weaver", num_nodes=13, window=12, horizon=12, dim=16, num_heads=4).eval()
    x = torch.randn(2, 12, 13, 1)
    mask = torch.rand(x.shape) > 0.3
    x2 = torch.where(mask, x, torch.randn_like(x) * 100)
    with record_attention(model) as rec:
        torch.testing.assert_close(model(x, mask=mask), model(x2, mask=mask))
    assert [name for name, _ in rec] == ["attention", "attention"]  # one record per forward
    for _, (temporal, spatial) in rec:
        assert spatial.shape == (2, 4, 13, 13) and temporal.shape == (2, 4, 12, 12)
    torch.testing.assert_close(rec[0][1][0], rec[1][1][0])  # the missing inputs do not reach the maps either


def test_bad_inputs_raise_clear_errors():
    model = create_model("weaver", num_nodes=10, dim=16, num_heads=4)
    with pytest.raises(ValueError, match="N=10"):
        model(torch.randn(2, 12, 207, 1))
    with pytest.raises(ValueError, match="time"):
        model(torch.randn(2, 12, 10, 1), time=torch.zeros(2, 12, 4))
    with pytest.raises(TypeError, match="mask"):
        model(torch.randn(2, 12, 10, 1), mask=torch.ones(2, 12, 10, 1))
    with pytest.raises(TypeError, match="floating"):
        model(torch.zeros(2, 12, 10, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`mask` must have shape \(2, 12, 10, 1\) or \(2, 12, 10\), got "
                                         r"\(2, 12, 10, 1, 1\)"):  # was a raw broadcast error from masked_fill
        model(torch.randn(2, 12, 10, 1), mask=torch.ones(2, 12, 10, 1, 1, dtype=torch.bool))
    for name in ("last_value", "historical_average"):  # out_channels was accepted and ignored
        with pytest.raises(ValueError, match=r"`out_channels` must equal in_channels=2 \(or be None\), got 1"):
            create_model(name, num_nodes=10, in_channels=2, out_channels=1)
        assert create_model(name, num_nodes=10, in_channels=2, out_channels=2).out_channels == 2
    with pytest.raises(ValueError, match="divisible"):
        create_model("weaver", dim=30, num_heads=8)
    with pytest.raises(ValueError, match="kernel"):
        create_model("weaver", kernel="softmax2")


@pytest.mark.parametrize("name, layer, maps", [
    ("traffic_full_attention", FullAttention, {"blocks.0.attn": [(2, 2, 54, 54)], "blocks.1.attn": [(2, 2, 54, 54)]}),
    ("traffic_alternating", AxialAttention, {"blocks.0.attn": [(2, 2, 9, 6, 6)], "blocks.2.attn": [(2, 2, 6, 9, 9)]}),
    ("traffic_hot", KroneckerAttention, {"blocks.0.attn": [(2, 2, 6, 6), (2, 2, 9, 9)]}),
])
def test_transformer_baselines_use_the_shared_attention_layers(name, layer, maps):
    model = create_model(name, num_nodes=9, window=6, horizon=4, dim=16, num_heads=2)
    assert all(isinstance(b, Block) and isinstance(b.attn, layer) for b in model.blocks)
    args, kwargs = model.example_inputs(2)
    y = model(*args, **kwargs)
    assert y.shape == (2, 4, 9, 1)
    y.mean().backward()
    with record_attention(model) as rec:
        model(*args, **kwargs)
    recorded = dict(rec)
    assert len(recorded) == len(model.blocks)
    for key, shape in maps.items():
        assert [tuple(t.shape) for t in recorded[key] if t is not None] == shape, key
    # every map is row-stochastic: the blocks really attend along the named modes
    for got in recorded.values():
        for a in got:
            if a is not None:
                torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    with pytest.raises(ValueError, match=r"`layout` must be one of \['alternating', .*got 'diagonal'"):
        TrafficTransformer("diagonal", num_nodes=9)
    with pytest.raises(ValueError, match="`num_layers` must be an int >= 1"):
        TrafficTransformer("temporal", num_layers=0, num_nodes=9)


def test_parameter_free_baselines():
    x = torch.randn(2, 5, 3, 1)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 3:, 1] = False  # node 1 of sample 0: last observation at step 2
    mask[1, :, 2] = False  # never observed -> 0 (the training mean)
    lv = create_model("last_value", num_nodes=3, window=5, horizon=4)(x, mask=mask)
    assert lv.shape == (2, 4, 3, 1)
    assert lv[0, :, 1, 0].eq(x[0, 2, 1, 0]).all() and lv[0, :, 0, 0].eq(x[0, 4, 0, 0]).all()
    assert lv[1, :, 2].eq(0).all()
    ha = create_model("historical_average", num_nodes=3, window=5, horizon=4)(x, mask=mask)
    torch.testing.assert_close(ha[0, 0, 1, 0], x[0, :3, 1, 0].mean())
    torch.testing.assert_close(ha[0, 0, 0, 0], x[0, :, 0, 0].mean())


# ------------------------------------------------------------------------------------------------- configs
CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs" / "weaver").glob("*.yaml"))


def _printed(path, capsys, *extra) -> dict:
    import yaml

    from hoformer.cli import main

    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(path), *extra, "--print_config"])
    assert e.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_configs_follow_the_paper_protocol(cfg, capsys):
    """Table 3 defaults (E=128, H=8 unless the CPU budget's E=32), Adam lr 1e-3 with the weight decay as L2 and an
    exponential decay 0.9 per epoch, batch 32, torch-spatiotemporal's split for METR-LA / PEMS-BAY and DCRNN's for
    Los-loop; early stopping on the validation loss (patience 10, min delta 1e-3) for the paper's <= 50 epochs."""
    c = _printed(cfg, capsys)
    model = c["model"]["init_args"]["model"]["init_args"]
    optim = c["model"]["init_args"]["optim"]
    assert (optim["optimizer"], optim["lr"], optim["schedule"], optim["gamma"]) == ("adam", 1e-3, "exponential", 0.9)
    assert model["dim"] == (32 if "cpu" in cfg.stem else 128) and model["num_heads"] == 8
    d = c["data"]["init_args"]
    assert d["batch_size"] == 32 and d["split_protocol"] == ("dcrnn" if d["dataset"] == "los_loop" else "tsl")
    stop = [x["init_args"] for x in c["trainer"]["callbacks"] if x["class_path"].endswith("EarlyStopping")]
    if "cpu" in cfg.stem:
        assert not stop and c["trainer"]["max_epochs"] == 8
    else:
        assert c["trainer"]["max_epochs"] == 50
        assert [(x["monitor"], x["patience"], x["min_delta"]) for x in stop] == [("val/loss", 10, 1e-3)]
    assert c["trainer"]["default_root_dir"] == f"runs/weaver/{cfg.stem}" or cfg.stem in ("paper", "los_loop_cpu")
    if "cpu" not in cfg.stem:  # the CPU schedule feeds the time features; an NT model ignores them
        assert c["model"]["init_args"]["use_time"] == model["use_time"]


@pytest.mark.slow
def test_weaver_learns_los_loop_better_than_last_value(data_root):
    """A few CPU minutes: Weaver (E=32) beats the last-value forecast at 60 minutes on Los-loop."""
    from hoformer.data.traffic import TrafficDataModule
    from hoformer.train.metrics import MaskedMAE, masked_mae
    from hoformer.train.traffic import forecast, original_scale

    dm = TrafficDataModule("los_loop", root=str(data_root / "traffic"), batch_size=16, eval_batch_size=64)
    dm.setup()
    model = create_model("weaver", dim=32, num_heads=8)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(4):
        model.train()
        for b in dm.train_dataloader():
            loss = masked_mae(forecast(model, b), original_scale(b["y"], b), b["y_mask"])
            opt.zero_grad()
            loss.backward()
            opt.step()
    scores = {}
    for name, m in (("weaver", model.eval()), ("last", create_model("last_value"))):
        metric = MaskedMAE(at=12)
        with torch.no_grad():
            for b in dm.test_dataloader():
                metric.update(forecast(m, b), original_scale(b["y"], b), b["y_mask"])
        scores[name] = float(metric.compute())
    assert scores["weaver"] < scores["last"], scores


def test_valence_attention_uses_ratio_time_over_time_and_ratio_space_over_nodes():
    """Eq 46: the pooling over time (spatial nodes) uses k = ceil(rho_T P), the pooling over nodes rho_S."""
    from hoformer.functional.weaver import atk_pool
    from hoformer.layers.weaver import KroneckerValenceAttention

    layer = KroneckerValenceAttention(num_nodes=5, dim=8, num_heads=2, kern_dim=3, kern_layers=1,
                                      ratio_space=0.4, ratio_time=0.75).double()
    u = torch.randn(2, 4, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(layer.pool_s(u), atk_pool(u, layer.pool_s.scorers, 0.75, 1))  # over P=4 steps: k=3
    torch.testing.assert_close(layer.pool_t(u), atk_pool(u, layer.pool_t.scorers, 0.4, 2))   # over N=5 nodes: k=2



def test_dictionary_retrieval_runs_entmax_in_float32_for_half_inputs():
    """Eq 37's entmax-1.5 runs in float32 for bf16 / fp16 logits (the docstring's promise): weights are float32 and
    equal to the float32 computation on the same (rounded) inputs. Kills: entmax in the input's half precision."""
    torch.manual_seed(0)
    logits = (torch.randn(2, 6, 16) * 3).bfloat16()
    tau, dic = torch.randn(6, 1).bfloat16(), torch.randn(16, 12).bfloat16()
    w, cof = dictionary_retrieval(logits, tau, dic)
    w_ref, cof_ref = dictionary_retrieval(logits.float(), tau.float(), dic.float())
    assert w.dtype == torch.float32 and cof.dtype == torch.bfloat16
    torch.testing.assert_close(w, w_ref)
    torch.testing.assert_close(cof, cof_ref.bfloat16())


@pytest.mark.parametrize("name", ["traffic_full_attention", "traffic_alternating", "traffic_hot"])
def test_traffic_transformer_readout_maps_each_nodes_flattened_history(name):
    """STAEformer's output projection: node n's forecast (Q, C) = head(norm(h)[:, :, n] flattened over (P, E)).
    Kills: flattening (P, N, E) without moving N first, viewing the (B, N, Q*C) head output as (B, Q, N, C)."""
    torch.manual_seed(0)
    m = create_model(name, num_nodes=5, window=6, horizon=4, in_channels=2, dim=8, num_heads=2).double().eval()
    seen = {}
    m.norm.register_forward_hook(lambda mod, inp, out: seen.__setitem__("h", out))
    x = torch.randn(3, 6, 5, 2, dtype=D64)
    with torch.no_grad():
        y = m(x)
        h = seen["h"]  # (b, p, n, e)
        ref = torch.stack([m.head(h[:, :, n].reshape(3, -1)).view(3, 4, 2) for n in range(5)], dim=2)
        torch.testing.assert_close(y, ref)


def test_traffic_temporal_only_baseline_is_node_local():
    """With temporal attention only (each sensor's own history) node j's forecast depends on node j's input only.
    Kills the same two readout mutants behaviourally."""
    from hoformer.models.weaver import TrafficTransformer

    torch.manual_seed(0)
    m = TrafficTransformer("temporal", num_layers=1, num_nodes=5, window=6, horizon=4, dim=8,
                           num_heads=2).double().eval()
    x = torch.randn(2, 6, 5, 1, dtype=D64)
    x2 = x.clone()
    x2[:, :, 3] += 1.0
    with torch.no_grad():
        diff = (m(x2) - m(x)).abs().amax(dim=(0, 1, 3))  # per node
    assert diff[3] > 1e-6 and (diff[[0, 1, 2, 4]] < 1e-12).all()


def test_traffic_hot_baseline_uses_mean_pooled_kronecker_attention():
    """traffic_hot's blocks are HOT Kronecker attention with *mean* pooling and plain q/k (BASELINE_ATTENTION):
    each block's attention equals a stand-alone KroneckerAttention(pool="mean", qk_norm=False) with its weights.
    Kills: the preset dropping pool="mean" (sum pooling, N_other^2 larger logits without q/k norm)."""
    torch.manual_seed(0)
    m = create_model("traffic_hot", num_nodes=5, window=6, horizon=4, dim=8, num_heads=2).double().eval()
    ref = KroneckerAttention(8, 2, pool="mean", qk_norm=False, num_modes=2, attn_dropout=0.0).double().eval()
    h = torch.randn(2, 6, 5, 8, dtype=D64)
    with torch.no_grad():
        for blk in m.blocks:
            ref.load_state_dict(blk.attn.state_dict())
            torch.testing.assert_close(blk.attn(h), ref(h))
