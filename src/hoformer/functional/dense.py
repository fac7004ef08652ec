"""Full (non-factorized) high-order attention (HOT, paper 000 eqs 1-2): the baseline the Kronecker factorizations
of :mod:`hoformer.functional.kronecker` approximate.

Axis legend
-----------
``b``  batch, ``h`` heads, ``n1..nk`` the k tensor modes, ``n = n1 * ... * nk`` the flattened tokens, ``d``
per-head features.

For ``q, k (b, h, n1..nk, d)`` and ``v (b, h, n1..nk, dv)`` the modes are flattened in row-major order (mode 1
slowest) and attention is one ``n x n`` softmax (eq 1: ``S = softmax(Q K^T / sqrt(d))``, eq 2: ``y = S V``), run by
PyTorch's SDPA through :func:`sdpa`, which also gives a row whose mask allows no key zeros, the masking rule of the
Kronecker path.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hoformer._checks import check_finite_result, check_fraction, check_scale

from .products import _check_tensor

__all__ = ["full_attention"]


def full_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Non-factorized high-order attention (HOT eqs 1-2): flatten the modes and run SDPA.

    ``q, k (B, H, N1..Nk, Dqk)``, ``v (B, H, N1..Nk, Dv)``, ``mask`` bool ``(..., prod N, prod N)`` True = attend.
    """
    fn = "full_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, name, fn, 4)
    if q.shape[:-1] != k.shape[:-1] or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"{fn}: `q`, `k`, `v` must share (B, H, N1..Nk), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_fraction(fn, "dropout_p", dropout_p)
    check_scale(fn, scale)
    b, h = v.shape[:2]
    sizes = v.shape[2:-1]
    n = math.prod(sizes)
    if mask is not None and (mask.dtype != torch.bool or mask.shape[-2:] != (n, n)):
        raise ValueError(f"{fn}: `mask` must be bool (..., {n}, {n}), got {mask.dtype} {tuple(mask.shape)}")
    y = sdpa(q.reshape(b, h, n, -1), k.reshape(b, h, n, -1), v.reshape(b, h, n, -1), mask=mask, scale=scale,
             dropout_p=dropout_p)
    check_finite_result(y, fn, q=q, k=k, v=v)
    return y.view(b, h, *sizes, -1)


def sdpa(q, k, v, *, mask=None, scale=None, dropout_p=0.0) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` over the second-to-last dim (unchecked), with hoformer's masking rule: a
    row whose ``mask`` allows no key gives zeros (some SDPA kernels and torch versions give NaN there), as in the
    Kronecker path.

    ``q (.., Lq, E)``, ``k (.., Lk, E)``, ``v (.., Lk, Ev)`` share their batch dims ``..``; ``mask`` bool broadcastable
    to ``(.., Lq, Lk)``. More than two batch dims are folded into SDPA's ``(B, H, L, E)`` and unfolded in the result:
    the fused kernels take 4-D inputs only, and Inductor's attention-fusion patterns (torch 2.13) match a permuted
    input of any rank as if it were the 4-D ``(0, 2, 1, 3)`` one, so an axial (5-D) call compiled to wrong output."""
    lead = q.shape[:-3]
    if len(lead) > 1:
        q, k, v = (t.flatten(0, -4) for t in (q, k, v))
        if mask is not None:
            mask = mask[(None,) * (len(lead) + 3 - mask.ndim)]
            mask = mask.expand(*lead, *mask.shape[-3:]).flatten(0, -4)  # a view where the folded dims broadcast
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if mask is not None:
        y = y.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return y.unflatten(0, lead) if len(lead) > 1 else y
