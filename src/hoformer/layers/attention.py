"""Attention layers on channels-last tensors ``x (B, N1, ..., Nk, D)``, any number of modes ``k >= 1``.

Axis legend: ``b`` batch, ``h`` heads, ``n1..nk`` modes, ``d`` model dim, ``e`` per-head dim, ``f`` random features.

All layers share one call signature, so every model can swap attention by name (:func:`build_attention`)::

    forward(x, masks=None, return_attention=False) -> y            (B, N1..Nk, D)
                                                   -> (y, maps)     with return_attention=True

``masks`` is a list with one entry per mode (``None`` or bool ``(.., Ni, Ni)``, True = may attend).

* :class:`KroneckerAttention` - HOT (paper 000 eqs 3-9, 002 eqs 10-12): per-mode factors from pooled queries/keys,
  combined as a Kronecker product or sum; softmax, FAVOR+ linear, Tanimoto or cosine (Weaver) kernels.
* :class:`FullAttention` - flattened high-order attention (eqs 1-2) through SDPA.
* :class:`AxialAttention` - attention along each mode for every fiber, summed (shared projections) or sequential.
* :class:`DividedAttention` - TimeSformer's divided space-time attention: one mode, then the others jointly.

:func:`record_attention` is a context manager that collects every layer's attention maps during a forward pass
without changing outputs (the normal path pays one ``if`` per layer).
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hoformer._checks import check_fraction, check_int, is_int
from hoformer.functional.kronecker import kron_dense, kronecker_attention, sdpa
from hoformer.functional.scores import SCORE_FNS, dot_scores, get_score_fn, masked_softmax

from .pos import RotaryEmbedding, axial_rotary

__all__ = [
    "KroneckerAttention",
    "FullAttention",
    "AxialAttention",
    "DividedAttention",
    "FavorFeatures",
    "build_attention",
    "ATTENTION_TYPES",
    "record_attention",
]


# ------------------------------------------------------------------------------------------------ helpers
def _check_x(x, dim: int, name: str, nmodes: int | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: `x` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: `x` must be floating point, got dtype {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"{name}: `x` must have shape (B, N1, ..., Nk, {dim}) with k >= 1, got {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"{name}: `x` last dim must equal dim={dim}, got shape {tuple(x.shape)}")
    if nmodes is not None and x.ndim - 2 != nmodes:
        raise ValueError(f"{name}: expected {nmodes} modes, got x of shape {tuple(x.shape)}")
    if x.numel() == 0:
        what = "an empty batch (B = 0)" if x.shape[0] == 0 else "an empty mode"
        raise ValueError(f"{name}: `x` has {what}, got shape {tuple(x.shape)}")


def _mode_tuple(modes, fn: str, arg: str = "rope_modes") -> tuple[int, ...]:
    """A sequence of mode indices as a tuple (a bare int is refused: ``rope_modes=(1,)``, not ``1``)."""
    if isinstance(modes, (str, bytes)) or not isinstance(modes, Sequence) or not all(is_int(m) for m in modes):
        raise TypeError(f"{fn}: `{arg}` must be a sequence of 0-based mode indices (ints), e.g. (0, 1), got {modes!r}")
    return tuple(int(m) for m in modes)


def _check_rope_modes(rope_modes: tuple[int, ...], nmodes: int, name: str) -> None:
    """Range check at forward time (the ints were checked at construction by :func:`_mode_tuple`)."""
    bad = [m for m in rope_modes if not 0 <= m < nmodes]
    if bad:
        raise ValueError(f"{name}: `rope_modes` must be 0-based mode indices in [0, {nmodes}) for an input with "
                         f"{nmodes} modes, got {tuple(rope_modes)}")


def _check_masks(masks, sizes, name: str, batch: int | None = None, heads: int | None = None):
    if masks is None:
        return None
    if isinstance(masks, torch.Tensor) or len(masks) != len(sizes):
        raise ValueError(f"{name}: `masks` must be a list of {len(sizes)} per-mode entries (None or bool (.., Ni, Ni))")
    out = []
    for i, (m, n) in enumerate(zip(masks, sizes)):
        if m is None:
            out.append(None)
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise TypeError(f"{name}: `masks[{i}]` must be a bool tensor (True = attend), got {getattr(m, 'dtype', type(m))}")
        # broadcast from the right like SDPA's attn_mask: (n, n), (H|1, n, n) or (B|1, H|1, n, n)
        ok = m.shape[-2:] == (n, n) and 2 <= m.ndim <= 4
        if ok and m.ndim >= 3 and heads is not None:
            ok = m.shape[-3] in (1, heads)
        if ok and m.ndim == 4 and batch is not None:
            ok = m.shape[0] in (1, batch)
        if not ok:
            b_, h_ = batch if batch is not None else "B", heads if heads is not None else "H"
            raise ValueError(f"{name}: `masks[{i}]` must broadcast like ({b_}|1, {h_}|1, {n}, {n}): ({n}, {n}), "
                             f"({h_}|1, {n}, {n}) or ({b_}|1, {h_}|1, {n}, {n}); got {tuple(m.shape)} "
                             "(a per-sample mask needs the head dim: m[:, None])")
        out.append(m)
    return out


def _kron_and(masks: Sequence[torch.Tensor | None], sizes: Sequence[int], device) -> torch.Tensor | None:
    """Dense mask over flattened tokens: a pair is allowed iff it is allowed in every mode (matches the product)."""
    if masks is None or all(m is None for m in masks):
        return None
    ones = [torch.ones(n, n, device=device) if m is None else m.to(torch.uint8) for m, n in zip(masks, sizes)]
    full = kron_dense(ones).bool()
    return full.view((1,) * (4 - full.ndim) + tuple(full.shape)) if full.ndim < 4 else full


def _check_layer_args(fn: str, dim, num_heads, dim_head, dropout, attn_dropout) -> None:
    """Sizes and rates every attention layer takes; ``dim_head=None`` means ``dim // num_heads`` (0 is refused)."""
    check_int(fn, "dim", dim)
    check_int(fn, "num_heads", num_heads)
    check_int(fn, "dim_head", dim_head, optional=True)
    if dim_head is None and dim % num_heads:
        raise ValueError(f"{fn}: dim={dim} is not divisible by num_heads={num_heads}")
    check_fraction(fn, "dropout", dropout)
    check_fraction(fn, "attn_dropout", attn_dropout, optional=True)


class _Recordable(nn.Module):
    """Mixin: every active ``record_attention`` block adds a sink ``(records, layer_name)``; ``records`` receives
    ``(layer_name, maps)``. Blocks nest: an inner recording (e.g. a callback's) leaves the outer one's intact."""

    _sinks: tuple = ()

    @property
    def _recording(self) -> bool:
        return bool(self._sinks)

    def _maybe_record(self, maps) -> None:
        if self._sinks:
            maps = [m.detach() for m in maps]
            for records, name in self._sinks:
                records.append((name, maps))


@contextlib.contextmanager
def record_attention(model: nn.Module):
    """Collect the attention maps of every attention layer of ``model`` during the ``with`` block.

    Yields a list of ``(layer_name, maps)`` in call order; ``maps`` is a list with one tensor per mode
    (``KroneckerAttention``: the factors ``S_i (B, H, Ni, Ni)``; ``FullAttention``: the dense ``(B, H, N, N)``;
    ``AxialAttention``: per mode ``(B, H, *fibers, Ni, Ni)``), the weights *before* attention dropout. Outputs are
    unchanged in eval mode; the dense baselines then leave SDPA for an explicit ``softmax(QK^T) V`` (O(N^2) memory),
    so in training mode with ``attn_dropout > 0`` their dropout masks are drawn differently.
    """
    records: list = []
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, _Recordable)]
    for n, m in layers:
        m._sinks = m._sinks + ((records, n),)
    try:
        yield records
    finally:
        for _, m in layers:
            m._sinks = tuple(sink for sink in m._sinks if sink[0] is not records)


# --------------------------------------------------------------------------------------------- FAVOR+
class FavorFeatures(nn.Module):
    """Positive orthogonal random features of FAVOR+ (Performer "SMReg" softmax kernel).

    ``phi(x) = exp(w^T x' - |x'|^2 / 2 - c) / sqrt(m)`` with ``x' = x * d^-1/4`` and orthogonal Gaussian ``w``, so
    ``E[phi(q) phi(k)^T] ~ exp(q.k / sqrt(d))``. The projection is a buffer (checkpoints reproduce); call
    :meth:`redraw` (done automatically every ``redraw_interval`` training forwards when > 0).
    ``c`` is a stabiliser against overflow: the per-row max for queries, the max over all keys of a (batch, head) for
    keys. The ``1e-6`` floor of Performer's features is scaled by ``exp(-c)`` as well, so ``c`` is an exact common
    factor that cancels in the row normalisation: a key feature does not depend on the other keys, and a causal mask
    holds to rounding (with the floor added after stabilising, future keys moved the past outputs by ~1e-5). The
    shared key stabiliser still couples keys through underflow: a key whose projection exceeds the others' by ~90
    (float32) flushes their features to 0.
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
        xs = x * self.dim ** -0.25
        proj = torch.matmul(xs, self.projection.to(x.dtype).T)  # (.., n, f)
        sq = xs.pow(2).sum(-1, keepdim=True) / 2
        if is_query:
            stab = proj.amax(dim=-1, keepdim=True)
        else:
            stab = proj.amax(dim=(-1, -2), keepdim=True)
        stab = stab.detach().clamp_min(0.0)  # guards exp(proj) against overflow; >= 0 so exp(-stab) cannot overflow
        return (torch.exp(proj - sq - stab) + 1e-6 * torch.exp(-stab)) / math.sqrt(self.num_features)


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


class KroneckerAttention(_Recordable):
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
    """

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
    ) -> None:
        super().__init__()
        if combine not in ("product", "sum"):
            raise ValueError(f"KroneckerAttention: `combine` must be 'product' or 'sum', got {combine!r}")
        if kernel not in ("softmax", "linear", *SCORE_FNS):
            raise ValueError(f"KroneckerAttention: `kernel` must be one of {('softmax', 'linear', *SCORE_FNS)}, "
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
        # per-mode q/k projections are created lazily for the first k seen unless num_modes is given
        self.to_qk = nn.ModuleList()
        if num_modes is not None:
            self._ensure_modes(num_modes)
        self.to_v = nn.Linear(dim, inner, bias=bias)
        self.to_out = nn.Sequential(nn.Linear(inner, dim, bias=bias), nn.Dropout(dropout))
        self.q_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.rotary = RotaryEmbedding(self.dim_head, rope_theta) if self.rope_modes else None
        self.favor = FavorFeatures(self.dim_head, num_features, redraw_interval) if kernel == "linear" else None
        self.score_fn = get_score_fn(kernel) if kernel in SCORE_FNS else None

    def _ensure_modes(self, k: int) -> None:
        if len(self.to_qk) == 0:
            inner = self.heads * self.dim_head
            # built lazily (at the first forward) they follow the module's current device and dtype
            like = self.to_v.weight if "to_v" in self._modules else None
            kw = {} if like is None else {"device": like.device, "dtype": like.dtype}
            for _ in range(k):
                self.to_qk.append(nn.Linear(self.dim, 2 * inner, bias=False, **kw))
            self.num_modes = k
        elif len(self.to_qk) != k:
            raise ValueError(f"KroneckerAttention: built for {len(self.to_qk)} modes, got an input with {k} modes")

    def mode_qk(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Pooled, projected, normalised (and rotated) per-mode queries / keys, each ``(B, H, Ni, E)``."""
        qs, ks = [], []
        pools = mode_pools(x, mean=self.pool == "mean")
        for i, proj in enumerate(self.to_qk):
            qk = proj(pools[i])  # (b, n_i, 2*h*e)
            q, k = qk.view(*qk.shape[:2], 2, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)
            q, k = self.q_norm(q), self.k_norm(k)
            if self.rotary is not None and i in self.rope_modes:
                q, k = self.rotary(q), self.rotary(k)
            qs.append(q)
            ks.append(k)
        return qs, ks

    def forward(self, x: torch.Tensor, masks=None, return_attention: bool = False):
        _check_x(x, self.dim, "KroneckerAttention", self.num_modes)
        self._ensure_modes(x.ndim - 2)
        b, sizes = x.shape[0], tuple(x.shape[1:-1])
        _check_rope_modes(self.rope_modes, len(sizes), "KroneckerAttention")
        masks = _check_masks(masks, sizes, "KroneckerAttention", b, self.heads)
        qs, ks = self.mode_qk(x)
        # values as a (b, h, n1..nk, e) *view* of the (b, n.., h*e) projection; kron_apply / kron_sum_apply keep that
        # memory layout, so merging the heads before to_out is a view too
        v = self.to_v(x).view(b, *sizes, self.heads, self.dim_head).movedim(-2, 1)
        want_maps = return_attention or self._recording
        if self.kernel == "linear":
            self.favor.step()
            phi_q = [self.favor(q, is_query=True) for q in qs]
            phi_k = [self.favor(k, is_query=False) for k in ks]
            out = kronecker_attention(phi_q, phi_k, v, combine=self.combine, kernel="linear", masks=masks,
                                      feature_map=_identity, return_factors=want_maps)
            y, maps = out if want_maps else (out, None)
        else:
            y, maps = kronecker_attention(
                qs, ks, v, combine=self.combine, masks=masks, return_factors=True, score_fn=self.score_fn,
                dropout_p=self.attn_dropout if self.training else 0.0,
            )
        if maps is not None:
            self._maybe_record(maps)
        y = self.to_out(y.movedim(1, -2).reshape(b, *sizes, -1))
        return (y, maps) if return_attention else y


def _identity(x):
    return x


# ------------------------------------------------------------------------------------------- baselines
class _QKV(_Recordable):
    """Shared pieces of the dense baselines: one qkv projection, q/k norm, output projection.

    ``dropout`` acts on the output projection, ``attn_dropout`` on the attention probabilities (default: ``dropout``).
    """

    def __init__(self, dim, num_heads, qk_norm, dropout, dim_head, bias=True, attn_dropout=None):
        super().__init__()
        _check_layer_args(type(self).__name__, dim, num_heads, dim_head, dropout, attn_dropout)
        self.dim, self.heads = dim, num_heads
        self.dim_head = dim // num_heads if dim_head is None else dim_head
        inner = self.heads * self.dim_head
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=bias)
        self.q_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.dim_head) if qk_norm else nn.Identity()
        self.to_out = nn.Sequential(nn.Linear(inner, dim, bias=bias), nn.Dropout(dropout))
        self.attn_dropout = dropout if attn_dropout is None else attn_dropout

    def qkv(self, x):
        """``(B, N.., D)`` -> three ``(B, H, N.., E)`` tensors."""
        q, k, v = self.to_qkv(x).view(*x.shape[:-1], 3, self.heads, self.dim_head).unbind(-3)
        q, k, v = (t.movedim(-2, 1) for t in (q, k, v))
        return self.q_norm(q), self.k_norm(k), v

    def out(self, y):
        """``(B, H, N.., E)`` -> ``(B, N.., D)``."""
        return self.to_out(y.movedim(1, -2).flatten(-2))


def _attend(q, k, v, mask, dropout_p, want_maps):
    """Attention over the second-to-last dim of ``(b, h, .., n, e)`` (the dims between are batch dims): SDPA, or the
    explicit maps when they are asked for; either way a fully masked row gives zeros."""
    if want_maps:
        a = masked_softmax(dot_scores(q, k), mask)
        return torch.matmul(F.dropout(a, dropout_p), v), a
    return sdpa(q, k, v, mask=mask, dropout_p=dropout_p), None


class FullAttention(_QKV):
    """Flattened high-order attention (HOT eqs 1-2) with SDPA; per-mode masks are combined as a Kronecker AND.

    ``rope_modes``: axial N-d RoPE on the flattened tokens (head dim split between those modes).
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None, attn_dropout=None,
                 bias=True, rope_theta=10000.0, num_modes=None):
        super().__init__(dim, num_heads, qk_norm, dropout, dim_head, bias=bias, attn_dropout=attn_dropout)
        self.rope_modes, self.rope_theta, self.num_modes = _mode_tuple(rope_modes, "FullAttention"), rope_theta, num_modes

    def forward(self, x, masks=None, return_attention=False):
        _check_x(x, self.dim, "FullAttention", self.num_modes)
        b, sizes = x.shape[0], tuple(x.shape[1:-1])
        _check_rope_modes(self.rope_modes, len(sizes), "FullAttention")
        masks = _check_masks(masks, sizes, "FullAttention", b, self.heads)
        q, k, v = (t.reshape(b, self.heads, -1, self.dim_head) for t in self.qkv(x))
        q = axial_rotary(q, sizes, self.rope_modes, self.rope_theta)
        k = axial_rotary(k, sizes, self.rope_modes, self.rope_theta)
        mask = _kron_and(masks, sizes, x.device)
        want = return_attention or self._recording
        y, a = _attend(q, k, v, mask, self.attn_dropout if self.training else 0.0, want)
        if want:
            self._maybe_record([a])
        y = self.out(y.view(b, self.heads, *sizes, self.dim_head))
        return (y, [a]) if return_attention else y


class AxialAttention(_QKV):
    """Attention along each mode separately, for every fiber of the other modes (Ho et al. 2019).

    ``combine="sum"``: one shared qkv projection, ``y = (1/k) sum_i attn_i(x)`` (the dense-fiber analogue of the
    Kronecker sum). ``combine="sequential"``: per-mode qkv projections applied one mode after another.
    ``modes``: the 0-based modes to attend along, in order (default: all). ``modes=(0,)`` on a ``(B, P, N, D)``
    traffic tensor is temporal attention for every sensor, ``modes=(1,)`` spatial attention for every step.
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None,
                 combine="sum", num_modes=None, modes=None, attn_dropout=None, bias=True, rope_theta=10000.0):
        super().__init__(dim, num_heads, qk_norm, dropout, dim_head, bias=bias, attn_dropout=attn_dropout)
        self.bias = bias
        if combine not in ("sum", "sequential"):
            raise ValueError(f"AxialAttention: `combine` must be 'sum' or 'sequential', got {combine!r}")
        if modes is not None:
            modes = _mode_tuple(modes, "AxialAttention", "modes")
            if not modes or len(set(modes)) != len(modes) or any(m < 0 for m in modes):
                raise ValueError(f"AxialAttention: `modes` must be distinct non-negative mode indices, got {modes}")
        self.modes = modes
        self.combine, self.rope_modes = combine, _mode_tuple(rope_modes, "AxialAttention")
        self.rotary = RotaryEmbedding(self.dim_head, rope_theta) if self.rope_modes else None
        self.extra = nn.ModuleList()  # sequential: qkv projections of modes 2..k, from the (heads * dim_head) values
        self.num_modes = num_modes
        if combine == "sequential" and num_modes:
            self._ensure(num_modes)

    def _ensure(self, k):
        n_att = k if self.modes is None else len(self.modes)
        if self.combine == "sequential" and len(self.extra) == 0 and n_att > 1:
            inner = self.heads * self.dim_head
            like = self.to_qkv.weight  # lazily built layers follow the module's device and dtype
            self.extra.extend(nn.Linear(inner, 3 * inner, bias=self.bias, device=like.device, dtype=like.dtype)
                              for _ in range(n_att - 1))
            self.num_modes = k

    def _along(self, q, k, v, mode, mask, want):
        # (b, h, n1..nk, e) -> mode last before e, attend over it for every fiber
        q, k, v = (t.movedim(2 + mode, -2) for t in (q, k, v))
        if self.rotary is not None and mode in self.rope_modes:
            q, k = self.rotary(q), self.rotary(k)
        if mask is not None:
            while mask.ndim < 4:
                mask = mask.unsqueeze(0)
            mask = mask.view(*mask.shape[:2], *([1] * (q.ndim - 4)), *mask.shape[-2:])
        y, a = _attend(q, k, v, mask, self.attn_dropout if self.training else 0.0, want)
        return y.movedim(-2, 2 + mode), a

    def forward(self, x, masks=None, return_attention=False):
        _check_x(x, self.dim, "AxialAttention", self.num_modes if self.combine == "sequential" else None)
        sizes = tuple(x.shape[1:-1])
        nm = len(sizes)
        modes = tuple(range(nm)) if self.modes is None else self.modes
        if max(modes) >= nm:
            raise ValueError(f"AxialAttention: `modes`={modes} but x {tuple(x.shape)} has only {nm} modes")
        _check_rope_modes(self.rope_modes, nm, "AxialAttention")
        self._ensure(nm)
        masks = _check_masks(masks, sizes, "AxialAttention", x.shape[0], self.heads) or [None] * nm
        want = return_attention or self._recording
        maps = []
        q, k, v = self.qkv(x)
        if self.combine == "sum":
            y = None
            for m in modes:
                ym, a = self._along(q, k, v, m, masks[m], want)
                y = ym if y is None else y + ym
                maps.append(a)
            y = y / len(modes) if len(modes) > 1 else y
        else:
            y = v
            for j, m in enumerate(modes):
                if j > 0:  # new queries/keys from the current representation, values = current
                    cur = y.movedim(1, -2).flatten(-2)
                    qkv = self.extra[j - 1](cur).view(*cur.shape[:-1], 3, self.heads, self.dim_head).unbind(-3)
                    q, k, y = (t.movedim(-2, 1) for t in qkv)
                    q, k = self.q_norm(q), self.k_norm(k)
                y, a = self._along(q, k, y, m, masks[m], want)
                maps.append(a)
        if want:
            self._maybe_record(maps)
        y = self.out(y)
        return (y, maps) if return_attention else y


class DividedAttention(nn.Module):
    """TimeSformer divided attention: full attention along ``first_mode``, then jointly over the other modes.

    Returns ``T(x) + S(x + T(x))`` so that the block's residual reproduces TimeSformer's
    ``x <- x + T(x); x <- x + S(x)``: ``T`` is attention along ``first_mode`` for every fiber of the other modes
    (``self.first``), ``S`` the flattened attention over the other modes for every index of ``first_mode``
    (``self.rest``). Masks of any documented shape, per sample or per head, apply in either stage. With a single mode
    there are no other modes and ``S`` attends along that mode a second time. Inside a pre-norm
    :class:`~hoformer.layers.blocks.Block` (one norm before the whole layer) ``S`` sees ``LN(x) + T`` where
    TimeSformer's own block, with a norm per stage, feeds ``LN(x + T)``.
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None,
                 first_mode=0, attn_dropout=None, bias=True, rope_theta=10000.0, num_modes=None):
        super().__init__()
        check_int("DividedAttention", "first_mode", first_mode, low=0, note=" (a mode index)")
        rope_modes = _mode_tuple(rope_modes, "DividedAttention")
        if any(m < 0 for m in rope_modes):
            raise ValueError(f"DividedAttention: `rope_modes` must be non-negative mode indices, got {rope_modes}")
        self.first_mode, self.dim = first_mode, dim
        rope_rest = tuple(i - (i > first_mode) for i in rope_modes if i != first_mode)
        self.first = AxialAttention(dim, num_heads, qk_norm, (0,) if first_mode in rope_modes else (), dropout, dim_head,
                                    attn_dropout=attn_dropout, bias=bias, rope_theta=rope_theta)
        self.rest = FullAttention(dim, num_heads, qk_norm, rope_rest, dropout, dim_head, attn_dropout=attn_dropout,
                                  bias=bias, rope_theta=rope_theta)
        self.rope_modes, self.num_modes = rope_modes, num_modes

    def forward(self, x, masks=None, return_attention=False):
        _check_x(x, self.dim, "DividedAttention", self.num_modes)
        sizes = tuple(x.shape[1:-1])
        nm = len(sizes)
        _check_rope_modes(self.rope_modes, nm, "DividedAttention")
        masks = _check_masks(masks, sizes, "DividedAttention", x.shape[0], self.first.heads) or [None] * nm
        fm = self.first_mode
        if fm >= nm:
            raise ValueError(f"DividedAttention: first_mode={fm} but x {tuple(x.shape)} has only {nm} modes")
        # attention along `first_mode` only: move it to mode 0, treat the others as fibers via axial on a 2-mode view
        xt = x.movedim(1 + fm, 1)
        b, n0 = xt.shape[:2]
        rest_sizes = xt.shape[2:-1]
        x2 = xt.reshape(b, n0, -1, self.dim)  # (b, n0, prod(rest), d)
        q, k, v = self.first.qkv(x2)
        want = return_attention or self.first._recording
        t, a_t = self.first._along(q, k, v, 0, masks[fm], want)
        if want:
            self.first._maybe_record([a_t])
        t = self.first.out(t).view(xt.shape).movedim(1, 1 + fm)
        h = x + t
        if nm == 1:  # no other modes: the joint stage attends along the same mode again (same masks)
            s = self.rest(h, masks=masks, return_attention=return_attention)
        else:  # joint attention over the other modes, for every position of first_mode
            hs = h.movedim(1 + fm, 1).reshape(b * n0, *rest_sizes, self.dim)
            # the joint stage's batch is (b, n0) flattened: a per-sample (B, H|1, n, n) mask follows its sample to
            # the n0 rows b * n0 .. b * n0 + n0 - 1
            rest_masks = [m.repeat_interleave(n0, 0) if m is not None and m.ndim == 4 and m.shape[0] > 1 else m
                          for i, m in enumerate(masks) if i != fm]
            s = self.rest(hs, masks=rest_masks, return_attention=return_attention)
        s, a_s = s if return_attention else (s, None)
        if nm > 1:
            s = s.view(b, n0, *rest_sizes, self.dim).movedim(1, 1 + fm)
        y = t + s
        return (y, [a_t] + list(a_s or [])) if return_attention else y


# ----------------------------------------------------------------------------------------- factory
ATTENTION_TYPES = {
    "kronecker_product": (KroneckerAttention, {"combine": "product"}),
    "kronecker_sum": (KroneckerAttention, {"combine": "sum"}),
    "kronecker_linear": (KroneckerAttention, {"combine": "product", "kernel": "linear"}),
    "kronecker_tanimoto": (KroneckerAttention, {"combine": "product", "kernel": "tanimoto"}),
    "kronecker_cosine": (KroneckerAttention, {"combine": "product", "kernel": "cosine"}),
    "full": (FullAttention, {}),
    "axial": (AxialAttention, {"combine": "sum"}),
    "axial_sequential": (AxialAttention, {"combine": "sequential"}),
    "divided": (DividedAttention, {}),
}


def build_attention(name: str, dim: int, num_heads: int = 8, **kwargs) -> nn.Module:
    """Attention layer by name (see ``ATTENTION_TYPES``); ``kwargs`` override the preset (e.g. ``combine="sum"``)."""
    if name not in ATTENTION_TYPES:
        raise ValueError(f"build_attention: unknown attention {name!r}; expected one of {sorted(ATTENTION_TYPES)}")
    cls, preset = ATTENTION_TYPES[name]
    return cls(dim, num_heads=num_heads, **{**preset, **kwargs})
