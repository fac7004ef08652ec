"""HOBA layers (paper 004): triplet attention, cross-block attention, and the matched 2D baselines.

Axis legend: ``b`` batch, ``n`` tokens (``L``), ``d`` model dim, ``h`` heads, ``e`` per-head dim.

Every attention layer here shares one call signature (1D token sequences with key padding)::

    forward(x (B, L, D), mask=None (B, L) bool True = real token) -> y (B, L, D)

* :class:`TripletAttention` - five projections ``q, k1, k2, v1, v2``, block-diagonal triplet attention (eqs 2-4)
  per head, optional cross-block routing (eqs 5-7), output projection ``W_O`` (Algorithm 1). ``block_size=None``
  is the full (unblocked) 3D attention: one window over the whole sequence.
* :class:`HOBAttention` - the HOBA layer: :class:`TripletAttention` with cross-block routing on.
* :class:`BlockAttention2D` - pairwise attention with the same windows, overlap and cross-block routing
  (the controlled 2D block-local baseline, Table 7); ``block_size=None`` is standard full 2D attention.
* :class:`CrossBlockAttention` - the parameter-free block-summary attention of eqs 5-7 on per-head outputs.
* :class:`HOBABlock` - transformer layer (attention + MLP, residuals, LayerNorm) around one of the above.

Fusion order (eqs 4-7 of section 3, which this module follows): each head's local outputs are first averaged over
the windows covering each token (eq 4), the block means ``r_m`` are taken of those averaged outputs (eq 5, real
tokens only), ``o_i + sum_m' A[m(i), m'] r_m'`` is added per head with scale ``1 / sqrt(head dim)`` (eqs 6-7), and
only then are heads concatenated and ``W_O`` applied. Algorithm 1 of the appendix writes the same steps with the
overlap normalisation after the cross-block update (lines 19-22), which would also divide the cross-block term by the
overlap count; the equations are taken as the specification.

Windows: the blocked layers use the fixed grid of eq 3 (starts ``0, s, 2s, ...``) up to the last start below the
input length, padding the input with masked positions to :func:`~hoformer.functional.triplet_grid_length` and
cropping the output, so a token's output does not depend on how much padding its batch has (the functional
:func:`~hoformer.functional.triplet_attention` ends an off-grid length with a window ``[L - s, L)`` instead).

Attention maps, collected by :func:`hoformer.layers.record_attention`: ``[local, cross]`` with local
``(B, H, W, s, s, s)`` triplet cubes / ``(B, H, W, s, s)`` 2D windows / ``(B, H, L, L)`` full 2D, and cross
``(B, H, M, M)`` when cross-block routing is on.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hoformer._checks import check_int
from hoformer.functional import unchecked
from hoformer.functional.triplet import (
    block_attention_weights,
    cross_block_attention,
    cross_block_attention_weights,
    triplet_attention_weights,
)

from ._common import CheckedMasks, _check_dtype
from .recording import RecordableAttention
from .blocks import Mlp
from .dropout import Dropout

__all__ = [
    "TripletAttention",
    "HOBAttention",
    "BlockAttention2D",
    "CrossBlockAttention",
    "HOBABlock",
    "build_text_attention",
    "TEXT_ATTENTIONS",
]

TEXT_ATTENTIONS = ("hoba", "triplet_full", "block2d", "full2d")


def _check_seq(x, mask, dim: int, name: str, dtype: torch.dtype | None = None):
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = getattr(x, "dtype", type(x).__name__)
        raise TypeError(f"{name}: `x` must be a floating-point tensor (B, L, {dim}), got {got}")
    _check_dtype(x, dtype, name)
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"{name}: `x` must have shape (B, L, {dim}), got {tuple(x.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"{name}: `mask` must be a bool tensor (B, L), got {getattr(mask, 'dtype', type(mask))}")
        if mask.shape != x.shape[:2]:
            raise ValueError(f"{name}: `mask` must have shape {tuple(x.shape[:2])} (B, L), got {tuple(mask.shape)}")


class CrossBlockAttention(nn.Module):
    """Eqs 5-7 on per-head local outputs ``o (B, H, L, E)``: block means ``r_m`` over ``[m b, (m+1) b)``,
    ``softmax(r_m . r_m' / sqrt(E))`` over blocks, ``o_i += sum_m' A[m(i), m'] r_m'``. Parameter-free."""

    def __init__(self, block_size: int) -> None:
        super().__init__()
        self.block_size = block_size

    def forward(self, o, mask=None):
        if isinstance(mask, CheckedMasks):  # checked by the caller's entry
            return unchecked.cross_block_attention(o, self.block_size, mask.masks)
        return cross_block_attention(o, block_size=self.block_size, mask=mask)

    def weights(self, o, mask=None) -> torch.Tensor:
        """The block attention ``(B, H, M, M)`` that :meth:`forward` applies to ``o``."""
        return cross_block_attention_weights(o, block_size=self.block_size, mask=mask)

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"


class _HeadsAttention(RecordableAttention):
    """Shared plumbing: fused input projection into ``n_proj`` per-head tensors, local attention, optional
    cross-block routing, merge heads, ``W_O``."""

    n_proj = 3

    def __init__(self, dim: int, num_heads: int = 8, block_size: int | None = 32, overlap: float = 0.25,
                 cross_block: bool = False, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{type(self).__name__}: dim={dim} must be divisible by num_heads={num_heads}")
        check_int(type(self).__name__, "block_size", block_size, optional=True)
        if isinstance(overlap, bool) or not isinstance(overlap, (int, float)):
            raise TypeError(f"{type(self).__name__}: `overlap` must be a float in [0, 1), got "
                            f"{type(overlap).__name__} {overlap!r}")
        if not 0.0 <= overlap < 1.0:
            raise ValueError(f"{type(self).__name__}: `overlap` must be in [0, 1), got {overlap!r}")
        if cross_block and block_size is None:
            raise ValueError(f"{type(self).__name__}: cross_block needs a block_size (got block_size=None)")
        self.dim, self.heads, self.dim_head = dim, num_heads, dim // num_heads
        self.block_size, self.overlap = block_size, overlap
        self.to_in = nn.Linear(dim, self.n_proj * dim, bias=bias)
        self.cross = CrossBlockAttention(block_size) if cross_block else None
        self.to_out = nn.Sequential(nn.Linear(dim, dim, bias=bias), Dropout(dropout))

    def _local(self, xs, mask, want: bool):  # pragma: no cover - abstract
        raise NotImplementedError

    def window_starts(self, seq_len: int) -> list[int]:
        """Start positions of the local windows this layer uses on a ``seq_len`` input (the fixed grid of eq 3 up
        to the last start below ``seq_len``; ``[0]`` for the unblocked variants)."""
        check_int(f"{type(self).__name__}.window_starts", "seq_len", seq_len)
        if self.block_size is None:
            return [0]
        return unchecked.triplet_windows(unchecked.triplet_grid_length(seq_len, self.block_size, self.overlap), self.block_size, self.overlap)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, L, D)``, ``mask (B, L)`` bool (True = real token) or None, or the caller's
        :class:`~hoformer.layers.CheckedMasks` of it (no per-call check) -> ``(B, L, D)``."""
        if isinstance(mask, CheckedMasks):
            mask = mask.masks
        else:
            _check_seq(x, mask, self.dim, type(self).__name__, self.to_in.weight.dtype)
        b, n, _ = x.shape
        xs = self.to_in(x).view(b, n, self.n_proj, self.heads, self.dim_head).permute(2, 0, 3, 1, 4).unbind(0)
        want = self._recording  # maps only while record_attention is active
        grid = n if self.block_size is None else unchecked.triplet_grid_length(n, self.block_size, self.overlap)
        if grid > n:  # fixed windows (eq 3) whatever the batch's padding: pad with masked positions, crop after
            real = mask if mask is not None else x.new_ones(b, n, dtype=torch.bool)
            o, maps = self._local([F.pad(t, (0, 0, 0, grid - n)) for t in xs], F.pad(real, (0, grid - n)), want)
            o = o[:, :, :n]
        else:
            o, maps = self._local(xs, mask, want)
        if self.cross is not None:
            if want:
                maps.append(self.cross.weights(o.detach(), mask=mask))
            o = self.cross(o, mask=CheckedMasks(mask))
        if want:
            self._maybe_record(maps)
        return self.to_out(o.transpose(1, 2).reshape(b, n, self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, block_size={self.block_size}, overlap={self.overlap}"


class TripletAttention(_HeadsAttention):
    """Multi-head block-diagonal triplet attention (HOBA eqs 2-4, Algorithm 1) with projections
    ``Q, K1, K2, V1, V2 = X W`` and output projection ``W_O``. ``block_size=None``: full 3D attention (one window
    spanning the sequence, cost ``O(L^3 d)``); ``cross_block=True`` adds eqs 5-7 (see :class:`HOBAttention`)."""

    record_kind = "triplet"

    n_proj = 5

    def _local(self, xs, mask, want):
        q, k1, k2, v1, v2 = xs
        bs = self.block_size or q.shape[2]
        o = unchecked.triplet_attention(q, k1, k2, v1, v2, bs, self.overlap, None, mask)
        maps = []
        if want:
            maps.append(triplet_attention_weights(q.detach(), k1.detach(), k2.detach(), block_size=bs,
                                                  overlap=self.overlap, mask=mask))
        return o, maps


class HOBAttention(TripletAttention):
    """The HOBA layer (Algorithm 1): block-diagonal triplet attention fused with cross-block attention."""

    def __init__(self, dim: int, num_heads: int = 8, block_size: int = 32, overlap: float = 0.25,
                 cross_block: bool = True, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__(dim, num_heads, block_size, overlap, cross_block, bias, dropout)


class BlockAttention2D(_HeadsAttention):
    """Pairwise softmax attention inside the HOBA windows (same block size, overlap and cross-block routing);
    ``block_size=None``: standard full 2D multi-head attention (eq 1)."""

    record_kind = "block"

    def _local(self, xs, mask, want):
        q, k, v = xs
        if self.block_size is None:
            if want:
                t = torch.matmul(q, k.transpose(-1, -2)) * self.dim_head**-0.5
                t = t.to(torch.promote_types(t.dtype, torch.float32))  # fp16/bf16 softmax in fp32, fp64 kept
                a = unchecked.masked_softmax(t, None if mask is None else mask[:, None, None, :]).to(q.dtype)
                o = torch.matmul(a, v)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None, None, :])
            if mask is not None:
                o = o * mask[:, None, :, None]
                if want:
                    a = a * mask[:, None, :, None]
            return o, ([a] if want else [])
        o = unchecked.block_attention(q, k, v, self.block_size, self.overlap, None, mask)
        if not want:
            return o, []
        return o, [block_attention_weights(q.detach(), k.detach(), block_size=self.block_size, overlap=self.overlap,
                                           mask=mask)]


def build_text_attention(name: str, dim: int, num_heads: int, block_size: int = 32, overlap: float = 0.25,
                         cross_block: bool = True, bias: bool = True, dropout: float = 0.0) -> nn.Module:
    """``"hoba"`` (triplet, blocks, cross-block optional) | ``"triplet_full"`` (unblocked 3D) | ``"block2d"``
    (2D block-local, same blocks / overlap / cross-block) | ``"full2d"`` (standard attention). ``cross_block``
    applies to the blocked variants only."""
    kw = dict(bias=bias, dropout=dropout)
    if name == "hoba":
        return TripletAttention(dim, num_heads, block_size, overlap, cross_block, **kw)
    if name == "triplet_full":
        return TripletAttention(dim, num_heads, None, 0.0, False, **kw)
    if name == "block2d":
        return BlockAttention2D(dim, num_heads, block_size, overlap, cross_block, **kw)
    if name == "full2d":
        return BlockAttention2D(dim, num_heads, None, 0.0, False, **kw)
    raise ValueError(f"build_text_attention: unknown attention {name!r}; expected one of {TEXT_ATTENTIONS}")


class HOBABlock(nn.Module):
    """Transformer encoder layer: ``x + Attn(LN x)``, ``x + MLP(LN x)`` (``norm_first=True``) or RoBERTa's
    post-norm ``LN(x + Attn x)``, ``LN(x + MLP x)``. Padded positions are kept at zero attention output."""

    def __init__(self, dim: int, num_heads: int, attention: str = "hoba", mlp_ratio: float = 4.0,
                 dropout: float = 0.1, norm_first: bool = True, **attn_kw) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = build_text_attention(attention, dim, num_heads, dropout=dropout, **attn_kw)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout=dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, L, D)``, ``mask (B, L)`` or the caller's :class:`~hoformer.layers.CheckedMasks` of it."""
        h = self.norm1(x) if self.norm_first else x
        a = self.attn(h, mask=mask)
        if self.norm_first:
            x = x + a
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + a)
        return self.norm2(x + self.mlp(x))
