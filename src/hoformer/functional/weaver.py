"""Weaver building blocks (paper 003, sections 3-5): valence attention maps, the traffic phase dictionary,
ATk-pooling with the pooling informativeness metric (PIM), cyclic time encodings and the P^2-KMV.

Axis legend
-----------
``b`` batch, ``h`` heads, ``p`` history steps (temporal nodes, P), ``n`` spatial nodes (N), ``e`` embedding (E),
``d`` per-head features, ``m`` dictionary landmarks (M_Xi) or scorers (M_gamma), ``k`` cofactor width (K_Xi).

The P^2-KMV (eqs 20-27, 55-57) and its generalisation P^Delta-KMV (appendix F, eqs 133-140) is
:func:`hoformer.functional.kron_apply`; :func:`p2_kmv` only fixes Weaver's argument order.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import check_finite_result, check_scale, check_values
from .products import kron_apply
from .scores import SCORE_FNS, dot_scores

__all__ = [
    "VALENCE_KERNELS",
    "valence_attention",
    "p2_kmv",
    "check_time_features",
    "cyclic_time_encoding",
    "dictionary_retrieval",
    "pooling_informativeness",
    "atk_pool",
]

VALENCE_KERNELS = (*SCORE_FNS, "sdpa")  # the signed kernels of scores.py plus the softmax ablation


def valence_attention(q: torch.Tensor, k: torch.Tensor, kernel: str = "tanimoto", *, eps: float = 1e-6,
                      scale: float | None = None) -> torch.Tensor:
    """Attention map ``Theta (b, h, n, n')`` from ``q (b, h, n, d)``, ``k (b, h, n', d)``.

    ``kernel``: ``"tanimoto"`` (continuous Tanimoto coefficient, eq 29/47, signed, in ``[-1/3, 1]``),
    ``"cosine"`` (eq 69, signed) or ``"sdpa"`` (``softmax(q k^T * scale)``, eq 5; the ablation of section 7.2).
    Signed maps are used as weights directly (no softmax), so messages can be subtracted; ``scale`` (the softmax
    logit scale) applies to ``"sdpa"`` only and is an error with a signed kernel, as in
    :func:`~hoformer.functional.kronecker_attention`.
    """
    if kernel in SCORE_FNS:
        if scale is not None:
            raise ValueError(f"valence_attention: `scale` applies to kernel='sdpa' only; the signed {kernel!r} scores "
                             f"are used as they are (got scale={scale})")
        theta = SCORE_FNS[kernel](q, k, eps=eps)
    elif kernel == "sdpa":
        check_scale("valence_attention", scale)
        theta = dot_scores(q, k, scale=scale).softmax(dim=-1)
    else:
        raise ValueError(f"valence_attention: `kernel` must be one of {VALENCE_KERNELS}, got {kernel!r}")
    check_finite_result(theta, "valence_attention", q=q, k=k)
    return theta


def p2_kmv(theta_t: torch.Tensor, theta_s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """P^2-KMV message passing (eqs 55-57): ``(Theta_T (x) Theta_S) vec(u)`` per ``(b, h, :, d)`` fiber.

    ``theta_t (b|1, h|1, p, p)``, ``theta_s (b|1, h|1, n, n)``, ``u (b, h, p, n, d)`` -> ``(b, h, p, n, d)``, i.e.
    ``z[.., i, r, :] = sum_{j, s} Theta_T[i, j] Theta_S[r, s] u[.., j, s, :]``; never forms the ``PN x PN`` map.
    """
    return kron_apply([theta_t, theta_s], u)


MINUTES_PER_DAY, DAYS_PER_WEEK = 1440, 7


def check_time_features(time, fn: str = "cyclic_time_encoding") -> None:
    """Validate ``time (..., 2) = [minute of day in [0, 1440), day of week in [0, 7)]`` (the layout of
    :func:`hoformer.data.traffic.time_features`); NaN / inf fail. Also rejects a time-of-day column that looks like a
    *fraction* of the day (every value in ``[0, 1)``, not all 0), which would encode every step as about midnight.

    Cheap: a few reductions, run in every mode (training, ``torch.no_grad``, eval); on CPU a descriptive error, on
    an accelerator an asynchronous device-side assert (no host sync, :func:`hoformer._checks.check_values`)."""
    if not isinstance(time, torch.Tensor) or time.shape[-1:] != (2,) or time.dtype == torch.bool:
        got = (f"{time.dtype} {tuple(time.shape)}" if isinstance(time, torch.Tensor) else type(time).__name__)
        raise ValueError(f"{fn}: `time` must be a numeric tensor (..., 2) of [minute of day, day of week], got {got}")
    if time.numel() == 0:
        return
    tod = time[..., 0]
    for col, name, hi in ((0, "minute of day", MINUTES_PER_DAY), (1, "day of week", DAYS_PER_WEEK)):
        v = time[..., col]
        inside = (v >= 0) & (v < hi)  # NaN compares False: rejected too

        def detail(v=v, inside=inside):
            bad = v[~inside]
            return f", got {bad.numel()} value(s) outside it, e.g. {bad.flatten()[0].item()}"

        check_values(inside.all(), f"{fn}: `time[..., {col}]` ({name}) must lie in [0, {hi}){{detail}}", detail)
    check_values(~((tod.max() < 1) & (tod != 0).any()),
                 f"{fn}: `time[..., 0]` must be the minute of day in [0, {MINUTES_PER_DAY}), but every value lies in "
                 f"[0, 1){{detail}}: it looks like a fraction of the day; multiply by {MINUTES_PER_DAY}",
                 lambda: f" (max {tod.max().item()})")


def cyclic_time_encoding(time: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Cyclic TOD/DOW encoding ``B_dyn`` (eqs 53-54).

    ``time (..., 2)`` holds ``[minute of day in [0, 1440), day of week in [0, 7)]`` (checked by
    :func:`check_time_features` unless ``check=False``, for callers that validated ``time`` already: the check costs
    a few reductions) -> ``(..., 4) = [sin, cos](2 pi tod / 1440) || [sin, cos](2 pi dow / 7)``, in float32 (float64 for
    float64 ``time``).
    """
    if check:
        check_time_features(time, "cyclic_time_encoding")
    t = time.to(torch.promote_types(time.dtype, torch.float32))  # at least float32 (float64 stays float64)
    tod, dow = t[..., 0] * (2 * math.pi / MINUTES_PER_DAY), t[..., 1] * (2 * math.pi / DAYS_PER_WEEK)
    return torch.stack([tod.sin(), tod.cos(), dow.sin(), dow.cos()], dim=-1)


def dictionary_retrieval(logits: torch.Tensor, temperature: torch.Tensor, dictionary: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse traffic-phase dictionary look-up (eqs 36-37).

    Args:
        logits: retrieval queries ``(b, n, m)`` (the GLU output of eq 36).
        temperature: raw per-node temperatures ``tau (n, 1)``, one per node (exactly this shape: a ``(m,)`` vector
            would silently broadcast over the landmarks instead); ``softplus`` keeps them positive.
        dictionary: landmarks ``C_Xi (m, f)`` (``f = P * K_Xi``).

    Returns:
        ``weights (b, n, m) = entmax_1.5(logits / softplus(tau))`` on the probability simplex (sparse), and
        ``cofactors (b, n, f) = weights @ C_Xi``. Entmax runs in at least float32 (autocast-safe; float64 stays
        float64).
    """
    from entmax import entmax15

    if logits.ndim < 2 or dictionary.ndim != 2:
        raise ValueError(f"dictionary_retrieval: need `logits` (b, n, m) and `dictionary` (m, f), got "
                         f"{tuple(logits.shape)} and {tuple(dictionary.shape)}")
    if not isinstance(temperature, torch.Tensor) or tuple(temperature.shape) != (logits.shape[-2], 1):
        got = tuple(temperature.shape) if isinstance(temperature, torch.Tensor) else type(temperature).__name__
        raise ValueError(f"dictionary_retrieval: `temperature` must have shape (n, 1) = ({logits.shape[-2]}, 1), one "
                         f"per node of `logits` {tuple(logits.shape)}, got {got}")
    if logits.shape[-1] != dictionary.shape[0]:
        raise ValueError(
            f"dictionary_retrieval: `logits` last dim ({logits.shape[-1]}) must equal the number of landmarks "
            f"(`dictionary` rows, {dictionary.shape[0]}); got logits {tuple(logits.shape)}, "
            f"dictionary {tuple(dictionary.shape)}"
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        z = logits.to(dtype) / F.softplus(temperature.to(dtype))
        if torch.compiler.is_compiling():  # torch.compile: the same function as an opaque custom op (export: core ops)
            from ._traced import traced_call

            w = traced_call(torch.ops.hoformer.entmax15.default, z, -1)
        else:
            w = entmax15(z, dim=-1)
        return w, torch.matmul(w, dictionary.to(dtype)).to(logits.dtype)


def pooling_informativeness(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """PIM (eq 45): variance of ``scores (b, p, n, m)`` over the pooled mode ``dim`` (1 = time, 2 = nodes),
    summed over the other mode -> ``(b, m)``, one value per scorer."""
    if scores.ndim != 4 or dim not in (1, 2):
        raise ValueError(f"pooling_informativeness: need scores (b, p, n, m) and dim in (1, 2), got "
                         f"{tuple(scores.shape)}, dim={dim}")
    return scores.var(dim=dim, unbiased=False).sum(dim=1)


def atk_pool(u: torch.Tensor, scorers: torch.Tensor, ratio: float, dim: int, *, return_index: bool = False):
    """Adaptive top-k pooling, ATk-pooling (eqs 42-46).

    Args:
        u: spatiotemporal embedding ``(b, p, n, e)``.
        scorers: ``W_gamma (e, m)``; each column is normalised to unit length (eq 46).
        ratio: pooling ratio ``rho`` in ``(0, 1]``; ``k = ceil(rho * size(dim))``.
        dim: pooled mode: ``1`` pools over time -> spatial nodes ``U_S (b, n, e)``;
            ``2`` pools over nodes -> temporal nodes ``U_T (b, p, e)``.
        return_index: also return the chosen scorer per sample ``(b,)``.

    Per sample, the scorer with the largest PIM (eq 44-45) is selected; its scores pick the top-k entries along
    ``dim``, whose softmax (eq 43) weights the sum of the selected features (eq 42).
    """
    if u.ndim != 4 or dim not in (1, 2):
        raise ValueError(f"atk_pool: need u (b, p, n, e) and dim in (1, 2), got {tuple(u.shape)}, dim={dim}")
    if scorers.ndim != 2 or scorers.shape[0] != u.shape[-1]:
        raise ValueError(f"atk_pool: `scorers` must be (e={u.shape[-1]}, m), got {tuple(scorers.shape)}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"atk_pool: `ratio` must be in (0, 1], got {ratio}")
    w = scorers / scorers.norm(dim=0, keepdim=True).clamp_min(1e-12)
    gamma = torch.matmul(u, w.to(u.dtype))  # (b, p, n, m), eq 46
    best = pooling_informativeness(gamma.detach().float(), dim).argmax(dim=-1)  # (b,), eq 44
    g = gamma.gather(-1, best.view(-1, 1, 1, 1).expand(*gamma.shape[:3], 1)).squeeze(-1)  # (b, p, n)
    size = u.shape[dim]
    k = max(1, math.ceil(round(ratio * size, 9)))  # eq 42's ceil(rho * P) without float noise (0.55 * 100 -> 55)
    top, idx = g.topk(k, dim=dim)  # (b, k, n) or (b, p, k)
    h = top.softmax(dim=dim).unsqueeze(-1)  # eq 43
    sel = u.gather(dim, idx.unsqueeze(-1).expand(*idx.shape, u.shape[-1]))
    pooled = (sel * h).sum(dim=dim)  # eq 42
    return (pooled, best) if return_index else pooled
