"""Dense attention baselines on channels-last ``x (B, N1..Nk, D)``: flattened (:class:`FullAttention`, HOT eqs 1-2),
axial (:class:`AxialAttention`) and TimeSformer's divided space-time attention (:class:`DividedAttention`), each
causal along a mode and decoding incrementally when built with ``causal_mode``.

Axis legend: ``b`` batch, ``h`` heads, ``n1..nk`` modes, ``d`` model dim, ``e`` per-head dim.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from hoformer._checks import check_int
from hoformer.functional.dense import sdpa
from hoformer.functional.kronecker import kron_dense
from hoformer.functional.dropout_bits import dropout
from hoformer.functional import unchecked

from ._common import (
    _CheckOnce,
    _causal_masks,
    _check_causal_mode,
    _check_layer_args,
    _mode_tuple,
)
from .decoding import DecodingCache, _Decoder, _step_entry
from .pos import RotaryEmbedding, axial_rotary
from .recording import RecordableAttention
from .dropout import Dropout

__all__ = ["FullAttention", "AxialAttention", "DividedAttention"]


def _kron_and(masks: Sequence[torch.Tensor | None], sizes: Sequence[int], device) -> torch.Tensor | None:
    """Dense mask over flattened tokens: a pair is allowed iff it is allowed in every mode (matches the product)."""
    if masks is None or all(m is None for m in masks):
        return None
    ones = [torch.ones(n, n, device=device) if m is None else m.to(torch.uint8) for m, n in zip(masks, sizes)]
    full = kron_dense(ones).bool()
    return full.view((1,) * (4 - full.ndim) + tuple(full.shape)) if full.ndim < 4 else full


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
        self.to_out = nn.Sequential(nn.Linear(inner, dim, bias=bias), Dropout(dropout))
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
        a = unchecked.masked_softmax(unchecked.dot(q, k), mask)
        return torch.matmul(dropout(a, dropout_p), v), a
    return sdpa(q, k, v, mask=mask, dropout_p=dropout_p), None


class FullAttention(_CheckOnce, _Decoder, _QKV):
    """Flattened high-order attention (HOT eqs 1-2) with SDPA; per-mode masks are combined as a Kronecker AND.
    ``causal_mode=c``: a token at index ``t`` of mode ``c`` attends to the tokens at indices ``<= t``, and
    :meth:`step` decodes along ``c``.

    ``rope_modes``: axial N-d RoPE on the flattened tokens (head dim split between those modes).
    """

    record_kind = "full"

    def __init__(self, dim, num_heads=8, qk_norm=True, rope_modes=(), dropout=0.0, dim_head=None, attn_dropout=None,
                 bias=True, rope_theta=10000.0, num_modes=None, causal_mode=None):
        super().__init__(dim, num_heads, qk_norm, dropout, dim_head, bias=bias, attn_dropout=attn_dropout)
        self.rope_modes, self.rope_theta, self.num_modes = _mode_tuple(rope_modes, "FullAttention"), rope_theta, num_modes
        self.causal_mode = _check_causal_mode(causal_mode, num_modes, "FullAttention")
        if num_modes is not None:
            self._check_modes(num_modes, "FullAttention")

    def forward(self, x, masks=None):
        given, masks = masks, self._entry(x, masks)
        sizes = tuple(x.shape[1:-1])
        return self._exit(self._tokens(x, _causal_masks(masks, sizes, self.causal_mode, x.device)), x, given)

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
        masks = _step_entry(self, "FullAttention.step", x, cache, masks)
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


class AxialAttention(_CheckOnce, _Decoder, _QKV):
    """Attention along each mode separately, for every fiber of the other modes (Ho et al. 2019).

    ``combine="sum"``: one shared qkv projection, ``y = (1/k) sum_i attn_i(x)`` (the dense-fiber analogue of the
    Kronecker sum). ``combine="sequential"``: per-mode qkv projections applied one mode after another.
    ``modes``: the 0-based modes to attend along, in order (default: all). ``modes=(0,)`` on a ``(B, P, N, D)``
    traffic tensor is temporal attention for every sensor, ``modes=(1,)`` spatial attention for every step.
    ``causal_mode=c``: attention along ``c`` is lower-triangular (along the other modes a fibre stays at one index of
    ``c``, so either combine is causal), and :meth:`step` decodes along ``c``.
    """

    record_kind = "axial"

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
        if num_modes is not None:
            self._check_modes(num_modes, "AxialAttention")

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

    def _modes_for(self, nm: int) -> tuple[int, ...]:
        """The modes attended along for an input of ``nm`` modes (checked by :meth:`_check_mode_args`); builds the
        lazy sequential projections."""
        self._ensure(nm)
        return tuple(range(nm)) if self.modes is None else self.modes

    def _input_modes(self) -> int | None:
        return self.num_modes if self.combine == "sequential" else None

    def _check_mode_args(self, nm: int, where: str, fn: str) -> None:
        if self.modes is not None and max(self.modes) >= nm:
            raise ValueError(f"{fn}: `modes`={self.modes} but {where} has only {nm} modes")
        super()._check_mode_args(nm, where, fn)

    def forward(self, x, masks=None):
        given, masks = masks, self._entry(x, masks)
        sizes = tuple(x.shape[1:-1])
        masks = _causal_masks(masks, sizes, self.causal_mode, x.device)
        return self._exit(self._run(x, masks or [None] * len(sizes), self._modes_for(len(sizes))), x, given)

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
        masks = _step_entry(self, fn, x, cache, masks)
        y = self._run(x, masks or [None] * (x.ndim - 2), self._modes_for(x.ndim - 2), cache)
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


class DividedAttention(_CheckOnce, _Decoder, nn.Module):
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
        if num_modes is not None:
            self._check_modes(num_modes, "DividedAttention")

    @property
    def heads(self) -> int:
        return self.first.heads

    def _weight(self) -> torch.Tensor:
        return self.first.to_qkv.weight

    def _check_mode_args(self, nm: int, where: str, fn: str) -> None:
        super()._check_mode_args(nm, where, fn)
        if self.first_mode >= nm:
            raise ValueError(f"{fn}: first_mode={self.first_mode} but {where} has only {nm} modes")

    def forward(self, x, masks=None):
        given, masks = masks, self._entry(x, masks)
        sizes = tuple(x.shape[1:-1])
        masks = _causal_masks(masks, sizes, self.causal_mode, x.device)
        return self._exit(self._run(x, masks or [None] * len(sizes)), x, given)

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
        masks = _step_entry(self, fn, x, cache, masks)
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
        hs = h.movedim(1 + fm, 1).flatten(0, 1)  # (b * n0, *rest, d): the joint stage's batch
        # the joint stage's batch is (b, n0) flattened: a per-sample (B, H|1, n, n) mask follows its sample to
        # the n0 rows b * n0 .. b * n0 + n0 - 1
        rest_masks = [m.repeat_interleave(n0, 0) if m is not None and m.ndim == 4 and m.shape[0] > 1 else m
                      for i, m in enumerate(masks) if i != fm]
        decode = c is not None and c != fm
        s = self.rest._tokens(hs, rest_masks, cache if decode else None, c - (c > fm) if decode else None,
                              record=cache is None)
        return t + s.unflatten(0, (b, n0)).movedim(1, 1 + fm)
