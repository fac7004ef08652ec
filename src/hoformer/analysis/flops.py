"""Analytic FLOP counts of every attention type (HOT paper 000 section 5.5 / Fig 6; HOBA 004 section 3; Weaver 003
eqs 55-57), counted like :class:`torch.utils.flop_counter.FlopCounterMode`: ``2 m n k`` per ``(m, k) @ (k, n)``
matmul, only matmuls (softmax, norms, pooling and element-wise products are lower order and not counted).

Axis legend: ``b`` batch, ``h`` heads, ``e`` head dim, ``d`` model dim, ``N = prod(N_i)`` tokens, ``k`` modes.

=====================  ===========================================================================================
attention              matmul FLOPs of one layer (``inner = h e``), projections excluded
=====================  ===========================================================================================
kronecker product/sum  scores ``2 b h e sum N_i^2`` + apply ``2 b h e N sum N_i`` (HOT eqs 8-9: ``O(N sum N_i)``)
kronecker linear       ``phi``: ``4 b h e f sum N_i``; per mode, as the kernel routes it (no masks): formed
                       ``S_i``: ``2 b h f N_i^2`` + apply ``2 b h e N N_i``, or by associativity: normaliser
                       ``2 b h f N_i`` + apply ``4 b h e f N``
full                   ``4 b h e N^2``
axial (sum)            ``4 b h e N sum N_i``
divided (TimeSformer)  ``4 b h e N (N_1 + N / N_1)``
triplet / HOBA         ``4 b h e W s^3`` (``W`` windows of size ``s``) + cross-block ``4 b h e M^2``
block 2D               ``4 b h e W s^2`` (+ cross-block); full 2D ``4 b h e L^2``
weaver P^2-KMV         valence maps ``2 b h e (P^2 + N^2)`` + ``(Theta_T (x) Theta_S) vec(u)``: ``2 b h e P N (P + N)``
=====================  ===========================================================================================

Projections (``projections=True``): the layer's linear maps exactly as :mod:`hoformer.layers` implements them
(Kronecker: per-mode ``q, k`` from pooled inputs ``4 b d inner sum N_i``, values and output ``4 b N d inner``;
dense baselines: ``qkv`` + output ``8 b N d inner``).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from hoformer.functional.kronecker import forms_linear_factor

__all__ = ["ATTENTION_FLOP_KINDS", "attention_flops", "hot_model_flops", "count_flops", "count_executed_flops",
           "favor_num_features"]

ATTENTION_FLOP_KINDS = (
    "kronecker_product", "kronecker_sum", "kronecker_linear", "kronecker_tanimoto", "kronecker_cosine", "full",
    "axial", "axial_sequential", "divided", "triplet", "hoba", "block2d", "full2d", "weaver_p2kmv",
)


def favor_num_features(dim_head: int) -> int:
    """Default FAVOR+ feature count of :class:`hoformer.layers.FavorFeatures` (``max(e, int(e ln e))``)."""
    return max(dim_head, int(dim_head * math.log(dim_head)))


def _windows(L: int, block_size: int, overlap: float) -> tuple[int, int]:
    """(windows, window size) of the HOBA layers on length ``L``: the fixed grid they pad to."""
    from hoformer.functional.triplet import triplet_grid_length, triplet_windows

    g = triplet_grid_length(L, block_size, overlap)
    return len(triplet_windows(g, block_size, overlap)), min(block_size, g)


def attention_flops(kind: str, sizes: Sequence[int], dim: int, num_heads: int = 8, *, dim_head: int | None = None,
                    batch: int = 1, projections: bool = True, num_features: int | None = None,
                    block_size: int | None = 32, overlap: float = 0.25, cross_block: bool = True,
                    first_mode: int = 0) -> dict[str, int]:
    """Matmul FLOPs of one forward pass of attention layer ``kind`` on ``(batch, *sizes, dim)``.

    Args:
        kind: one of :data:`ATTENTION_FLOP_KINDS`; ``triplet`` / ``hoba`` / ``block2d`` / ``full2d`` take ``sizes =
            (L,)``; ``weaver_p2kmv`` takes ``(P, N)`` (its projections: pooled ``q, k`` and the GLU mix).
        sizes: mode sizes ``(N_1, .., N_k)``.
        dim, num_heads, dim_head: model width, heads, head dim (default ``dim // num_heads``).
        num_features: FAVOR+ features of ``kronecker_linear`` (default :func:`favor_num_features`).
        block_size, overlap, cross_block: HOBA windows (``hoba``: cross-block on; ``triplet``: as given).

    Returns:
        ``{"projections", "scores", "apply", "total"}`` (ints; ``scores`` builds the maps, ``apply`` uses them).
    """
    if kind not in ATTENTION_FLOP_KINDS:
        raise ValueError(f"attention_flops: `kind` must be one of {ATTENTION_FLOP_KINDS}, got {kind!r}")
    sizes = tuple(int(s) for s in (sizes if isinstance(sizes, (tuple, list)) else (sizes,)))
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"attention_flops: `sizes` must be positive mode sizes, got {sizes!r}")
    if dim_head is None and dim % num_heads:
        raise ValueError(f"attention_flops: dim={dim} is not divisible by num_heads={num_heads}")
    b, h, d = batch, num_heads, dim
    e = dim_head or dim // num_heads
    inner = h * e
    n, k, sn, sn2 = math.prod(sizes), len(sizes), sum(sizes), sum(s * s for s in sizes)
    qkv_out = 8 * b * n * d * inner  # fused qkv (3 inner) + output projection
    proj = scores = apply = 0
    if kind in ("kronecker_product", "kronecker_sum", "kronecker_tanimoto", "kronecker_cosine"):
        proj = 4 * b * sn * d * inner + 4 * b * n * d * inner
        scores = 2 * b * h * e * sn2
        apply = 2 * b * h * e * n * sn
    elif kind == "kronecker_linear":
        f = num_features or favor_num_features(e)
        proj = 4 * b * sn * d * inner + 4 * b * n * d * inner
        scores = 4 * b * h * e * f * sn  # phi(q), phi(k)
        for ni in sizes:
            if forms_linear_factor(ni, f, n * e // ni):
                scores += 2 * b * h * f * ni * ni  # A_i = phi(q_i) phi(k_i)^T
                apply += 2 * b * h * e * n * ni
            else:
                scores += 2 * b * h * f * ni  # normaliser phi(q_i) (phi(k_i)^T 1)
                apply += 4 * b * h * e * f * n  # phi(q_i) (phi(k_i)^T X)
    elif kind == "full":
        proj, scores, apply = qkv_out, 2 * b * h * e * n * n, 2 * b * h * e * n * n
    elif kind in ("axial", "axial_sequential"):
        proj = qkv_out + (6 * b * n * d * inner * (k - 1) if kind == "axial_sequential" else 0)
        scores = apply = 2 * b * h * e * n * sn
    elif kind == "divided":
        if first_mode >= k:
            raise ValueError(f"attention_flops: first_mode={first_mode} but sizes {sizes} have {k} modes")
        n1 = sizes[first_mode]
        proj = 2 * qkv_out if k > 1 else qkv_out
        scores = apply = 2 * b * h * e * n * (n1 + (n // n1 if k > 1 else 0))
    elif kind in ("triplet", "hoba", "block2d", "full2d"):
        if k != 1:
            raise ValueError(f"attention_flops: {kind} takes one sequence length sizes=(L,), got {sizes}")
        L = sizes[0]
        cross = cross_block and kind != "full2d" and block_size is not None
        bs = L if (block_size is None or kind == "full2d") else block_size
        w, s = _windows(L, bs, overlap if bs < L else 0.0)
        npj = 5 if kind in ("triplet", "hoba") else 3
        proj = 2 * b * L * d * npj * inner + 2 * b * L * inner * d
        if kind in ("triplet", "hoba"):
            scores = apply = 2 * b * h * e * w * s**3
        else:
            scores = apply = 2 * b * h * e * w * s * s
        if cross:
            m = -(-L // bs)
            scores += 2 * b * h * e * m * m
            apply += 2 * b * h * e * m * m
    elif kind == "weaver_p2kmv":
        if k != 2:
            raise ValueError(f"attention_flops: weaver_p2kmv takes sizes=(P, N), got {sizes}")
        p, nn_ = sizes
        proj = 4 * b * (p + nn_) * d * d + 4 * b * p * nn_ * d * d  # pooled q/k (eq 50) + GLU mix (eq 58)
        scores = 2 * b * h * e * (p * p + nn_ * nn_)
        apply = 2 * b * h * e * p * nn_ * (p + nn_)
    proj = proj if projections else 0
    return {"projections": proj, "scores": scores, "apply": apply, "total": proj + scores + apply}


def hot_model_flops(attention: str, input_size: int | Sequence[int], *, patch_size: int = 4, in_channels: int = 1,
                    dim: int = 128, depth: int = 6, num_heads: int = 8, mlp_ratio: float = 4.0,
                    num_classes: int = 2) -> int:
    """Forward matmul/conv FLOPs of one sample of ``hot_volume_classifier`` (HOT Fig 6's 3D inputs): patch
    embedding ``2 N p^3 C d`` + ``depth`` x (attention + MLP ``4 N d hidden``) + linear head."""
    sizes = (input_size,) * 3 if isinstance(input_size, int) else tuple(input_size)
    grid = tuple(s // patch_size for s in sizes)
    n = math.prod(grid)
    hidden = int(dim * mlp_ratio)
    embed = 2 * n * patch_size**3 * in_channels * dim
    block = attention_flops(attention, grid, dim, num_heads)["total"] + 4 * n * dim * hidden
    return embed + depth * block + 2 * dim * num_classes


def count_flops(fn: Callable, *args, **kwargs) -> int:
    """FLOPs of the forward ``fn(*args, **kwargs)``, run under ``no_grad`` (see :func:`count_executed_flops`)."""
    with torch.no_grad():
        return count_executed_flops(fn, *args, **kwargs)


def count_executed_flops(fn: Callable, *args, **kwargs) -> int:
    """FLOPs that ``fn(*args, **kwargs)`` executes as called (e.g. a forward + backward, recomputation included),
    measured by :class:`~torch.utils.flop_counter.FlopCounterMode` with SDPA forced to its math backend so that
    attention matmuls are visible on every device (the counter has no formula for the CPU SDPA kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        fn(*args, **kwargs)
    return int(fc.get_total_flops())
