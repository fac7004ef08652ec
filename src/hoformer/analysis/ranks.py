"""Stable ranks of attention matrices (HOT paper 000, section 4.2, eqs 10-12), batched over leading dims.

* :func:`stable_rank` - eq 10, ``sr(A) = |A|_F^2 / |A|_2^2`` of dense matrices.
* :func:`kron_product_stable_rank` - eq 11, exact: ``sr(S_1 (x) .. (x) S_k) = prod_i sr(S_i)``.
* :func:`kron_sum_stable_rank` - the Kronecker sum ``M = S_1 (+) .. (+) S_k``. The numerator of eq 12
  (``|M|_F^2``) is exact; its denominator ``(sum_i |S_i|_2)^2`` only *bounds* ``|M|_2^2`` from above, so eq 12 is a
  lower bound on the stable rank. By default the spectral norm is computed matrix-free with Lanczos on
  ``M^T M`` (mat-vecs are :func:`~hoformer.functional.kron_sum_apply` with the factors and their transposes), which
  matches a dense SVD to ~1e-6 relative; ``method="bound"`` returns the paper's closed form.

Factors are ``(..., Ni, Ni)`` with identical leading dims (e.g. ``(B, H)``); the result has those leading dims.
The ``1/k`` normalisation of HOT's sum does not change a stable rank (it is scale invariant).
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

from hoformer.functional import kron_sum_apply

__all__ = ["stable_rank", "kron_product_stable_rank", "kron_sum_stable_rank", "kron_sum_fro_sq", "kron_sum_spectral_norm"]


def _check_factors(factors, fn: str) -> list[torch.Tensor]:
    if isinstance(factors, torch.Tensor) or not isinstance(factors, Sequence) or not factors:
        raise TypeError(f"{fn}: `factors` must be a non-empty list of (..., Ni, Ni) tensors")
    lead = factors[0].shape[:-2]
    for i, s in enumerate(factors):
        if not isinstance(s, torch.Tensor) or not s.is_floating_point():
            raise TypeError(f"{fn}: `factors[{i}]` must be a floating-point tensor, got {type(s).__name__}")
        if s.ndim < 2 or s.shape[-1] != s.shape[-2]:
            raise ValueError(f"{fn}: `factors[{i}]` must be square (..., Ni, Ni), got {tuple(s.shape)}")
        if s.shape[:-2] != lead:
            raise ValueError(f"{fn}: `factors[{i}]` leading dims {tuple(s.shape[:-2])} differ from {tuple(lead)}")
    dtype = functools.reduce(torch.promote_types, [s.dtype for s in factors], torch.float32)
    return [s.to(dtype) for s in factors]


def _working_precision(a: torch.Tensor) -> torch.Tensor:
    """Maps recorded under bf16 / fp16 autocast arrive in low precision; norms and SVDs run in (at least) float32,
    and the results stay there (a stable rank in bf16 has 2-3 significant digits)."""
    return a.to(torch.promote_types(a.dtype, torch.float32))


def stable_rank(a: torch.Tensor) -> torch.Tensor:
    """Eq 10: ``|A|_F^2 / |A|_2^2`` for ``a (..., n, m)``; bf16 / fp16 input is computed and returned in float32
    (as are the Kronecker variants below)."""
    if not isinstance(a, torch.Tensor) or a.ndim < 2 or not a.is_floating_point():
        raise ValueError(f"stable_rank: `a` must be a floating tensor (..., n, m), got {getattr(a, 'shape', type(a))}")
    a = _working_precision(a)
    fro = a.pow(2).sum((-1, -2))
    spec = torch.linalg.matrix_norm(a, ord=2)
    return fro / spec.pow(2)


def kron_product_stable_rank(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Eq 11 (exact): ``sr(S_1 (x) .. (x) S_k) = prod_i sr(S_i)``."""
    factors = _check_factors(factors, "kron_product_stable_rank")
    out = stable_rank(factors[0])
    for s in factors[1:]:
        out = out * stable_rank(s)
    return out


def kron_sum_fro_sq(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exact ``|S_1 (+) .. (+) S_k|_F^2`` (eq 12 numerator):
    ``sum_i (prod_{j!=i} n_j) |S_i|_F^2 + sum_{i!=l} (prod_{j!=i,l} n_j) tr(S_i) tr(S_l)``."""
    factors = _check_factors(factors, "kron_sum_fro_sq")
    sizes = [s.shape[-1] for s in factors]
    total = math.prod(sizes)
    fro = [s.pow(2).sum((-1, -2)) for s in factors]
    tr = [s.diagonal(dim1=-2, dim2=-1).sum(-1) for s in factors]
    out = sum(fro[i] * (total // sizes[i]) for i in range(len(factors)))
    for i in range(len(factors)):
        for l in range(len(factors)):
            if i != l:
                out = out + tr[i] * tr[l] * (total // (sizes[i] * sizes[l]))
    return out


def kron_sum_spectral_norm(factors: Sequence[torch.Tensor], iters: int = 64, seed: int = 0) -> torch.Tensor:
    """``|S_1 (+) .. (+) S_k|_2`` by Lanczos (full re-orthogonalisation) on ``M^T M``, never forming ``M``.

    Exact (up to rounding) once ``iters >= prod(N)``; converges far sooner for the extreme eigenvalue.
    """
    factors = _check_factors(factors, "kron_sum_spectral_norm")
    lead = factors[0].shape[:-2]
    sizes = [s.shape[-1] for s in factors]
    n = math.prod(sizes)
    dtype = factors[0].dtype
    fs = [s.reshape(-1, 1, *s.shape[-2:]) for s in factors]  # (L, 1, Ni, Ni) as (B, H)
    ft = [s.transpose(-1, -2) for s in fs]
    nb = fs[0].shape[0]

    def matvec(x: torch.Tensor) -> torch.Tensor:  # x (L, n) -> M^T M x
        v = x.view(nb, 1, *sizes, 1)
        return kron_sum_apply(ft, kron_sum_apply(fs, v, normalize=False), normalize=False).reshape(nb, n)

    m = min(iters, n)
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(nb, n, generator=g, dtype=dtype).to(fs[0].device)
    q = q / q.norm(dim=-1, keepdim=True)
    basis = [q]  # a list, stacked per iteration: the function stays differentiable (no in-place writes)
    alphas, betas = [], []
    for j in range(m):
        w = matvec(basis[-1])
        alphas.append((w * basis[-1]).sum(-1))
        qmat = torch.stack(basis, dim=-1)  # (L, n, j+1)
        for _ in range(2):  # classical Gram-Schmidt, twice
            w = w - torch.einsum("lnj,lj->ln", qmat, torch.einsum("lnj,ln->lj", qmat, w))
        if j == m - 1:
            break
        beta = w.norm(dim=-1)
        scale = torch.linalg.vector_norm(torch.stack(alphas, -1), dim=-1).clamp_min(torch.finfo(dtype).tiny)
        ok = beta > 1e-12 * scale  # breakdown: invariant subspace found, continue with zeros
        betas.append(torch.where(ok, beta, torch.zeros_like(beta)))
        basis.append(torch.where(ok[:, None], w / beta.clamp_min(torch.finfo(dtype).tiny)[:, None], torch.zeros_like(w)))
    t = torch.diag_embed(torch.stack(alphas, -1))
    if betas:
        b = torch.stack(betas, -1)
        t = t + torch.diag_embed(b, 1) + torch.diag_embed(b, -1)
    lam = torch.linalg.eigvalsh(t)[..., -1].clamp_min(0)
    return lam.sqrt().reshape(lead)


def kron_sum_stable_rank(factors: Sequence[torch.Tensor], method: str = "exact", iters: int = 64) -> torch.Tensor:
    """Stable rank of the Kronecker sum ``S_1 (+) .. (+) S_k``.

    ``method="exact"``: ``|M|_F^2 / |M|_2^2`` with the Lanczos spectral norm (matches dense SVD).
    ``method="bound"``: the paper's eq 12, ``|M|_F^2 / (sum_i |S_i|_2)^2``, a *lower bound* on the stable rank.
    """
    if method not in ("exact", "bound"):
        raise ValueError(f"kron_sum_stable_rank: `method` must be 'exact' or 'bound', got {method!r}")
    factors = _check_factors(factors, "kron_sum_stable_rank")
    fro = kron_sum_fro_sq(factors)
    if method == "bound":
        denom = sum(torch.linalg.matrix_norm(s, ord=2) for s in factors).pow(2)
    else:
        denom = kron_sum_spectral_norm(factors, iters=iters).pow(2)
    return fro / denom
