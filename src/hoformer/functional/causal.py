"""Kronecker attention that is causal along one mode (HOT, paper 000 eqs 5-9, made causal along a mode ``c``).

Axis legend
-----------
``b`` batch, ``h`` heads, ``t`` the causal mode (length ``T``), ``n2..nk`` the other modes, ``e`` per-head features,
``f`` random features, ``p`` the flattened other modes times ``e``.

A per-mode mask on mode ``c`` masks the factor ``S_c`` only: the other modes' factors ``S_i`` are computed from
queries / keys pooled over *every* index of mode ``c``, future ones included, so ``y[t]`` still depends on
``x[t']`` for ``t' > t``. Causal attention along ``c`` replaces them, for every query index ``t`` of mode ``c``, by a
factor ``S_i^(t)`` from queries / keys pooled over the indices ``<= t`` only (prefix sums or means of the pooled
input), and makes ``S_c`` lower-triangular:

* product (eqs 3, 8):  ``y[t] = (S_2^(t) (x) .. (x) S_k^(t)) (sum_{t' <= t} S_c[t, t'] v[t'])``;
* sum (eqs 4, 9):      ``y[t] = (1/k) (sum_{t' <= t} S_c[t, t'] v[t'] + sum_{i != c} v[t] x_i S_i^(t))``,

where ``v[t]`` is the slice ``(n2..nk, e)`` of the values at index ``t`` of mode ``c``. Then ``y[t]`` depends on
``x[:t+1]`` (along ``c``) only and equals the non-causal layer applied to ``x[:t+1]``, read at its last index.

Cost: the causal mode's product is one ``(T, T) x (T, p)`` matmul per (batch, head) pair, as in the non-causal layer;
the other modes' factors become ``T`` times as many small matrices ``(Ni, Ni)``, applied by the same cache-blocked
:func:`~hoformer.functional.products.kron_apply` / ``kron_sum_apply`` with ``(head, t)`` pairs as batch entries (no
``prod(N) x prod(N)`` matrix, no loop over ``t``). The factor sizes grow from ``sum_i Ni^2`` to ``T sum_i Ni^2`` per
(batch, head) pair, still below the value's ``T prod(Ni)`` entries unless a mode other than ``c`` is longer than the
product of the remaining ones.

The functions here take per-mode queries / keys already pooled: ``q[c], k[c] (B, H, T, E)`` and, for every other mode
``i``, the prefix-pooled ``q[i], k[i] (B, H, T, Ni, E)`` (row ``t`` pooled over indices ``<= t`` of mode ``c``).
:class:`~hoformer.layers.KroneckerAttention` with ``causal_mode`` pools and projects them.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from hoformer._checks import DETAIL, check_finite_result, check_int, check_values

from .kronecker import _check_mode_masks, _linear_attention, _safe_denominator, check_kernel_args, elu_feature_map
from .products import _check_tensor, _kron_apply, _kron_sum_apply
from .dropout_bits import dropout
from .scores import _dot, _masked_softmax

__all__ = ["causal_kronecker_attention", "causal_mask"]


def causal_mask(n: int, device=None) -> torch.Tensor:
    """Bool ``(n, n)`` lower-triangular mask (True = may attend): query ``t`` sees keys ``t' <= t``."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def causal_kronecker_attention(
    q: Sequence[torch.Tensor],
    k: Sequence[torch.Tensor],
    v: torch.Tensor,
    *,
    causal_mode: int = 0,
    combine: str = "product",
    kernel: str = "softmax",
    scale: float | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
    dropout_p: float = 0.0,
    return_factors: bool = False,
    score_fn: Callable[..., torch.Tensor] | None = None,
):
    """Kronecker attention causal along mode ``causal_mode`` (see the module docstring for the equations).

    Args:
        q, k: one entry per mode. The causal mode's ``(B, H, T, E)``; every other mode ``i``'s prefix-pooled
            ``(B, H, T, Ni, E)`` (size-1 ``B`` / ``H`` broadcast).
        v: values ``(B, H, N1..Nk, Dv)`` with ``N_c = T``.
        causal_mode: the 0-based mode along which the output is causal.
        combine, kernel, scale, feature_map, dropout_p, score_fn: as in
            :func:`~hoformer.functional.kronecker_attention`.
        masks: per mode ``None`` or bool ``(..., Ni, Ni)`` (True = may attend), applied to every ``S_i^(t)``; the
            causal mode's mask is combined with the lower-triangular one.
        return_factors: also return the factors: the causal mode's ``(B, H, T, T)`` (lower-triangular), every other
            mode's ``(B, H, T, Ni, Ni)`` (one per query index ``t``).

    Returns:
        ``y (B, H, N1..Nk, Dv)`` or ``(y, factors)``.
    """
    fn = "causal_kronecker_attention"
    _check_tensor(v, "v", fn, 4)
    nmodes = v.ndim - 3
    check_int(fn, "causal_mode", causal_mode, low=0)
    if causal_mode >= nmodes:
        raise ValueError(f"{fn}: `causal_mode` must be a mode index in [0, {nmodes}) for `v` of shape "
                         f"{tuple(v.shape)}, got {causal_mode}")
    check_kernel_args(fn, combine, kernel, scale, dropout_p, score_fn)
    sizes = v.shape[2:-1]
    T = sizes[causal_mode]
    for name, seq in (("q", q), ("k", k)):
        if isinstance(seq, torch.Tensor) or not isinstance(seq, Sequence):
            raise TypeError(f"{fn}: `{name}` must be a list of {nmodes} per-mode tensors, got {type(seq).__name__}")
        if len(seq) != nmodes:
            raise ValueError(f"{fn}: `{name}` must be a list of {nmodes} per-mode tensors, got {len(seq)}")
    bh = tuple(v.shape[:2])
    for i, n in enumerate(sizes):
        want = (T, n) if i != causal_mode else (T,)
        what = f"(B, H, {T}, {n}, E)" if i != causal_mode else f"(B, H, {T}, E)"
        for name, t in ((f"q[{i}]", q[i]), (f"k[{i}]", k[i])):
            _check_tensor(t, name, fn, len(want) + 1)
            lead = tuple(t.shape[: -1 - len(want)])
            if (tuple(t.shape[-1 - len(want):-1]) != want or len(lead) > 2
                    or any(a not in (1, c) for a, c in zip(lead[::-1], bh[::-1]))):
                role = "the causal mode" if i == causal_mode else "prefix-pooled along the causal mode"
                raise ValueError(f"{fn}: `{name}` must have shape {what} (B, H = {bh}, size 1 broadcasts) for mode {i}"
                                 f" ({role}), got {tuple(t.shape)}")
        if q[i].shape[-1] != k[i].shape[-1]:
            raise ValueError(f"{fn}: `q[{i}]` {tuple(q[i].shape)} and `k[{i}]` {tuple(k[i].shape)} differ in E")
    _check_mode_masks(masks, sizes, fn, bh)
    q_in, k_in = q, k
    if kernel == "linear":
        phi = feature_map or elu_feature_map
        q = [phi(t) for t in q]
        k = [phi(t) for t in k]
        if feature_map is not None:
            low = torch.stack([torch.stack([a.min(), b.min()]) for a, b in zip(q, k)]).min()
            check_values(low >= 0, f"{fn}: `feature_map` must return non-negative features{DETAIL}",
                         lambda: f", got a minimum of {low.item():.3g}")
    order = [causal_mode] + [i for i in range(nmodes) if i != causal_mode]
    y, factors = _causal_kronecker(
        [q[i] for i in order], [k[i] for i in order], v.movedim(2 + causal_mode, 2),
        combine=combine, kernel=kernel, scale=scale, masks=None if masks is None else [masks[i] for i in order],
        dropout_p=dropout_p, want_factors=return_factors, score_fn=score_fn,
    )
    y = y.movedim(2, 2 + causal_mode)
    check_finite_result(y, fn, q=q_in, k=k_in, v=v)
    if not return_factors:
        return y
    out = [None] * nmodes
    for j, i in enumerate(order):
        out[i] = factors[j]
    return y, out


# ------------------------------------------------------------------------------------------ internals
def _mask4(m: torch.Tensor | None) -> torch.Tensor | None:
    """A per-mode mask ``(.., n, n)`` as ``(B|1, H|1, n, n)``."""
    return None if m is None else m.view((1,) * (4 - m.ndim) + tuple(m.shape))


def _causal_kronecker(q, k, v, *, combine, kernel, scale, masks, dropout_p, want_factors, score_fn,
                      key_log_scale=None):
    """:func:`causal_kronecker_attention` without checks, the causal mode first: ``q[0], k[0] (B|1, H|1, T, E)``,
    ``q[i], k[i] (B|1, H|1, T, Ni, E)`` (``i >= 1``; for ``kernel="linear"`` already the features, the causal mode's
    keys ``k[0] * exp(key_log_scale)`` when that ``(B|1, H|1, T, 1)`` is given, see :func:`causal_linear_factor`),
    ``v (B, H, T, N2..Nk, E)``. Returns ``(y, factors or None)``."""
    b, h, T = v.shape[:3]
    dtype = torch.float32 if kernel == "linear" and v.dtype == torch.float16 else v.dtype
    m0 = causal_mask(T, v.device)
    if masks is not None and masks[0] is not None:
        m0 = m0 & masks[0]
    if kernel == "linear":
        with torch.autocast(v.device.type, enabled=False):
            s0 = causal_linear_factor(q[0].to(dtype), k[0].to(dtype), m0, key_log_scale)
    elif score_fn is not None:
        s0 = score_fn(q[0], k[0]) * m0
    else:
        s0 = _masked_softmax(_dot(q[0], k[0], scale), m0)
    s0 = s0.to(dtype)
    used0 = dropout(s0, p=dropout_p) if dropout_p > 0 else s0
    vf = v.reshape(b, h, T, -1)
    z = torch.matmul(used0, vf.to(dtype))  # (b, h, t, p): sum_{t' <= t} S_c[t, t'] v[t']
    y, rest = _apply_rest(z, vf, q[1:], k[1:], None if masks is None else masks[1:], v.shape[3:], combine=combine,
                          kernel=kernel, scale=scale, dropout_p=dropout_p, want_factors=want_factors,
                          score_fn=score_fn)
    return y.to(v.dtype), ([s0.to(v.dtype)] + rest if want_factors else None)


def _apply_rest(z, v, q, k, masks, rest_shape, *, combine, kernel, scale, dropout_p, want_factors, score_fn):
    """The other modes' part given the causal mode's product ``z (B, H, T, p)`` and the values ``v (B, H, T, p)``
    (read only for ``combine="sum"``): the per-``t`` factors from ``q[i], k[i] (B|1, H|1, T, Ni, E)`` applied with
    ``(head, t)`` pairs as batch entries. Returns ``(y (B, H, T, N2..Nk, E), factors (B, H, T, Ni, Ni) or [])``."""
    b, h, T = z.shape[:3]
    nrest = len(q)
    if nrest == 0:
        return z.view(b, h, T, *rest_shape), []
    zb = z.reshape(b, h * T, *rest_shape)  # a view: (b, h, t, p) is contiguous
    vb = v.to(z.dtype).reshape(b, h * T, *rest_shape) if combine == "sum" else None
    masks = [None] * nrest if masks is None else list(masks)
    if kernel == "linear":
        feats = [(_bt(fq, b, h), _bt(fk, b, h)) for fq, fk in zip(q, k)]
        ms = [None if m is None else _mask4(m).unsqueeze(2).expand(-1, h, T, -1, -1).reshape(
            _mask4(m).shape[0], h * T, *m.shape[-2:]) for m in masks]
        if combine == "product":
            out = _linear_attention(feats, zb, "product", ms, want_factors)
        else:
            out = _linear_attention(feats, vb, "sum", ms, want_factors)
        y, fs = out if want_factors else (out, [])
        if combine == "sum":  # (1/(k-1)) sum_{i>=1} -> (1/k) (z + sum_{i>=1})
            y = (zb + y * nrest) / (nrest + 1)
        return y.reshape(b, h, T, *rest_shape), [f.reshape(b, h, T, *f.shape[-2:]) for f in fs]
    factors = []
    for qi, ki, m in zip(q, k, masks):
        m5 = None if m is None else _mask4(m).unsqueeze(2)
        if score_fn is not None:
            s = score_fn(qi, ki)
            s = s if m5 is None else s * m5
        else:
            s = _masked_softmax(_dot(qi, ki, scale), m5)
        factors.append(s.to(z.dtype).expand(b, h, T, *s.shape[-2:]))
    used = [dropout(s, p=dropout_p) for s in factors] if dropout_p > 0 else factors
    flat = [s.reshape(b, h * T, *s.shape[-2:]) for s in used]
    if combine == "product":
        y = _kron_apply(flat, zb)
    else:
        y = (zb + _kron_sum_apply(flat, vb, normalize=False)) / (nrest + 1)
    return y.reshape(b, h, T, *rest_shape), factors if want_factors else []


def _bt(t: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """``(B|1, H|1, T, n, f) -> (B, H * T, n, f)``."""
    return t.expand(b, h, *t.shape[-3:]).reshape(b, h * t.shape[-3], *t.shape[-2:])


def _key_scales(fq: torch.Tensor, fk: torch.Tensor, log_scale: torch.Tensor | None):
    """``(fq / max_f fq, fk / max_f fk, l)``: both rescaled to a maximum of 1 per row (detached factors; a query's
    cancels in its row's normalisation) and ``l (.., T, 1)`` the log of each key's scale, ``log(max_f fk) +
    log_scale`` (``-inf`` for an all-zero key)."""
    sq = fq.detach().amax(-1, keepdim=True)
    sk = fk.detach().amax(-1, keepdim=True)
    log = torch.where(sk > 0, sk.log(), torch.full_like(sk, -math.inf))
    if log_scale is not None:
        log = log + log_scale.detach().to(log.dtype)
    return fq / _safe_denominator(sq), fk / _safe_denominator(sk), log


def _weigh(a: torch.Tensor, log: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """``a[.., t, t'] * exp(log[t'] - top[t])``: the key scales relative to the largest one a query row sees (``<= 1``
    for the keys it may attend to; the exponent is clipped at 0 for the others, which are masked afterwards)."""
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return a * torch.exp((log.transpose(-1, -2) - top).clamp_max(0.0))


def causal_linear_factor(fq: torch.Tensor, fk: torch.Tensor, mask: torch.Tensor | None = None,
                         log_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The linear kernel's factor along the causal mode, ``S = diag(A 1)^-1 A`` with ``A = fq fk^T`` lower-triangular
    (and zero where the bool ``mask`` is False), for features ``fq, fk (.., T, F)``; the key features are
    ``fk * exp(log_scale)`` when ``log_scale (.., T, 1)`` is given (FAVOR+ keys stabilised per row,
    :meth:`~hoformer.layers.FavorFeatures.with_log_scale`).

    Stabilised causally, so that row ``t`` depends on keys ``<= t`` only for any input: each key is rescaled to a
    maximum of 1, and row ``t`` weighs key ``t'`` by ``exp(l[t'] - max_{t'' <= t} l[t''])`` with ``l`` the log of the
    key scales (the running maximum of an online softmax). One scale shared by all keys, as in the non-causal
    :func:`~hoformer.functional.kronecker.linear_factor`, would let a large future key flush the past keys' features
    to 0. All scales are detached common factors of a row, so the gradients are those of the unscaled ``S``.
    """
    fq, fk, log = _key_scales(fq, fk, log_scale)
    a = _weigh(torch.matmul(fq, fk.transpose(-1, -2)), log, log.cummax(-2).values)
    T = a.shape[-1]
    allowed = causal_mask(T, a.device) if mask is None else mask & causal_mask(T, a.device)
    a = a.masked_fill(~allowed, 0.0)
    return a / _safe_denominator(a.sum(-1, keepdim=True))


def causal_row(q: torch.Tensor, k: torch.Tensor, *, kernel: str = "softmax", scale: float | None = None,
               score_fn: Callable[..., torch.Tensor] | None = None,
               key_log_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One decoding step's causal-mode attention row: the query ``q (B, H, 1, E)`` (for ``kernel="linear"`` its
    features) against every key so far ``k (B, H, t + 1, E)`` (features, scaled by ``exp(key_log_scale)`` as in
    :func:`causal_linear_factor`), ``(B, H, 1, t + 1)``; unchecked (the layer's ``step`` has checked its input).
    Every key is in the past, so nothing is masked."""
    if kernel == "linear":
        fq, fk, log = _key_scales(q, k, key_log_scale)
        a = _weigh(torch.matmul(fq, fk.transpose(-1, -2)), log, log.amax(-2, keepdim=True))
        return a / _safe_denominator(a.sum(-1, keepdim=True))
    if score_fn is not None:
        return score_fn(q, k)
    return _dot(q, k, scale).softmax(-1)
