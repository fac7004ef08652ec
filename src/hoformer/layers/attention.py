"""Attention layers on channels-last tensors ``x (B, N1, ..., Nk, D)``, any number of modes ``k >= 1``.

Axis legend: ``b`` batch, ``h`` heads, ``n1..nk`` modes, ``d`` model dim, ``e`` per-head dim, ``f`` random features.

All layers share one call signature, so every model can swap attention by name (:func:`build_attention`)::

    forward(x, masks=None) -> y            (B, N1..Nk, D)

``masks`` is a list with one entry per mode (``None`` or bool ``(.., Ni, Ni)``, True = may attend). A mask is exact
for the mode it masks: it removes those entries of that mode's attention. It does not make a layer causal: the
Kronecker layers' other factors are computed from queries / keys pooled over every index of the masked mode.

``causal_mode=c`` (every layer here) makes a layer causal along mode ``c``: in eval mode, for every index ``t`` of
mode ``c``, ``layer(x)`` at ``t`` equals ``layer(x[..., :t+1 along c, ...])`` at its last index. The dense layers
combine a lower-triangular mask into mode ``c``'s; the Kronecker layers also pool the other modes' queries / keys
over indices ``<= t`` only (:mod:`hoformer.functional.causal`). Every causal layer decodes incrementally, one
index of mode ``c`` (a full slice of the other modes) at a time: ``cache = layer.init_cache()``, then
``layer.step(x_t, cache)`` (a :class:`DecodingCache` of the causal mode's keys and values; each ``step`` docstring
states its per-step cost).

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
from hoformer.functional.causal import _apply_rest, _causal_kronecker, causal_mask, causal_row
from hoformer.functional.kronecker import _kronecker_attention, _linear_attention, kron_dense, sdpa
from hoformer.functional.scores import _SCORE_KERNELS, _dot, masked_softmax

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
    "DecodingCache",
    "RecordableAttention",
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


def _check_causal_mode(causal_mode, num_modes, fn: str) -> int | None:
    """``causal_mode``: ``None`` or a 0-based mode index (below ``num_modes`` when that is given)."""
    if causal_mode is None:
        return None
    check_int(fn, "causal_mode", causal_mode, low=0, note=" (a 0-based mode index)")
    if num_modes is not None and causal_mode >= num_modes:
        raise ValueError(f"{fn}: `causal_mode` must be a mode index in [0, {num_modes}) for num_modes={num_modes}, "
                         f"got {causal_mode}")
    return int(causal_mode)


def _check_causal_range(causal_mode, nmodes: int, x, fn: str) -> None:
    if causal_mode is not None and causal_mode >= nmodes:
        raise ValueError(f"{fn}: causal_mode={causal_mode} but x {tuple(x.shape)} has only {nmodes} modes")


def _causal_masks(masks, sizes, causal_mode, device):
    """``masks`` (checked, or None) with the causal mode's entry combined with the lower-triangular mask."""
    if causal_mode is None:
        return masks
    masks = [None] * len(sizes) if masks is None else list(masks)
    tril = causal_mask(sizes[causal_mode], device)
    masks[causal_mode] = tril if masks[causal_mode] is None else masks[causal_mode] & tril
    return masks


class DecodingCache:
    """The state a causal attention layer keeps between decoding steps (from ``init_cache()``): the number of steps
    so far, the running pools of the non-causal modes (Kronecker layers) and the keys and values along the causal
    mode, one pair per attention stage that attends along it, in buffers ``(B, H, capacity, ...)``.

    ``max_steps=None``: the buffers grow by doubling (amortised O(1) copies per step, no limit). An int: they are
    allocated for ``max_steps`` steps at the first step (no copies later), and a step past ``max_steps`` raises.
    """

    def __init__(self, max_steps: int | None = None, fn: str = "DecodingCache") -> None:
        check_int(fn, "max_steps", max_steps, optional=True, note=" (None: buffers that grow)")
        self.max_steps = None if max_steps is None else int(max_steps)
        self.steps = 0
        self.shape = None
        self.pools: list[torch.Tensor] | None = None
        self._kv: list[list[torch.Tensor]] = []  # per stage: [keys, values]

    def check(self, fn: str, batch: int, rest: tuple[int, ...], dtype: torch.dtype) -> None:
        """Refuse a step past ``max_steps`` or one whose batch, other modes or dtype differ from the earlier steps'."""
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise ValueError(f"{fn}: the cache is full: it was made with max_steps={self.max_steps} and holds "
                             f"{self.steps} steps; make it with init_cache(max_steps=...) large enough, or None to "
                             "grow")
        if self.steps and self.shape != (batch, rest, dtype):
            raise ValueError(f"{fn}: the cache holds inputs of batch {self.shape[0]}, other modes {self.shape[1]} "
                             f"and dtype {self.shape[2]}; got batch {batch}, other modes {rest}, dtype {dtype}")
        self.shape = (batch, rest, dtype)

    def append(self, k: torch.Tensor, v: torch.Tensor, stage: int = 0, dim: int = 2) -> tuple[torch.Tensor, ...]:
        """Store step ``self.steps``'s key and value (size 1 along ``dim``) of attention stage ``stage``; return every
        key and value of that stage so far, views of the buffers with ``steps + 1`` entries along ``dim`` (``2``:
        ``(B, H, steps, ...)``; ``-2``: ``(B, H, .., steps, E)``, every fibre's rows contiguous)."""
        t = self.steps
        while len(self._kv) <= stage:
            self._kv.append([None, None])
        kv = self._kv[stage]
        kv[0], kv[1] = self._grow(kv[0], k, t, dim), self._grow(kv[1], v, t, dim)
        return kv[0].narrow(dim, 0, t + 1), kv[1].narrow(dim, 0, t + 1)

    def advance(self) -> None:
        """Close the step: the next ``append`` writes index ``steps + 1``."""
        self.steps += 1

    def _grow(self, buf: torch.Tensor | None, new: torch.Tensor, t: int, dim: int) -> torch.Tensor:
        if buf is None or buf.shape[dim] <= t:
            shape = list(new.shape)
            shape[dim] = self.max_steps or max(16, 2 * (0 if buf is None else buf.shape[dim]))
            grown = new.new_empty(shape)
            if buf is not None:
                grown.narrow(dim, 0, t).copy_(buf.narrow(dim, 0, t))
            buf = grown
        buf.narrow(dim, t, 1).copy_(new)
        return buf


class _Decoder:
    """``init_cache`` of the layers that decode along their ``causal_mode`` (each defines ``step``)."""

    causal_mode: int | None

    def init_cache(self, max_steps: int | None = None) -> DecodingCache:
        """An empty decoding state for :meth:`step` (one per layer and sequence batch). ``max_steps``: ``None`` for
        key / value buffers that grow by doubling, or the number of steps to preallocate (stepping past raises)."""
        fn = f"{type(self).__name__}.init_cache"
        if self.causal_mode is None:
            raise ValueError(f"{fn}: decoding needs a layer built with `causal_mode`")
        return DecodingCache(max_steps, fn)


def _check_eval(module: nn.Module, fn: str) -> None:
    """Decoding is eval-mode arithmetic (no dropout, like the forward it reproduces in eval mode): refuse a module in
    training mode rather than drop out silently or differ from its own training forward."""
    if module.training:
        raise RuntimeError(f"{fn}: decoding runs in eval mode (no dropout), got a {type(module).__name__} in training "
                           "mode; call .eval() first")


def _check_step(layer, fn: str, x, cache, masks, heads: int, num_modes: int | None):
    """The checks of every ``step``: ``layer`` decodes (``causal_mode`` set), ``cache`` is a :class:`DecodingCache`
    with room for one more step, ``x`` is one index of the causal mode (size 1 along it) with the batch, other modes
    and dtype of the earlier steps, and ``masks`` are per-mode masks whose causal entry is ``None``. Returns the
    checked masks."""
    c = layer.causal_mode
    if c is None:
        raise ValueError(f"{fn}: decoding needs a layer built with `causal_mode`")
    _check_eval(layer, fn)
    if not isinstance(cache, DecodingCache):
        raise TypeError(f"{fn}: `cache` must come from init_cache(), got {type(cache).__name__}")
    _check_x(x, layer.dim, fn, num_modes)
    nm = x.ndim - 2
    _check_rope_modes(layer.rope_modes, nm, fn)
    if c >= nm:
        raise ValueError(f"{fn}: causal_mode={c} but x {tuple(x.shape)} has only {nm} modes")
    if x.shape[1 + c] != 1:
        raise ValueError(f"{fn}: `x` must be one index of the causal mode {c} (size 1 along it), got shape "
                         f"{tuple(x.shape)}")
    if masks is not None and not isinstance(masks, torch.Tensor) and len(masks) == nm and masks[c] is not None:
        raise ValueError(f"{fn}: `masks[{c}]` (the causal mode's) must be None while decoding")
    sizes = tuple(x.shape[1:-1])
    masks = _check_masks(masks, sizes, fn, x.shape[0], heads)
    cache.check(fn, x.shape[0], sizes[:c] + sizes[c + 1 :], x.dtype)
    return masks


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


class RecordableAttention(nn.Module):
    """Base class of every attention layer whose maps :func:`record_attention` collects (the one way to get attention
    maps: forwards return tensors only).

    A layer subclasses it and, in its ``forward``, computes its maps only while ``self._recording`` is True (the
    normal path pays one ``if``) and hands them to ``self._maybe_record(maps)`` (a list of tensors, detached there).
    Every active ``record_attention`` block adds a sink ``(records, layer_name)`` to the layer; ``records`` receives
    ``(layer_name, maps)``. Blocks nest: an inner recording (e.g. a callback's) leaves the outer one's intact.
    """

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
    (``KroneckerAttention``: the factors ``S_i (B, H, Ni, Ni)``, with ``causal_mode=c`` the causal mode's ``(B, H, T,
    T)`` and every other mode's ``(B, H, T, Ni, Ni)``, one per index of ``c``; ``FullAttention``: the dense
    ``(B, H, N, N)``; ``AxialAttention``: per mode ``(B, H, *fibers, Ni, Ni)``; ``DividedAttention``: its two stages,
    recorded as two layers), the weights *before* attention dropout. Outputs are
    unchanged in eval mode; the dense baselines then leave SDPA for an explicit ``softmax(QK^T) V`` (O(N^2) memory),
    so in training mode with ``attn_dropout > 0`` their dropout masks are drawn differently.
    """
    records: list = []
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, RecordableAttention)]
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
        """``phi(x) (.., n, f)`` of ``x (.., n, E)``: stabilised per row for queries, over the last two dims for keys."""
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


class KroneckerAttention(_Decoder, RecordableAttention):
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
        if kernel not in ("softmax", "linear", *_SCORE_KERNELS):
            raise ValueError(f"KroneckerAttention: `kernel` must be one of {('softmax', 'linear', *_SCORE_KERNELS)}, "
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
        self.qk_bias = bool(qk_bias)
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
        self.score_fn = _SCORE_KERNELS.get(kernel)  # unchecked: forward has checked x

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
        q, k = qk.view(*qk.shape[:-1], 2, self.heads, self.dim_head).movedim(-3, 0).movedim(-2, 2).unbind(0)
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
        b, T, rest = xp.shape[0], xp.shape[1], tuple(xp.shape[2:-1])
        pc, pools = self._causal_pools(xp)
        if self.pool == "mean":
            steps = torch.arange(1, T + 1, device=x.device, dtype=x.dtype).view(1, T, 1, 1)
            prefix = [p.cumsum(1) / steps for p in pools]
        else:
            prefix = [p.cumsum(1) for p in pools]
        qs, ks = self._causal_qk(pc, prefix, order, 0, rest)
        v = self.to_v(xp).view(b, T, *rest, self.heads, self.dim_head).movedim(-2, 1)
        linear, log_scale = self.kernel == "linear", None
        if linear:
            self.favor.step()
            qs = [self.favor(q, is_query=True) for q in qs]
            # the causal mode's keys stabilised one by one (a shared stabiliser would span future keys); every other
            # mode's keys at index t come from the pools up to t already
            k0, log_scale = self.favor.with_log_scale(ks[0])
            ks = [k0] + [self.favor(k, is_query=False) for k in ks[1:]]
        y, maps = _causal_kronecker(
            qs, ks, v, combine=self.combine, kernel="linear" if linear else "softmax", scale=None,
            masks=None if masks is None else [masks[i] for i in order],
            dropout_p=self.attn_dropout if self.training and not linear else 0.0, want_factors=want_maps,
            score_fn=self.score_fn, key_log_scale=log_scale)
        y = self.to_out(y.movedim(1, -2).reshape(b, T, *rest, -1)).movedim(1, 1 + c)
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
        masks = _check_step(self, fn, x, cache, masks, self.heads, self.num_modes)
        c, nm = self.causal_mode, x.ndim - 2
        self._ensure_modes(nm)
        order = [c] + [i for i in range(nm) if i != c]
        xp = x.movedim(1 + c, 1)
        b, rest = xp.shape[0], tuple(xp.shape[2:-1])
        t = cache.steps
        pc, pools = self._causal_pools(xp)
        cache.pools = [p[:, 0] if t == 0 else acc + p[:, 0] for acc, p in
                       zip(cache.pools if t else pools, pools)]
        prefix = [(acc / (t + 1) if self.pool == "mean" else acc).unsqueeze(1) for acc in cache.pools]
        qs, ks = self._causal_qk(pc, prefix, order, t, rest)
        v = self.to_v(xp).view(b, 1, *rest, self.heads, self.dim_head).movedim(-2, 1).reshape(b, self.heads, 1, -1)
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
        y, _ = _apply_rest(z, v, qs[1:], ks[1:], None if masks is None else [masks[i] for i in order[1:]],
                           (*rest, self.dim_head),
                           combine=self.combine, kernel="linear" if linear else "softmax", scale=None, dropout_p=0.0,
                           want_factors=False, score_fn=self.score_fn)
        cache.advance()
        return self.to_out(y.to(x.dtype).movedim(1, -2).reshape(b, 1, *rest, -1)).movedim(1, 1 + c)

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        _check_x(x, self.dim, "KroneckerAttention", self.num_modes)
        self._ensure_modes(x.ndim - 2)
        b, sizes = x.shape[0], tuple(x.shape[1:-1])
        _check_rope_modes(self.rope_modes, len(sizes), "KroneckerAttention")
        _check_causal_range(self.causal_mode, len(sizes), x, "KroneckerAttention")
        masks = _check_masks(masks, sizes, "KroneckerAttention", b, self.heads)
        want_maps = self._recording
        if self.causal_mode is not None:
            y, maps = self._causal_forward(x, masks, want_maps)
            if maps is not None:
                self._maybe_record(maps)
            return y
        qs, ks = self.mode_qk(x)
        # values as a (b, h, n1..nk, e) *view* of the (b, n.., h*e) projection; kron_apply / kron_sum_apply keep that
        # memory layout, so merging the heads before to_out is a view too
        v = self.to_v(x).view(b, *sizes, self.heads, self.dim_head).movedim(-2, 1)
        if self.kernel == "linear":
            self.favor.step()
            phi_q = [self.favor(q, is_query=True) for q in qs]
            phi_k = [self.favor(k, is_query=False) for k in ks]
            out = _linear_attention(list(zip(phi_q, phi_k)), v, self.combine, masks, want_maps)
            y, maps = out if want_maps else (out, None)
        else:
            y, maps = _kronecker_attention(qs, ks, v, self.combine, None, masks,
                                           self.attn_dropout if self.training else 0.0, True, self.score_fn)
        if want_maps:
            self._maybe_record(maps)
        return self.to_out(y.movedim(1, -2).reshape(b, *sizes, -1))


# ------------------------------------------------------------------------------------------- baselines
class _QKV(RecordableAttention):
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
        a = masked_softmax(_dot(q, k), mask)
        return torch.matmul(F.dropout(a, dropout_p), v), a
    return sdpa(q, k, v, mask=mask, dropout_p=dropout_p), None


class FullAttention(_Decoder, _QKV):
    """Flattened high-order attention (HOT eqs 1-2) with SDPA; per-mode masks are combined as a Kronecker AND.
    ``causal_mode=c``: a token at index ``t`` of mode ``c`` attends to the tokens at indices ``<= t``, and
    :meth:`step` decodes along ``c``.

    ``rope_modes``: axial N-d RoPE on the flattened tokens (head dim split between those modes).
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None, attn_dropout=None,
                 bias=True, rope_theta=10000.0, num_modes=None, causal_mode=None):
        super().__init__(dim, num_heads, qk_norm, dropout, dim_head, bias=bias, attn_dropout=attn_dropout)
        self.rope_modes, self.rope_theta, self.num_modes = _mode_tuple(rope_modes, "FullAttention"), rope_theta, num_modes
        self.causal_mode = _check_causal_mode(causal_mode, num_modes, "FullAttention")

    def forward(self, x, masks=None):
        _check_x(x, self.dim, "FullAttention", self.num_modes)
        b, sizes = x.shape[0], tuple(x.shape[1:-1])
        _check_rope_modes(self.rope_modes, len(sizes), "FullAttention")
        _check_causal_range(self.causal_mode, len(sizes), x, "FullAttention")
        masks = _causal_masks(_check_masks(masks, sizes, "FullAttention", b, self.heads), sizes, self.causal_mode,
                              x.device)
        return self._tokens(x, masks)

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: DecodingCache, masks=None) -> torch.Tensor:
        """Incremental decoding along the causal mode ``c``: the output at the next index ``t`` of ``c`` from the slice
        ``x (B, N1..Nk, D)`` with size 1 along ``c`` (a full slice of the other modes), equal to ``layer(x_full)`` at
        ``t`` for the inputs given so far (no attention dropout; no gradients). RoPE on ``c`` rotates at the
        absolute position ``t``.

        ``cache`` (from :meth:`init_cache`) keeps the keys and values of every past token, ``(B, H, t, P, E)`` each
        with ``P = prod(N_i, i != c)``: buffers that grow by doubling, or preallocated with ``init_cache(max_steps)``.
        Per-step cost: the projections ``O(B P D H E)`` and the ``P`` queries against the ``(t + 1) P`` tokens so far
        ``O(B H (t + 1) P^2 E)``, so ``O(B P H E (D + (t + 1) P))``; memory ``O(B H t P E)``.
        ``masks``: per-mode masks of the other modes (the causal mode's entry must be ``None``)."""
        masks = _check_step(self, "FullAttention.step", x, cache, masks, self.heads, self.num_modes)
        y = self._tokens(x, masks, cache, self.causal_mode)
        cache.advance()
        return y

    def _tokens(self, x, masks, cache=None, causal_mode=None, stage=0, record=True):
        """Attention over the flattened tokens of ``x (B, N.., D)`` (checked; ``masks`` checked, per mode, any causal
        mask already in). With a ``cache``: ``x`` is the next index of ``causal_mode``; its keys / values (RoPE at
        that absolute index) join the cached ones of stage ``stage``, which its queries attend to. Maps are recorded
        (under :func:`record_attention`) only without a cache and with ``record``."""
        b, sizes = x.shape[0], tuple(x.shape[1:-1])
        q, k, v = (t.reshape(b, self.heads, -1, self.dim_head) for t in self.qkv(x))
        offsets = None
        if cache is not None:
            offsets = [0] * len(sizes)
            offsets[causal_mode] = cache.steps
        q = axial_rotary(q, sizes, self.rope_modes, self.rope_theta, offsets)
        k = axial_rotary(k, sizes, self.rope_modes, self.rope_theta, offsets)
        mask = _kron_and(masks, sizes, x.device)
        want = record and self._recording and cache is None
        if cache is not None:  # every past slice's tokens, masked along the other modes like this slice's
            k, v = (t.flatten(2, 3) for t in cache.append(k.unsqueeze(2), v.unsqueeze(2), stage))
            if mask is not None:
                mask = mask.unsqueeze(-2).expand(*mask.shape[:-1], cache.steps + 1, mask.shape[-1]).flatten(-2)
        y, a = _attend(q, k, v, mask, self.attn_dropout if self.training and cache is None else 0.0, want)
        if want:
            self._maybe_record([a])
        return self.out(y.view(b, self.heads, *sizes, self.dim_head))


class AxialAttention(_Decoder, _QKV):
    """Attention along each mode separately, for every fiber of the other modes (Ho et al. 2019).

    ``combine="sum"``: one shared qkv projection, ``y = (1/k) sum_i attn_i(x)`` (the dense-fiber analogue of the
    Kronecker sum). ``combine="sequential"``: per-mode qkv projections applied one mode after another.
    ``modes``: the 0-based modes to attend along, in order (default: all). ``modes=(0,)`` on a ``(B, P, N, D)``
    traffic tensor is temporal attention for every sensor, ``modes=(1,)`` spatial attention for every step.
    ``causal_mode=c``: attention along ``c`` is lower-triangular (along the other modes a fibre stays at one index of
    ``c``, so either combine is causal), and :meth:`step` decodes along ``c``.
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None,
                 combine="sum", num_modes=None, modes=None, attn_dropout=None, bias=True, rope_theta=10000.0,
                 causal_mode=None):
        super().__init__(dim, num_heads, qk_norm, dropout, dim_head, bias=bias, attn_dropout=attn_dropout)
        self.causal_mode = _check_causal_mode(causal_mode, num_modes, "AxialAttention")
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

    def _along(self, q, k, v, mode, mask, want, cache=None):
        """Attention along ``mode`` of ``(b, h, n1..nk, e)`` for every fiber. With a ``cache`` (``mode`` is the causal
        one, of size 1 here): this index's keys / values (RoPE at its absolute position) join the cached past ones,
        which the queries attend to (``mask`` is then None)."""
        q, k, v = (t.movedim(2 + mode, -2) for t in (q, k, v))
        if self.rotary is not None and mode in self.rope_modes:
            pos = None if cache is None else torch.arange(cache.steps, cache.steps + 1, device=q.device)
            q, k = self.rotary(q, pos), self.rotary(k, pos)
        if cache is not None:  # stored as (b, h, fibers.., steps, e): each fibre's past rows contiguous
            k, v = cache.append(k, v, dim=-2)
        if mask is not None:
            while mask.ndim < 4:
                mask = mask.unsqueeze(0)
            mask = mask.view(*mask.shape[:2], *([1] * (q.ndim - 4)), *mask.shape[-2:])
        y, a = _attend(q, k, v, mask, self.attn_dropout if self.training and cache is None else 0.0, want)
        return y.movedim(-2, 2 + mode), a

    def _modes_for(self, x, fn: str) -> tuple[int, ...]:
        """The modes attended along for ``x`` (checked against its modes); builds the lazy sequential projections."""
        nm = x.ndim - 2
        modes = tuple(range(nm)) if self.modes is None else self.modes
        if max(modes) >= nm:
            raise ValueError(f"{fn}: `modes`={modes} but x {tuple(x.shape)} has only {nm} modes")
        _check_rope_modes(self.rope_modes, nm, fn)
        self._ensure(nm)
        _check_causal_range(self.causal_mode, nm, x, fn)
        return modes

    def forward(self, x, masks=None):
        _check_x(x, self.dim, "AxialAttention", self.num_modes if self.combine == "sequential" else None)
        sizes = tuple(x.shape[1:-1])
        modes = self._modes_for(x, "AxialAttention")
        masks = _causal_masks(_check_masks(masks, sizes, "AxialAttention", x.shape[0], self.heads), sizes,
                              self.causal_mode, x.device)
        return self._run(x, masks or [None] * len(sizes), modes)

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: DecodingCache, masks=None) -> torch.Tensor:
        """Incremental decoding along the causal mode ``c``: the output at the next index ``t`` of ``c`` from the slice
        ``x (B, N1..Nk, D)`` with size 1 along ``c`` (a full slice of the other modes), equal to ``layer(x_full)`` at
        ``t`` for the inputs given so far (no attention dropout; no gradients). RoPE on ``c`` rotates at the
        absolute position ``t``.

        ``cache`` (from :meth:`init_cache`) keeps the keys and values of the stage that attends along ``c`` for
        every past step, ``(B, H, N.., t, E)`` each (the other modes ``N..``, ``P = prod(N_i, i != c)`` fibres):
        buffers that grow by doubling, or preallocated with ``init_cache(max_steps)``. Per-step cost: the
        projections ``O(B P D H E)`` (plus ``O(B P H^2 E^2)`` per later stage of ``combine="sequential"``),
        attention along every other attended mode ``i`` ``O(B H P N_i E)`` and along ``c`` each fibre's row over
        the ``t + 1`` steps so far ``O(B H (t + 1) P E)``: ``O(B P H E (D + t + sum_{i != c} N_i))``; memory
        ``O(B H t P E)``.
        ``masks``: per-mode masks of the other modes (the causal mode's entry must be ``None``)."""
        fn = "AxialAttention.step"
        masks = _check_step(self, fn, x, cache, masks, self.heads,
                            self.num_modes if self.combine == "sequential" else None)
        y = self._run(x, masks or [None] * (x.ndim - 2), self._modes_for(x, fn), cache)
        cache.advance()
        return y

    def _run(self, x, masks, modes, cache=None):
        """The attention stages on checked inputs; with a ``cache`` the stage along the causal mode decodes."""
        want = self._recording and cache is None
        c = None if cache is None else self.causal_mode
        maps = []
        q, k, v = self.qkv(x)
        if self.combine == "sum":
            y = None
            for m in modes:
                ym, a = self._along(q, k, v, m, masks[m], want, cache if m == c else None)
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
                y, a = self._along(q, k, y, m, masks[m], want, cache if m == c else None)
                maps.append(a)
        if want:
            self._maybe_record(maps)
        return self.out(y)


class DividedAttention(_Decoder, nn.Module):
    """TimeSformer divided attention: full attention along ``first_mode``, then jointly over the other modes.

    Returns ``T(x) + S(x + T(x))`` so that the block's residual reproduces TimeSformer's
    ``x <- x + T(x); x <- x + S(x)``: ``T`` is attention along ``first_mode`` for every fiber of the other modes
    (``self.first``), ``S`` the flattened attention over the other modes for every index of ``first_mode``
    (``self.rest``). Masks of any documented shape, per sample or per head, apply in either stage. With a single mode
    there are no other modes and ``S`` attends along that mode a second time. Inside a pre-norm
    :class:`~hoformer.layers.blocks.Block` (one norm before the whole layer) ``S`` sees ``LN(x) + T`` where
    TimeSformer's own block, with a norm per stage, feeds ``LN(x + T)``.
    ``causal_mode=c``: the stage that attends along ``c`` (``T`` if ``c = first_mode``, else ``S``) is
    lower-triangular along ``c``, and :meth:`step` decodes along ``c``.
    """

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None,
                 first_mode=0, attn_dropout=None, bias=True, rope_theta=10000.0, num_modes=None, causal_mode=None):
        super().__init__()
        self.causal_mode = _check_causal_mode(causal_mode, num_modes, "DividedAttention")
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

    def _check_first_mode(self, x, fn: str) -> None:
        if self.first_mode >= x.ndim - 2:
            raise ValueError(f"{fn}: first_mode={self.first_mode} but x {tuple(x.shape)} has only {x.ndim - 2} modes")

    def forward(self, x, masks=None):
        _check_x(x, self.dim, "DividedAttention", self.num_modes)
        sizes = tuple(x.shape[1:-1])
        nm = len(sizes)
        _check_rope_modes(self.rope_modes, nm, "DividedAttention")
        _check_causal_range(self.causal_mode, nm, x, "DividedAttention")
        masks = _causal_masks(_check_masks(masks, sizes, "DividedAttention", x.shape[0], self.first.heads), sizes,
                              self.causal_mode, x.device)
        self._check_first_mode(x, "DividedAttention")
        return self._run(x, masks or [None] * nm)

    @torch.no_grad()
    def step(self, x: torch.Tensor, cache: DecodingCache, masks=None) -> torch.Tensor:
        """Incremental decoding along the causal mode ``c``: the output at the next index ``t`` of ``c`` from the slice
        ``x (B, N1..Nk, D)`` with size 1 along ``c`` (a full slice of the other modes), equal to ``layer(x_full)`` at
        ``t`` for the inputs given so far (no attention dropout; no gradients). RoPE on ``c`` rotates at the
        absolute position ``t``.

        ``cache`` (from :meth:`init_cache`) keeps the keys and values of the stage that attends along ``c`` (of both
        stages with a single mode) for every past step, ``t P`` of each per head with ``P = prod(N_i, i != c)``:
        buffers that grow by doubling, or preallocated with ``init_cache(max_steps)``. Per-step cost, with ``F`` the
        size of ``first_mode``: the projections ``O(B P D H E)``, and if ``c = first_mode`` the ``T`` row of every
        fibre over the ``t + 1`` steps so far ``O(B H (t + 1) P E)`` and ``S`` over the slice ``O(B H P^2 E)``, else
        ``T`` over the slice ``O(B H P F E)`` and ``S``, for each of the ``F`` indices of ``first_mode``, ``P / F``
        queries against ``(t + 1) P / F`` tokens ``O(B H (t + 1) P^2 E / F)``; memory ``O(B H t P E)``.
        ``masks``: per-mode masks of the other modes (the causal mode's entry must be ``None``)."""
        fn = "DividedAttention.step"
        masks = _check_step(self, fn, x, cache, masks, self.first.heads, self.num_modes)
        self._check_first_mode(x, fn)
        y = self._run(x, masks or [None] * (x.ndim - 2), cache)
        cache.advance()
        return y

    def _run(self, x, masks, cache=None):
        """Both stages on checked inputs; with a ``cache`` the stage along the causal mode decodes."""
        nm = x.ndim - 2
        fm, c = self.first_mode, None if cache is None else self.causal_mode
        # attention along `first_mode` only: move it to mode 0, treat the others as fibers via axial on a 2-mode view
        xt = x.movedim(1 + fm, 1)
        b, n0 = xt.shape[:2]
        rest_sizes = xt.shape[2:-1]
        x2 = xt.reshape(b, n0, -1, self.dim)  # (b, n0, prod(rest), d)
        q, k, v = self.first.qkv(x2)
        want = self.first._recording and cache is None
        t, a_t = self.first._along(q, k, v, 0, masks[fm], want, cache if c == fm else None)
        if want:
            self.first._maybe_record([a_t])
        t = self.first.out(t).view(xt.shape).movedim(1, 1 + fm)
        h = x + t
        if nm == 1:  # no other modes: the joint stage attends along the same mode again (same masks)
            return t + self.rest._tokens(h, masks, cache, c, stage=1)
        # joint attention over the other modes, for every position of first_mode
        hs = h.movedim(1 + fm, 1).reshape(b * n0, *rest_sizes, self.dim)
        # the joint stage's batch is (b, n0) flattened: a per-sample (B, H|1, n, n) mask follows its sample to
        # the n0 rows b * n0 .. b * n0 + n0 - 1
        rest_masks = [m.repeat_interleave(n0, 0) if m is not None and m.ndim == 4 and m.shape[0] > 1 else m
                      for i, m in enumerate(masks) if i != fm]
        decode = c is not None and c != fm
        s = self.rest._tokens(hs, rest_masks, cache if decode else None, c - (c > fm) if decode else None,
                              record=cache is None)
        return t + s.view(b, n0, *rest_sizes, self.dim).movedim(1, 1 + fm)


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
