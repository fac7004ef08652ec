"""HOT's Kronecker attention layer (paper 000 eqs 3-9; FAVOR+ linear kernel: paper 002 eqs 10-12), causal along a
mode and decoding incrementally when built with ``causal_mode`` (:mod:`hoformer.functional.causal`).

Axis legend: ``b`` batch, ``h`` heads, ``n1..nk`` modes, ``t`` the causal mode, ``d`` model dim, ``e`` per-head dim,
``f`` random features.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from hoformer._checks import check_int
from hoformer.functional import unchecked
from hoformer.functional.causal import causal_row

from ._common import (
    _CheckOnce,
    _check_causal_mode,
    _check_layer_args,
    _mode_tuple,
)
from .decoding import DecodingCache, _Decoder, _step_entry
from .pos import RotaryEmbedding
from .recording import RecordableAttention
from .dropout import Dropout

__all__ = ["FavorFeatures", "KroneckerAttention", "mode_pools"]


# --------------------------------------------------------------------------------------------- FAVOR+
class FavorFeatures(nn.Module):
    """Positive orthogonal random features of FAVOR+ (Performer "SMReg" softmax kernel).

    ``phi(x) = exp(w^T x' - |x'|^2 / 2 - c) / sqrt(m)`` with ``x' = x * d^-1/4`` and orthogonal Gaussian ``w``, so
    ``E[phi(q) phi(k)^T] ~ exp(q.k / sqrt(d))``. The projection is a buffer (checkpoints reproduce); call
    :meth:`redraw` (done automatically every ``redraw_interval`` training forwards when > 0).
    ``c`` is a stabiliser against overflow: the per-row max for queries, the max over all keys of a (batch, head) for
    keys. The ``1e-6`` floor of Performer's features is scaled by ``exp(-c)`` as well, so ``c`` is an exact common
    factor that cancels in the row normalisation. The shared key stabiliser couples keys through underflow (a key
    whose projection exceeds the others' by ~90 in float32 flushes their features to 0), which is harmless when every
    query sees every key but not along a causal mode, where a future key must not touch the past:
    :meth:`with_log_scale` stabilises each row by its own maximum and returns ``c`` alongside, so that
    :func:`~hoformer.functional.causal.causal_linear_factor` rescales the keys per query row, by the largest key
    scale up to that row only.
    """

    def __init__(self, dim: int, num_features: int | None = None, redraw_interval: int = 0) -> None:
        super().__init__()
        check_int("FavorFeatures", "num_features", num_features, optional=True)
        self.dim = dim
        self.num_features = max(dim, int(dim * math.log(dim))) if num_features is None else num_features
        self.redraw_interval = redraw_interval
        self.register_buffer("projection", self._draw(), persistent=True)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=True)
        self._calls: int | None = None  # host mirror of `calls` (read once after construction / loading)

    def _draw(self, device=None) -> torch.Tensor:
        d, m = self.dim, self.num_features
        blocks = []
        for _ in range(math.ceil(m / d)):
            g = torch.randn(d, d, device=device)
            q, _ = torch.linalg.qr(g)
            blocks.append(q.T)
        w = torch.cat(blocks, 0)[:m]
        norms = torch.randn(m, d, device=device).norm(dim=1)  # chi-distributed row norms
        return w * norms[:, None]

    @torch.no_grad()
    def redraw(self) -> None:
        self.projection.copy_(self._draw(self.projection.device))

    def step(self) -> None:
        """Count a training forward and redraw every ``redraw_interval`` of them. The count lives in the ``calls``
        buffer (so checkpoints resume the schedule) and in a host mirror, so a GPU step never waits on a
        device-to-host copy (one read after construction or ``load_state_dict``)."""
        if self.training and self.redraw_interval > 0:
            if self._calls is None:
                self._calls = int(self.calls)
            if self._calls > 0 and self._calls % self.redraw_interval == 0:
                self.redraw()
            self._calls += 1
            self.calls.fill_(self._calls)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._calls = None

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        """``phi(x) (.., n, f)`` of ``x (.., n, E)``: stabilised per row (queries) or over the last two dims (keys)."""
        return self._features(x, (-1,) if is_query else (-1, -2))[0]

    def with_log_scale(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(phi, c)``: the features of ``x (.., n, E)`` with every row stabilised by its own maximum, and that
        stabiliser ``c (.., n, 1)`` (detached): ``phi * exp(c)`` is the unstabilised feature. No row depends on
        another (the causal mode's keys, :func:`~hoformer.functional.causal.causal_linear_factor`)."""
        return self._features(x, (-1,))

    def _features(self, x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        xs = x * self.dim ** -0.25
        proj = torch.matmul(xs, self.projection.to(x.dtype).T)  # (.., n, f)
        sq = xs.pow(2).sum(-1, keepdim=True) / 2
        # guards exp(proj) against overflow; >= 0 so exp(-stab) cannot overflow
        stab = proj.amax(dim=dims, keepdim=True).detach().clamp_min(0.0)
        phi = (torch.exp(proj - sq - stab) + 1e-6 * torch.exp(-stab)) / math.sqrt(self.num_features)
        return phi, stab


# ----------------------------------------------------------------------------------------- Kronecker
class _ModePools(torch.autograd.Function):
    """All ``k`` mode poolings of ``x (b, n1..nk, e)`` with a fused backward: ``dx = sum_i broadcast(g_i)`` is built
    by broadcasting the small gradients into each other from the last mode on, so the only full-size work is one
    write of ``dx`` (autograd's default would materialise one expanded copy and add the others one by one)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mean: bool):
        ctx.shape, ctx.mean = x.shape, mean
        return _pool_modes(x, mean)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *gs):
        shape, k = ctx.shape, len(ctx.shape) - 2
        sizes = shape[1:-1]
        acc = None
        for i in reversed(range(k)):  # acc: (b, n_i, .., n_k, e)
            g = gs[i]  # never None: autograd materialises zeros for unused outputs
            if ctx.mean:
                g = g / (math.prod(sizes) // sizes[i])
            g = g.reshape(shape[0], sizes[i], *([1] * (k - 1 - i)), shape[-1])
            acc = g if acc is None else g + acc.unsqueeze(1)
        return acc, None  # the broadcast sums above already have x's full shape


def _pool_modes(x: torch.Tensor, mean: bool) -> tuple[torch.Tensor, ...]:
    k = x.ndim - 2
    others = [[1 + j for j in range(k) if j != i] for i in range(k)]
    return tuple(x.mean(dim=d) if mean else x.sum(dim=d) for d in others)


def mode_pools(x: torch.Tensor, mean: bool = False) -> list[torch.Tensor]:
    """``[g_pool^(1)(x), .., g_pool^(k)(x)]``: ``x (B, N1..Nk, D)`` summed (or averaged) over all modes but one,
    each ``(B, Ni, D)`` (HOT eq 6); one fused backward for all of them (traced code, ``torch.compile`` /
    ``torch.export``, uses the plain reductions and leaves fusing their gradients to the compiler)."""
    if x.ndim == 3:  # one mode: nothing to pool
        return [x]
    if torch.compiler.is_compiling():
        return list(_pool_modes(x, mean))
    return list(_ModePools.apply(x, mean))


class KroneckerAttention(_CheckOnce, _Decoder, RecordableAttention):
    """HOT multi-head Kronecker attention over ``x (B, N1..Nk, D)`` (paper 000 eqs 5-9).

    For each head and mode ``i``: pool ``x`` over the other modes (``pool="sum"`` as in the paper, or ``"mean"``),
    then project with the mode's own query/key weights, as eqs 5-6 write it (the reference code projects at full
    resolution and pools afterwards; pooling is linear and the q/k projections have no bias, so both are equal, and
    pooling first costs ``1/prod(N_j, j != i)`` of the projection),
    form ``S_i``, and apply ``S_1 (x) .. (x) S_k`` (``combine="product"``) or ``(1/k) S_1 (+) .. (+) S_k``
    (``"sum"``) to shared value projections by mode products. Output projection shared.

    Args:
        dim: model dim ``D``. num_heads: ``H``. dim_head: per-head dim (default ``D // H``).
        combine: ``"product"`` | ``"sum"``.
        kernel: ``"softmax"`` | ``"linear"`` (FAVOR+ features) | ``"tanimoto"`` | ``"cosine"`` (signed, Weaver).
        qk_norm: LayerNorm on per-head pooled q/k (keeps sum-pooled logits well scaled).
        rope_modes: 0-based mode indices whose pooled q/k get rotary embeddings.
        pool: ``"sum"`` | ``"mean"``. dropout: on the output projection. attn_dropout: on the softmax factors
            (default: ``dropout``).
        num_modes: the tensor order ``k`` (sets the number of per-mode q/k projections). If ``None`` they are created
            at the first forward, like ``nn.LazyLinear``: run one forward before building the optimizer or wrapping
            the model in DDP (parameters created later are not synchronised across ranks).
        num_features / redraw_interval: FAVOR+ settings for ``kernel="linear"``.
        causal_mode: ``None`` or a 0-based mode index ``c``: the layer is causal along ``c`` (its factor is
            lower-triangular, every other mode's factor for query index ``t`` comes from queries / keys pooled over
            indices ``<= t`` of ``c``; :mod:`hoformer.functional.causal`), and :meth:`step` decodes along ``c``.
        qk_bias: per-mode q/k projections with a bias, reproducing the reference implementation exactly: it projects
            every token with a bias and sum-pools afterwards, so the pooled bias is ``b * prod(N_j, j != i)`` (with
            ``pool="sum"``; ``b`` with ``"mean"``). Without a bias pooling first and last are equal.

    ``combine="sum"`` averages the ``k`` terms (``(1/k) S_1 (+) .. (+) S_k``, HOT eq 9 normalised); the reference
    implementation adds them unnormalised, which scales the output by ``k`` before the output projection.
    """

    record_kind = "kronecker"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        combine: str = "product",
        kernel: str = "softmax",
        qk_norm: bool = True,
        rope_modes: Sequence[int] = (),
        dropout: float = 0.0,
        dim_head: int | None = None,
        pool: str = "sum",
        num_modes: int | None = None,
        num_features: int | None = None,
        redraw_interval: int = 0,
        rope_theta: float = 10000.0,
        bias: bool = True,
        attn_dropout: float | None = None,
        causal_mode: int | None = None,
        qk_bias: bool = False,
    ) -> None:
        super().__init__()
        if combine not in ("product", "sum"):
            raise ValueError(f"KroneckerAttention: `combine` must be 'product' or 'sum', got {combine!r}")
        if kernel not in ("softmax", "linear", *unchecked.SCORE_KERNELS):
            raise ValueError(f"KroneckerAttention: `kernel` must be one of {('softmax', 'linear', *unchecked.SCORE_KERNELS)}, "
                             f"got {kernel!r}")
        if pool not in ("sum", "mean"):
            raise ValueError(f"KroneckerAttention: `pool` must be 'sum' or 'mean', got {pool!r}")
        _check_layer_args("KroneckerAttention", dim, num_heads, dim_head, dropout, attn_dropout)
        self.dim, self.heads = dim, num_heads
        self.dim_head = dim // num_heads if dim_head is None else dim_head
        inner = self.heads * self.dim_head
        self.combine, self.kernel, self.pool = combine, kernel, pool
        self.rope_modes = _mode_tuple(rope_modes, "KroneckerAttention")
        self.attn_dropout = dropout if attn_dropout is None else attn_dropout
        self.num_modes = num_modes
        self.causal_mode = _check_causal_mode(causal_mode, num_modes, "KroneckerAttention")
        if num_modes is not None:
            self._check_modes(num_modes, "KroneckerAttention")
        self.qk_bias = bool(qk_bias)
        # per-mode q/k projections are created lazily for the first k seen unless num_modes is given
        self.to_qk = nn.ModuleList()
        if num_modes is not None:
            self._ensure_modes(num_modes)
        self.to_v = nn.Linear(dim, inner, bias=bias)
        self.to_out = nn.Sequential(nn.Linear(inner, dim, bias=bias), Dropout(dropout))
        self.q_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.rotary = RotaryEmbedding(self.dim_head, rope_theta) if self.rope_modes else None
        self.favor = FavorFeatures(self.dim_head, num_features, redraw_interval) if kernel == "linear" else None
        self.score_fn = unchecked.SCORE_KERNELS.get(kernel)  # unchecked: forward has checked x

    def _ensure_modes(self, k: int) -> None:
        if len(self.to_qk) == 0:
            inner = self.heads * self.dim_head
            # built lazily (at the first forward) they follow the module's current device and dtype
            like = self.to_v.weight if "to_v" in self._modules else None
            kw = {} if like is None else {"device": like.device, "dtype": like.dtype}
            for _ in range(k):
                self.to_qk.append(nn.Linear(self.dim, 2 * inner, bias=self.qk_bias, **kw))
            self.num_modes = k
        elif len(self.to_qk) != k:
            raise ValueError(f"KroneckerAttention: built for {len(self.to_qk)} modes, got an input with {k} modes")

    def _qk(self, i: int, pooled: torch.Tensor, count, positions: torch.Tensor | None = None):
        """Mode ``i``'s queries / keys from its pooled input ``(B, .., Ni, D)``: each ``(B, H, .., Ni, E)``, projected,
        normalised and (if ``i`` is a RoPE mode) rotated along ``Ni`` at ``positions``. With ``qk_bias`` the bias is
        added ``count`` times (the number of tokens pooled into each row; 1 for ``pool="mean"``): the projection
        of the pooled input equals the sum-pool of the projected tokens, as in the reference implementation."""
        proj = self.to_qk[i]
        qk = proj(pooled) if proj.bias is None else F.linear(pooled, proj.weight) + proj.bias * count
        q, k = rearrange(qk, "b ... (two h e) -> two b h ... e", two=2, h=self.heads).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None and i in self.rope_modes:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        return q, k

    def mode_qk(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Pooled, projected, normalised (and rotated) per-mode queries / keys, each ``(B, H, Ni, E)``."""
        mean = self.pool == "mean"
        sizes = x.shape[1:-1]
        total = math.prod(sizes)
        qs, ks = [], []
        for i, pooled in enumerate(mode_pools(x, mean=mean)):
            q, k = self._qk(i, pooled, 1 if mean else total // sizes[i])
            qs.append(q)
            ks.append(k)
        return qs, ks

    # ------------------------------------------------------------------------------------- causal mode
    def _causal_pools(self, xp: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``xp (B, T, N2..Nk, D)`` (causal mode first): the causal mode's pool ``(B, T, D)`` (over all other modes)
        and, per other mode ``i``, the pool over the remaining other modes ``(B, T, Ni, D)`` at each ``t`` (no prefix
        yet)."""
        b, T, rest = xp.shape[0], xp.shape[1], xp.shape[2:-1]
        if not rest:
            return xp, []
        mean = self.pool == "mean"
        pools = [p.view(b, T, *p.shape[1:]) for p in mode_pools(xp.flatten(0, 1), mean=mean)]
        return (pools[0].mean(2) if mean else pools[0].sum(2)), pools

    def _causal_qk(self, pc, prefix, order, t0: int, rest):
        """Queries / keys in causal-first order: the causal mode's ``(B, H, T, E)`` at positions ``t0..t0+T-1``, the
        other modes' ``(B, H, T, Ni, E)`` from their prefix pools ``prefix[j] (B, T, Ni, D)``."""
        T = pc.shape[1]
        positions = torch.arange(t0, t0 + T, device=pc.device)
        mean, total = self.pool == "mean", math.prod(rest)
        q0, k0 = self._qk(order[0], pc, 1 if mean else total, positions)
        qs, ks = [q0], [k0]
        for j, p in enumerate(prefix):
            count = 1 if mean else ((positions + 1) * (total // rest[j])).to(p.dtype).view(T, 1, 1)
            q, k = self._qk(order[1 + j], p, count)
            qs.append(q)
            ks.append(k)
        return qs, ks

    def _causal_forward(self, x, masks, want_maps):
        c, nm = self.causal_mode, x.ndim - 2
        order = [c] + [i for i in range(nm) if i != c]
        xp = x.movedim(1 + c, 1)
        T, rest = xp.shape[1], tuple(xp.shape[2:-1])
        pc, pools = self._causal_pools(xp)
        if self.pool == "mean":
            steps = torch.arange(1, T + 1, device=x.device, dtype=x.dtype).view(1, T, 1, 1)
            prefix = [p.cumsum(1) / steps for p in pools]
        else:
            prefix = [p.cumsum(1) for p in pools]
        qs, ks = self._causal_qk(pc, prefix, order, 0, rest)
        v = rearrange(self.to_v(xp), "b t ... (h e) -> b h t ... e", h=self.heads)
        linear, log_scale = self.kernel == "linear", None
        if linear:
            self.favor.step()
            qs = [self.favor(q, is_query=True) for q in qs]
            # the causal mode's keys stabilised one by one (a shared stabiliser would span future keys); every other
            # mode's keys at index t come from the pools up to t already
            k0, log_scale = self.favor.with_log_scale(ks[0])
            ks = [k0] + [self.favor(k, is_query=False) for k in ks[1:]]
        y, maps = unchecked.causal_kronecker(
            qs, ks, v, combine=self.combine, kernel="linear" if linear else "softmax", scale=None,
            masks=None if masks is None else [masks[i] for i in order],
            dropout_p=self.attn_dropout if self.training and not linear else 0.0, want_factors=want_maps,
            score_fn=self.score_fn, key_log_scale=log_scale)
        y = self.to_out(rearrange(y, "b h t ... e -> b t ... (h e)")).movedim(1, 1 + c)  # the causal mode back
        if maps is not None:
            maps = [maps[order.index(i)] for i in range(nm)]
        return y, maps

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: DecodingCache, masks=None) -> torch.Tensor:
        """Incremental decoding along the causal mode: the output at the next index ``t`` of ``causal_mode`` from the
        slice ``x (B, N1..Nk, D)`` with size 1 along the causal mode (a full slice of the other modes), equal to
        ``layer(x_full)`` at ``t`` for the inputs given so far (eval mode: no dropout here; no gradients).

        ``cache`` (from :meth:`init_cache`) keeps the running pools of the other modes, the causal mode's keys
        ``(B, H, t, E)`` (the linear kernel: their features and log-scales, ``(B, H, t, F + 1)``) and the values of
        the past steps ``(B, H, t, P E)`` (buffers that grow by doubling, or preallocated with
        ``init_cache(max_steps)``). Per-step cost, with ``P = prod(N_i, i != c)``, ``F = E`` (softmax) or the number
        of random features (linear): the projections ``O(P D H E + sum_i Ni D H E)``, the other modes' factors and
        products ``O(H sum_i Ni^2 E + H P E sum_i Ni)``, the pools ``O(P D)``, none of which depends on ``t``, plus
        the causal mode's own attention row over the ``t + 1`` steps so far ``O(t H (F + P E))``; all times ``B``.
        ``masks``: per-mode masks of the other modes (the causal mode's entry must be ``None``)."""
        fn = "KroneckerAttention.step"
        masks = _step_entry(self, fn, x, cache, masks)
        c, nm = self.causal_mode, x.ndim - 2
        self._ensure_modes(nm)
        order = [c] + [i for i in range(nm) if i != c]
        xp = x.movedim(1 + c, 1)
        rest = tuple(xp.shape[2:-1])
        t = cache.steps
        pc, pools = self._causal_pools(xp)
        cache.pools = [p[:, 0] if t == 0 else acc + p[:, 0] for acc, p in
                       zip(cache.pools if t else pools, pools)]
        prefix = [(acc / (t + 1) if self.pool == "mean" else acc).unsqueeze(1) for acc in cache.pools]
        qs, ks = self._causal_qk(pc, prefix, order, t, rest)
        v = rearrange(self.to_v(xp), "b t ... (h e) -> b h t (... e)", h=self.heads)
        linear, log_scale = self.kernel == "linear", None
        if linear:  # the causal mode's key features do not depend on each other: cached with their log-scales
            qs = [self.favor(q, is_query=True) for q in qs]
            k0, ls0 = self.favor.with_log_scale(ks[0])
            ks = [k0] + [self.favor(k, is_query=False) for k in ks[1:]]
            keys, values = cache.append(torch.cat([k0, ls0.to(k0.dtype)], -1), v)
            keys, log_scale = keys[..., :-1], keys[..., -1:]
        else:
            keys, values = cache.append(ks[0], v)
        dtype = torch.float32 if linear and x.dtype == torch.float16 else x.dtype
        row = causal_row(qs[0].to(dtype), keys.to(dtype), kernel="linear" if linear else "softmax",
                         score_fn=self.score_fn, key_log_scale=log_scale)
        z = torch.matmul(row, values.to(dtype))
        y, _ = unchecked.causal_apply_rest(z, v, qs[1:], ks[1:], None if masks is None else [masks[i] for i in order[1:]],
                           (*rest, self.dim_head),
                           combine=self.combine, kernel="linear" if linear else "softmax", scale=None, dropout_p=0.0,
                           want_factors=False, score_fn=self.score_fn)
        cache.advance()
        return self.to_out(rearrange(y.to(x.dtype), "b h t ... e -> b t ... (h e)")).movedim(1, 1 + c)

    def _weight(self) -> torch.Tensor:
        return self.to_v.weight

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        given, masks = masks, self._entry(x, masks)
        self._ensure_modes(x.ndim - 2)
        want_maps = self._recording
        if self.causal_mode is not None:
            y, maps = self._causal_forward(x, masks, want_maps)
            if maps is not None:
                self._maybe_record(maps)
            return self._exit(y, x, given)
        qs, ks = self.mode_qk(x)
        # values as a (b, h, n1..nk, e) *view* of the (b, n.., h*e) projection; kron_apply / kron_sum_apply keep that
        # memory layout, so merging the heads before to_out is a view too
        v = rearrange(self.to_v(x), "b ... (h e) -> b h ... e", h=self.heads)
        if self.kernel == "linear":
            self.favor.step()
            phi_q = [self.favor(q, is_query=True) for q in qs]
            phi_k = [self.favor(k, is_query=False) for k in ks]
            out = unchecked.linear_attention(list(zip(phi_q, phi_k)), v, self.combine, masks, want_maps)
            y, maps = out if want_maps else (out, None)
        else:
            y, maps = unchecked.kronecker_attention(qs, ks, v, self.combine, None, masks,
                                           self.attn_dropout if self.training else 0.0, True, self.score_fn)
        if want_maps:
            self._maybe_record(maps)
        return self._exit(self.to_out(rearrange(y, "b h ... e -> b ... (h e)")), x, given)
