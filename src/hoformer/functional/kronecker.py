"""Kronecker-structured attention (HOT, paper 000 sections 3-4; kernelized variant: paper 002 section 4.3).

Axis legend
-----------
``b``  batch, ``h`` heads, ``n1..nk`` the k tensor modes, ``d`` per-head features, ``f`` random features.

For a value tensor ``v (b, h, n1..nk, d)`` and one small attention matrix per mode ``S_m (b, h, nm, nm)``:

* product (eq 3, 8):  ``y = (S_1 (x) ... (x) S_k) vec(v)``, i.e.
  ``y[.., i1..ik, d] = sum_j prod_m S_m[i_m, j_m] v[.., j1..jk, d]`` (row-major flattening, mode 1 slowest);
* sum (eq 4, 9):      ``y = (1/k) sum_m v x_m S_m`` (mode-m product), the Kronecker sum ``S_1 (+) ... (+) S_k``.

Neither forms the ``prod(n) x prod(n)`` matrix: the products are applied by the cache-blocked kernels of
:mod:`hoformer.functional.products` (:func:`kron_apply`, :func:`kron_sum_apply`). The linear kernel forms its factors
too when that is cheaper (short modes) or a mode is masked, and then shares that path; otherwise its operator-valued
factors use plain batched matmuls on the whole value (:func:`_linear_attention`).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from hoformer._checks import DETAIL, check_finite_result, check_fraction, check_scale, check_values

from .products import _check_tensor, _kron_apply, _kron_apply_ops, _kron_sum_apply, _kron_sum_ops
from .dropout_bits import dropout
from .scores import _dot, _masked_softmax

__all__ = [
    "kronecker_attention",
    "mode_attention_factors",
    "elu_feature_map",
    "kron_dense",
    "kron_sum_dense",
]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def _flat_factor(s: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """``(B'|1, H'|1, n, m)`` -> ``(b*h, n, m)`` (expanding a broadcast factor costs only ``b*h*n*m``)."""
    return s.expand(b, h, *s.shape[-2:]).reshape(b * h, *s.shape[-2:])


# ------------------------------------------------------------------------------------------------ attention
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``, the positive feature map of linear attention (Katharopoulos et al.)."""
    return F.elu(x) + 1.0


def mode_attention_factors(
    q: Sequence[torch.Tensor],
    k: Sequence[torch.Tensor],
    *,
    scale: float | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    score_fn: Callable[..., torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Per-mode attention matrices ``S_i = softmax(q_i k_i^T * scale + mask_i)`` (HOT eq 7), ``(B, H, Ni, Ni)``.

    With ``score_fn`` (e.g. :func:`~hoformer.functional.tanimoto_scores`) the signed scores are used directly
    as weights (Weaver valence attention); masked entries are then set to 0.
    A row whose mask allows no key yields zeros (never NaN).
    """
    if isinstance(q, torch.Tensor) or not isinstance(q, Sequence):
        raise TypeError(f"mode_attention_factors: `q` must be a list of per-mode tensors (B, H, Ni, Dqk), got "
                        f"{type(q).__name__}")
    _check_qk_masks(q, k, masks, [qi.shape[-2] if isinstance(qi, torch.Tensor) and qi.ndim >= 2 else -1 for qi in q],
                    "mode_attention_factors")
    check_scale("mode_attention_factors", scale)
    return _mode_factors(q, k, scale, masks, score_fn)


def _mode_factors(q, k, scale, masks, score_fn) -> list[torch.Tensor]:
    """:func:`mode_attention_factors` without the argument checks (its callers have made them)."""
    out = []
    for i, (qi, ki) in enumerate(zip(q, k)):
        mask = None if masks is None else masks[i]
        if score_fn is not None:
            s = score_fn(qi, ki)
            if mask is not None:
                s = s * mask
        else:
            s = _masked_softmax(_dot(qi, ki, scale), mask)  # fully masked rows: 0
        out.append(s)
    return out


def _check_qk_masks(q, k, masks, sizes, fn, where: str = "") -> None:
    """Per-mode queries / keys ``(B, H, Ni, Dqk)`` and optional bool masks ``(..., Ni, Ni)`` for mode sizes ``sizes``."""
    nmodes = len(sizes)
    for name, seq in (("q", q), ("k", k)):
        if isinstance(seq, torch.Tensor) or not isinstance(seq, Sequence):
            raise TypeError(f"{fn}: `{name}` must be a list of {nmodes} per-mode tensors (B, H, Ni, Dqk)")
        if len(seq) != nmodes:
            raise ValueError(f"{fn}: {where}{nmodes} modes but `{name}` has {len(seq)} tensors")
    for i, n in enumerate(sizes):
        for name, t in ((f"q[{i}]", q[i]), (f"k[{i}]", k[i])):
            _check_tensor(t, name, fn, 2)
            if t.shape[-2] != n:
                raise ValueError(f"{fn}: `{name}` must have shape (B, H, {n}, Dqk) to match mode {i + 1}"
                                 f"{' of ' + where.rstrip(': ') if where else ''}, got {tuple(t.shape)}")
        if q[i].shape[-1] != k[i].shape[-1]:
            raise ValueError(f"{fn}: `q[{i}]` {tuple(q[i].shape)} and `k[{i}]` {tuple(k[i].shape)} differ in Dqk")
    _check_mode_masks(masks, sizes, fn)


def _check_mode_masks(masks, sizes, fn: str, bh: tuple[int, int] | None = None) -> None:
    """Per-mode masks: ``None``, or a list with one entry per mode of ``sizes``, each ``None`` or a bool
    ``(..., Ni, Ni)``; given ``bh = (B, H)``, also at most 4-d and broadcasting like ``(B|1, H|1, Ni, Ni)``."""
    if masks is None:
        return
    nmodes = len(sizes)
    if isinstance(masks, torch.Tensor) or len(masks) != nmodes:
        raise ValueError(f"{fn}: `masks` must be a list of {nmodes} entries (one per mode, None allowed), got "
                         f"{type(masks).__name__ if isinstance(masks, torch.Tensor) else len(masks)}")
    for i, (m, n) in enumerate(zip(masks, sizes)):
        if m is None:
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise TypeError(f"{fn}: `masks[{i}]` must be a bool tensor (True = attend), got "
                            f"{getattr(m, 'dtype', type(m))}")
        if bh is None:
            if m.ndim < 2 or m.shape[-2:] != (n, n):
                raise ValueError(f"{fn}: `masks[{i}]` must have shape (..., {n}, {n}), got {tuple(m.shape)}")
        elif not 2 <= m.ndim <= 4 or m.shape[-2:] != (n, n) or any(
                a not in (1, c) for a, c in zip(m.shape[:-2][::-1], bh[::-1])):
            raise ValueError(f"{fn}: `masks[{i}]` must broadcast like (B|1, H|1, {n}, {n}) with (B, H) = {bh}, "
                             f"got {tuple(m.shape)}")


def _check_qkv(q, k, v, masks, fn):
    _check_tensor(v, "v", fn, 4)
    _check_qk_masks(q, k, masks, v.shape[2:-1], fn, f"`v` of shape {tuple(v.shape)} has ")
    bh = tuple(v.shape[:2])
    named = [(f"{name}[{i}]", t) for i in range(len(q)) for name, t in (("q", q[i]), ("k", k[i]))]
    named += [(f"masks[{i}]", m) for i, m in enumerate(masks or ()) if m is not None]
    for name, t in named:  # leading dims broadcast against v's (B, H): size 1 or equal, at most two of them
        lead = tuple(t.shape[:-2])
        if len(lead) > 2 or any(a not in (1, c) for a, c in zip(lead[::-1], bh[::-1])):
            raise ValueError(f"{fn}: `{name}` must have leading dims broadcastable to (B, H) = {bh} of `v` (at most "
                             f"two, each 1 or equal), got shape {tuple(t.shape)}")
    if not torch.is_autocast_enabled(v.device.type):
        for i in range(len(q)):
            if q[i].dtype != k[i].dtype:
                raise TypeError(f"{fn}: `q[{i}]` ({q[i].dtype}) and `k[{i}]` ({k[i].dtype}) must share a dtype")


def kronecker_attention(
    q: Sequence[torch.Tensor],
    k: Sequence[torch.Tensor],
    v: torch.Tensor,
    *,
    combine: str = "product",
    kernel: str = "softmax",
    scale: float | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    feature_map: FeatureMap | None = None,
    dropout_p: float = 0.0,
    return_factors: bool = False,
    score_fn: Callable[..., torch.Tensor] | None = None,
):
    """Kronecker-structured high-order attention (HOT eqs 3-9; linear kernel: paper 002 eqs 10-12).

    Args:
        q, k: ``k`` pooled per-mode queries / keys ``(B, H, Ni, Dqk)``.
        v: values ``(B, H, N1..Nk, Dv)``.
        combine: ``"product"`` (``S_1 (x) .. (x) S_k``) or ``"sum"`` (``(1/k) S_1 (+) .. (+) S_k``).
        kernel: ``"softmax"`` or ``"linear"`` (``S_i = diag(A_i 1)^-1 A_i``, ``A_i = phi(q_i) phi(k_i)^T``; applied
            by associativity without forming ``S_i``, or formed when that is cheaper or the mode is masked).
        scale: softmax logit scale, keyword only; default ``Dqk ** -0.5``.
        masks: per mode ``None`` or bool ``(..., Ni, Ni)``, True = may attend (SDPA convention); any kernel (linear:
            masked entries of ``A_i`` are 0 before the row normalisation). A row with no allowed key gives zeros.
        feature_map: ``phi`` of the linear kernel (default ``elu(x) + 1``); it must return positive features.
        dropout_p: dropout on the factor matrices (softmax kernel).
        return_factors: also return the list of ``S_i`` (for the linear kernel the normalised ``A_i``).
        score_fn: optional signed score kernel ``(q_i, k_i) -> (B, H, Ni, Ni)`` used as the factor instead of the
            softmax (e.g. ``tanimoto_scores``); kernel must be ``"softmax"``.

    Returns:
        ``y (B, H, N1..Nk, Dv)`` or ``(y, factors)``. On the CPU a result that is not finite although ``q``, ``k``
        and ``v`` are (values too large for the dtype, e.g. ``q * 1e30``) raises a ``FloatingPointError`` naming the
        input (:func:`hoformer._checks.check_finite_result`), as every public attention function here does.
    """
    fn = "kronecker_attention"
    _check_qkv(q, k, v, masks, fn)
    check_kernel_args(fn, combine, kernel, scale, dropout_p, score_fn)
    if kernel == "linear":
        phi = feature_map or elu_feature_map
        feats = [(phi(qi), phi(ki)) for qi, ki in zip(q, k)]
        if feature_map is not None:  # negative features make the row normaliser cross 0: NaN / inf, silently
            check_values(torch.stack([torch.stack([fq.min(), fk.min()]) for fq, fk in feats]).min() >= 0,
                         f"{fn}: kernel='linear' needs finite `q` / `k` and a `feature_map` returning non-negative "
                         f"features (e.g. elu(x) + 1, FAVOR+){DETAIL}", lambda: _feature_problem(q, k, feats))
        out = _linear_attention(feats, v, combine, masks, return_factors)
    else:
        out = _kronecker_attention(q, k, v, combine, scale, masks, dropout_p, return_factors, score_fn)
    check_finite_result(out[0] if return_factors else out, fn, q=q, k=k, v=v)
    return out


def check_kernel_args(fn: str, combine, kernel, scale, dropout_p, score_fn) -> None:
    """The argument checks shared by :func:`kronecker_attention` and
    :func:`~hoformer.functional.causal_kronecker_attention`: ``combine``, ``kernel``, ``dropout_p``, ``scale`` and
    the combinations the linear kernel and signed score kernels cannot take (``fn`` names the caller)."""
    if combine not in ("product", "sum"):
        raise ValueError(f"{fn}: `combine` must be 'product' or 'sum', got {combine!r}")
    if kernel not in ("softmax", "linear"):
        raise ValueError(f"{fn}: `kernel` must be 'softmax' or 'linear', got {kernel!r}")
    check_fraction(fn, "dropout_p", dropout_p)
    check_scale(fn, scale)
    if score_fn is not None and scale is not None:
        raise ValueError(f"{fn}: `scale` has no effect with a signed `score_fn` (its scores are used as they are)")
    if kernel == "linear":
        if score_fn is not None:
            raise ValueError(f"{fn}: `score_fn` needs kernel='softmax' (the linear kernel's factors are "
                             f"row-normalised phi(q_i) phi(k_i)^T)")
        if scale is not None or dropout_p:
            raise ValueError(f"{fn}: `scale` and `dropout_p` apply to softmax factors only; kernel='linear' may "
                             f"apply S_i by associativity without forming it (got scale={scale}, "
                             f"dropout_p={dropout_p})")


def _kronecker_attention(q, k, v, combine: str, scale, masks, dropout_p: float, return_factors: bool, score_fn):
    """The softmax / signed-score path of :func:`kronecker_attention` without the argument checks (the linear kernel's
    unchecked entry is :func:`_linear_attention`, on features)."""
    factors = _mode_factors(q, k, scale, masks, score_fn)
    factors = [s.to(v.dtype) for s in factors]
    used = [dropout(s, p=dropout_p) for s in factors] if dropout_p > 0 else factors
    y = _kron_apply(used, v) if combine == "product" else _kron_sum_apply(used, v, normalize=True)
    return (y, factors) if return_factors else y


def _feature_problem(q, k, feats) -> str:
    """What made the linear kernel's feature check fail: a non-finite input, non-finite features or a negative one."""
    for i, (fq, fk) in enumerate(feats):
        for name, x, f in ((f"q[{i}]", q[i], fq), (f"k[{i}]", k[i], fk)):
            bad = ~torch.isfinite(x)
            if bad.any():
                nan = int(torch.isnan(x).sum())
                return (f"; got non-finite input `{name}` ({nan} NaN, {int(bad.sum()) - nan} inf of {x.numel()} "
                        f"values, shape {tuple(x.shape)})")
            if not torch.isfinite(f).all():
                return f"; `feature_map` returned non-finite features for the finite input `{name}`"
    lo = min(min(fq.min(), fk.min()) for fq, fk in feats).item()
    return f"; `feature_map` must return non-negative features, got a minimum of {lo:.3g}"


def linear_factor(fq: torch.Tensor, fk: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The linear kernel's factor ``S = diag(A 1)^-1 A`` with ``A = fq fk^T`` (entries where the bool ``mask`` is False
    set to 0 first), formed explicitly. A row without mass (a query whose keys are all masked, or all-zero features)
    is 0, with finite gradients, as in the associative :func:`_linear_op`."""
    fq, fk = _rescaled(fq, fk)
    a = torch.matmul(fq, fk.transpose(-1, -2))
    if mask is not None:
        a = a.masked_fill(~mask, 0.0)
    return a / _safe_denominator(a.sum(-1, keepdim=True))


def _rescaled(fq: torch.Tensor, fk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fq / max_f fq`` per query and ``fk / max fk`` per (batch, head): factors common to a row of ``S`` (they cancel
    in its normalisation; detached, so gradients are unchanged) that keep small features off the subnormal numbers,
    whose sums and reciprocals lose precision or overflow."""
    cq = fq.detach().amax(-1, keepdim=True)
    ck = fk.detach().amax((-2, -1), keepdim=True)
    return fq / _safe_denominator(cq), fk / _safe_denominator(ck)


def _safe_denominator(s: torch.Tensor) -> torch.Tensor:
    """Non-negative ``s`` with its zeros replaced by 1 (the rows they normalise are 0). Not a clamp at the dtype's
    smallest normal number: FAVOR+ row sums are often below fp16's (6e-5), and ``g / tiny`` overflows in backward."""
    return torch.where(s > 0, s, torch.ones_like(s))


def forms_linear_factor(n: int, f: int, p: int) -> bool:
    """The linear kernel's route for an unmasked mode of size ``n``: whether forming its factor ``S (n, n)`` and
    applying it to ``p`` columns (``2 n^2 (f + p)`` flops: ``fq fk^T``, then ``S X``) costs no more than applying it
    by associativity (``4 n f p``: ``fk^T X``, then ``fq (.)``), for ``f`` features. HOT's modes are short (``n``
    below ``2 f`` or so), so usually it does."""
    return n * (f + p) <= 2 * f * p


def _linear_attention(feats, v: torch.Tensor, combine: str, masks, return_factors: bool):
    """The linear kernel (paper 002 eqs 10-12) on features ``feats[i] = (phi(q_i), phi(k_i))`` ``(B, H, Ni, F)``.

    Per mode, ``S_i = diag(A_i 1)^-1 A_i`` with ``A_i = phi(q_i) phi(k_i)^T`` (masked entries of ``A_i`` set to 0) is
    applied either by associativity, ``phi(q_i) (phi(k_i)^T X)`` (:func:`_linear_op`, cost linear in ``Ni``), or
    formed explicitly (:func:`linear_factor`) when it is cheaper (:func:`forms_linear_factor`) or masked (a mask is
    not a low-rank operator). When every factor is explicit, the cache-blocked :func:`kron_apply` /
    :func:`kron_sum_apply` apply them, as for the softmax kernel; under ``torch.compile`` plain matmuls do, so the
    kernel stays traceable. Both routes compute the same operator.
    """
    b, h, sizes = v.shape[0], v.shape[1], v.shape[2:-1]
    total = v[0, 0].numel()
    masks = [None] * len(sizes) if masks is None else list(masks)
    # in v's dtype (autocast off: its casts would undo this choice), but fp16 runs in float32: its range ends at 6e-5
    # (normal) / 6e-8 (subnormal), where FAVOR+ row sums and products often are; bf16 has float32's range
    dtype = torch.float32 if v.dtype == torch.float16 else v.dtype
    with torch.autocast(v.device.type, enabled=False):
        va = v.to(dtype)
        feats = [(fq.to(dtype), fk.to(dtype)) for fq, fk in feats]
        explicit = [m is not None or forms_linear_factor(n, fq.shape[-1], total // n)
                    for (fq, _), m, n in zip(feats, masks, sizes)]
        factors = [linear_factor(fq, fk, m) if e or return_factors else None
                   for (fq, fk), m, e in zip(feats, masks, explicit)]
        if all(explicit) and not torch.compiler.is_compiling():
            y = _kron_apply(factors, va) if combine == "product" else _kron_sum_apply(factors, va, normalize=True)
        else:
            ops = [_matrix_op(s, b, h) if e else _linear_op(fq, fk, b, h)
                   for (fq, fk), s, e in zip(feats, factors, explicit)]
            y = _kron_apply_ops(ops, va.movedim(-1, 2), sizes) if combine == "product" else _kron_sum_ops(ops, va)
    y = y.to(v.dtype)
    return (y, [f.to(v.dtype) for f in factors]) if return_factors else y


def _matrix_op(s: torch.Tensor, b: int, h: int) -> Callable:
    """``X (bh, P, n) -> S X^T`` for an explicit factor ``s (B|1, H|1, n, n)``."""
    s = _flat_factor(s, b, h)
    return lambda x: torch.matmul(s, x.transpose(1, 2))


def _linear_op(fq: torch.Tensor, fk: torch.Tensor, b: int, h: int) -> Callable:
    """``X (bh, P, n) -> S X^T`` with ``S = diag(fq fk^T 1)^-1 fq fk^T``, never forming ``S`` (cost O(n f P))."""
    fq, fk = _rescaled(fq, fk)
    fq, fk = _flat_factor(fq, b, h), _flat_factor(fk, b, h)  # (bh, n, f)
    denom = _safe_denominator(torch.matmul(fq, fk.sum(dim=1, keepdim=True).transpose(1, 2)))  # (bh, n, 1)

    def op(x: torch.Tensor) -> torch.Tensor:
        kv = torch.matmul(fk.transpose(1, 2), x.transpose(1, 2))  # (bh, f, P)
        return torch.matmul(fq, kv) / denom  # a division: the reciprocal of a tiny sum can overflow

    return op


# ------------------------------------------------------------------------------------- dense references
def kron_dense(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dense ``S_1 (x) ... (x) S_k`` batched over leading dims (reference / analysis only: O(prod(N)^2))."""
    out = factors[0]
    for s in factors[1:]:
        lead = torch.broadcast_shapes(out.shape[:-2], s.shape[:-2])
        a, c = out.expand(*lead, *out.shape[-2:]), s.expand(*lead, *s.shape[-2:])
        out = (a[..., :, None, :, None] * c[..., None, :, None, :]).reshape(
            *lead, a.shape[-2] * c.shape[-2], a.shape[-1] * c.shape[-1]
        )
    return out


def kron_sum_dense(factors: Sequence[torch.Tensor], normalize: bool = False) -> torch.Tensor:
    """Dense Kronecker sum ``sum_m I (x) .. (x) S_m (x) .. (x) I`` (times ``1/k`` if ``normalize``)."""
    sizes = [s.shape[-1] for s in factors]
    total = None
    for m, s in enumerate(factors):
        parts = [torch.eye(n, dtype=s.dtype, device=s.device) for n in sizes]
        parts[m] = s
        term = kron_dense(parts)
        total = term if total is None else total + term
    return total / len(factors) if normalize else total
