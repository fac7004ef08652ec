"""Positional encodings for tensors with any number of modes.

Axis legend: ``b`` batch, ``h`` heads, ``n`` positions along one mode, ``d`` features.

* :class:`RotaryEmbedding` - RoPE (Su et al. 2021). HOT applies it *per mode* to the pooled queries/keys of that
  mode (1-D positions ``0..Ni-1``), so each factor ``S_i`` only sees relative offsets along mode ``i``. For
  attention over several modes at once (full / divided baselines) the head dimension is split between the rotated
  modes (axial N-d RoPE).
* :class:`AbsolutePositionalEncoding` - ``"learned"`` (sum of one learned table per mode, timm's factorised
  video embedding) or ``"sincos"`` (fixed, feature dimension split between modes, as in MAE 2-D/3-D); ``"none"``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from hoformer._checks import check_int, is_int

__all__ = ["RotaryEmbedding", "rotate_half", "apply_rotary", "axial_rotary", "AbsolutePositionalEncoding", "sincos_1d"]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (..., n, d)`` by angles given as ``cos/sin (n, d)`` (broadcast over leading dims)."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding on the last dim (size ``dim``, even).

    ``forward(x, dim_offset=None)``: ``x (..., n, d)`` -> same shape, positions ``0..n-1`` along dim ``-2``.
    ``(q . k)`` after rotation depends only on the position *difference* (tested).
    """

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RotaryEmbedding: `dim` must be even, got {dim}")
        self.dim, self.theta = dim, theta

    def inv_freq(self, device=None) -> torch.Tensor:
        """Frequencies in float32, made on ``device`` (no host-to-device copy per call). Deliberately not a buffer:
        ``model.to(torch.bfloat16)`` would round them (an 8-bit mantissa moves the angle at position 512 by up to
        ~0.2 rad and breaks the relative property)."""
        return 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim))

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 ``cos, sin (n, d)`` of ``positions (n,)``, whatever the module's dtype."""
        freqs = torch.outer(positions.float(), self.inv_freq(positions.device))  # (n, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"RotaryEmbedding: expected last dim {self.dim}, got shape {tuple(x.shape)}")
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        elif not isinstance(positions, torch.Tensor) or positions.shape != (x.shape[-2],):
            got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise ValueError(f"RotaryEmbedding: `positions` must be a 1-D tensor of length x.shape[-2]={x.shape[-2]}, "
                             f"got {got}")
        cos, sin = self.angles(positions)
        return apply_rotary(x, cos.to(x.dtype), sin.to(x.dtype))


def axial_rotary(x: torch.Tensor, sizes: Sequence[int], rope_modes: Sequence[int], theta: float = 10000.0,
                 offsets: Sequence[int] | None = None):
    """N-d axial RoPE on flattened tokens ``x (..., prod(sizes), d)``: the head dim is split evenly (in even chunks)
    between the modes of ``rope_modes`` and each chunk is rotated by its mode's coordinate. ``offsets`` (one int per
    mode, default zeros): the coordinate of each mode's first index, e.g. the absolute position of a decoded slice."""
    if not rope_modes:
        return x
    k = len(sizes)
    bad = [m for m in rope_modes if not is_int(m) or not 0 <= m < k]
    if bad:
        raise ValueError(f"axial_rotary: `rope_modes` must be 0-based mode indices in [0, {k}) for sizes "
                         f"{tuple(sizes)}, got {tuple(rope_modes)}")
    if x.ndim < 2 or x.shape[-2] != math.prod(sizes):
        raise ValueError(f"axial_rotary: `x` must have shape (..., prod(sizes)={math.prod(sizes)}, d) for sizes "
                         f"{tuple(sizes)}, got {tuple(x.shape)}")
    d = x.shape[-1]
    chunk = (d // len(rope_modes)) // 2 * 2
    if chunk == 0:
        raise ValueError(f"axial_rotary: head dim {d} too small for {len(rope_modes)} rotary modes")
    offsets = (0,) * k if offsets is None else tuple(offsets)
    grids = torch.meshgrid(*[torch.arange(o, o + n, device=x.device) for o, n in zip(offsets, sizes)], indexing="ij")
    parts, start = [], 0
    for m in rope_modes:
        cos, sin = RotaryEmbedding(chunk, theta).angles(grids[m].reshape(-1))
        parts.append(apply_rotary(x[..., start : start + chunk], cos.to(x.dtype), sin.to(x.dtype)))
        start += chunk
    parts.append(x[..., start:])
    return torch.cat(parts, dim=-1)


def sincos_1d(n: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed sin-cos table ``(n, dim)`` (``dim`` even)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    omega = 1.0 / temperature ** (torch.arange(dim // 2, dtype=torch.float32) / max(1, dim // 2))
    ang = pos * omega[None]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class AbsolutePositionalEncoding(nn.Module):
    """Additive absolute encoding for ``x (B, N1..Nk, D)``.

    Args:
        sizes: ``(N1, .., Nk)``.
        dim: feature size ``D``.
        kind: ``"learned"`` | ``"sincos"`` | ``"none"``.
        modes: which modes get an encoding (default all); e.g. skip the variate mode to stay permutation-equivariant.

    ``"sincos"`` gives the ``j``-th encoded mode ``m`` the feature chunk ``[j c, (j + 1) c)`` with
    ``c = (dim // len(modes)) // 2 * 2`` holding ``sincos_1d(N_m, c)`` of the position along ``m``; the remaining
    ``dim - len(modes) c`` features get no encoding. It needs ``dim >= 2 len(modes)`` (else every chunk is empty).
    """

    def __init__(self, sizes: Sequence[int], dim: int, kind: str = "learned", modes: Sequence[int] | None = None):
        super().__init__()
        fn = "AbsolutePositionalEncoding"
        if kind not in ("learned", "sincos", "none"):
            raise ValueError(f"{fn}: `kind` must be learned|sincos|none, got {kind!r}")
        sizes = tuple(sizes)
        if not sizes or any(not is_int(n) or n <= 0 for n in sizes):
            raise ValueError(f"{fn}: `sizes` must be a non-empty sequence of positive ints (N1, .., Nk), got {sizes}")
        check_int(fn, "dim", dim)
        sizes, dim = tuple(int(n) for n in sizes), int(dim)
        self.sizes, self.dim, self.kind = sizes, dim, kind
        self.modes = tuple(range(len(sizes))) if modes is None else tuple(modes)
        if len(set(self.modes)) != len(self.modes) or any(
            not is_int(m) or not 0 <= m < len(sizes) for m in self.modes
        ):
            raise ValueError(f"{fn}: `modes` must be distinct 0-based mode indices in [0, {len(sizes)}) for sizes "
                             f"{sizes}, got {self.modes}")
        if kind == "sincos" and dim < 2 * len(self.modes):
            raise ValueError(f"{fn}: kind='sincos' needs dim >= 2 * len(modes) = {2 * len(self.modes)} (one sin/cos "
                             f"pair per encoded mode), got dim={dim}")
        if kind == "learned":
            self.tables = nn.ParameterList([nn.Parameter(torch.randn(self.sizes[m], dim) * 0.02) for m in self.modes])
        elif kind == "sincos":
            nm = max(1, len(self.modes))
            chunk = (dim // nm) // 2 * 2
            pe = torch.zeros(*self.sizes, dim)
            for j, m in enumerate(self.modes):
                tab = sincos_1d(self.sizes[m], chunk)
                shape = [1] * len(self.sizes) + [chunk]
                shape[m] = self.sizes[m]
                pe[..., j * chunk : (j + 1) * chunk] += tab.view(shape)
            self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        if tuple(x.shape[1:-1]) != self.sizes or x.shape[-1] != self.dim:
            raise ValueError(
                f"AbsolutePositionalEncoding: expected x of shape (B, {', '.join(map(str, self.sizes))}, {self.dim}),"
                f" got {tuple(x.shape)}"
            )
        if self.kind == "sincos":
            return x + self.pe.to(x.dtype)
        k = len(self.sizes)
        for m, tab in zip(self.modes, self.tables):
            shape = [1] * k + [self.dim]
            shape[m] = self.sizes[m]
            x = x + tab.view(shape).to(x.dtype)
        return x
