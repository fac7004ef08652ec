"""Attention score kernels: scaled dot product, Tanimoto (valence) and cosine.

Weaver (paper 003) eq 29 / 47: the continuous Tanimoto coefficient
    T(q, k) = q.k / (|q|^2 + |k|^2 - q.k + eps),   values in [-1/3, 1],
equal to 1 for q = k and -1/3 for q = -k; eq 69: cosine similarity. Unlike softmax scores these are signed
and are used *as* attention weights (no softmax), so attention can subtract messages.

Axes: ``q (..., N, D)``, ``k (..., M, D)`` -> scores ``(..., N, M)``.
"""
from __future__ import annotations

import torch

from hoformer._checks import check_scale

__all__ = ["dot_scores", "tanimoto_scores", "cosine_scores", "get_score_fn", "SCORE_FNS", "masked_softmax"]


def _check_qk(q: torch.Tensor, k: torch.Tensor, fn: str) -> None:
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{fn}: `{name}` must be floating point, got dtype {t.dtype}")
        if t.ndim < 2:
            raise ValueError(f"{fn}: `{name}` must have shape (..., N, D), got {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: feature sizes differ: q {tuple(q.shape)} vs k {tuple(k.shape)} (last dim)")


# The public functions check their inputs and call the unchecked ``_dot`` / ``_tanimoto`` / ``_cosine``, which the
# layers call directly (they have checked their own inputs once).
def dot_scores(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """Scaled dot-product logits ``q k^T * scale`` (scale default ``D ** -0.5``)."""
    _check_qk(q, k, "dot_scores")
    check_scale("dot_scores", scale)
    return _dot(q, k, scale)


def _dot(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.matmul(q, k.transpose(-1, -2)) * scale


def tanimoto_scores(q: torch.Tensor, k: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Continuous Tanimoto coefficient (Weaver eq 29/47), in ``[-1/3, 1]``."""
    _check_qk(q, k, "tanimoto_scores")
    return _tanimoto(q, k, eps)


def _tanimoto(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    qk = torch.matmul(q, k.transpose(-1, -2))
    qq = q.pow(2).sum(-1, keepdim=True)  # (..., N, 1)
    kk = k.pow(2).sum(-1).unsqueeze(-2)  # (..., 1, M)
    return qk / (qq + kk - qk + eps)


def cosine_scores(q: torch.Tensor, k: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Cosine similarity (Weaver eq 69), in ``[-1, 1]``."""
    _check_qk(q, k, "cosine_scores")
    return _cosine(q, k, eps)


def _cosine(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    qn = q / q.norm(dim=-1, keepdim=True).clamp_min(eps)
    kn = k / k.norm(dim=-1, keepdim=True).clamp_min(eps)
    return torch.matmul(qn, kn.transpose(-1, -2))


SCORE_FNS = {"tanimoto": tanimoto_scores, "cosine": cosine_scores}
_SCORE_KERNELS = {"tanimoto": _tanimoto, "cosine": _cosine}  # unchecked, for layers that checked their input


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """``softmax(logits)`` over ``dim`` where only entries with ``mask`` True (broadcastable bool, SDPA convention)
    may receive weight: masked entries are exactly 0 and a row with no allowed entry is all zeros (never NaN, never
    uniform). The one masking rule of every explicit attention map in hoformer (Kronecker factors, dense and axial
    maps, triplet cubes, block-local and cross-block maps). The library's own callers, whose masks were checked at
    their entry, use the unchecked :func:`_masked_softmax`."""
    _check_mask(mask, logits)
    return _masked_softmax(logits, mask, dim)


def _check_mask(mask, logits: torch.Tensor) -> None:
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
        raise TypeError(f"masked_softmax: `mask` must be a bool tensor broadcastable to `logits` "
                        f"{tuple(logits.shape)} (True = may attend), got "
                        f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")


def _masked_softmax(logits: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """:func:`masked_softmax` without the mask check."""
    if mask is None:
        return logits.softmax(dim)
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min).softmax(dim) * mask


def get_score_fn(name: str):
    if name not in SCORE_FNS:
        raise ValueError(f"unknown signed score kernel {name!r}; expected one of {sorted(SCORE_FNS)}")
    return SCORE_FNS[name]
