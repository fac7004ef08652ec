"""Argument checks shared by the attention layers (channels-last ``x (B, N1..Nk, D)``, per-mode masks, mode indices).

Axis legend: ``b`` batch, ``n1..nk`` modes, ``d`` model dim.
"""
from __future__ import annotations

from typing import Sequence

import torch

from hoformer._checks import check_finite_output, check_fraction, check_int, is_int
from hoformer.functional.causal import causal_mask

__all__ = ["CheckedMasks"]


class CheckedMasks:
    """Masks that the caller has validated, together with the input they go with, at its own entry: a layer given
    ``masks=CheckedMasks(masks)`` (``mask=`` for the text layers) makes no per-call check. A model checks its input
    once and an :class:`~hoformer.layers.Encoder` checks its input once with its first layer's checks (every block
    takes an input of the same shape), then hands the checked masks (``CheckedMasks(None)`` for none) to every
    block, so that a forward runs as many checks at any depth."""

    __slots__ = ("masks",)

    def __init__(self, masks) -> None:
        self.masks = masks


class _CheckOnce:
    """The input checks of an attention layer, made once: :meth:`_check_input` (the layer's per-call checks of ``x``
    and ``masks``, returning the checked masks) runs at the public entry unless the masks come as
    :class:`CheckedMasks`, and the checks of constant arguments against the number of modes (``rope_modes``,
    ``causal_mode``, ``modes``, ``first_mode`` in range: :meth:`_check_mode_args`) run once per number of modes: at
    construction for a layer built with ``num_modes``, else at the first input with that many modes."""

    _modes_ok: frozenset = frozenset()

    def _weight(self) -> torch.Tensor:
        """The projection weight whose dtype an input must have (outside autocast)."""
        return self.to_qkv.weight

    def _input_modes(self) -> int | None:
        """The number of modes an input must have (``None``: any)."""
        return self.num_modes

    def _check_input(self, x, masks, fn: str):
        """The per-call checks of ``x`` (width, modes, dtype) and ``masks``; returns the checked masks."""
        weight = self._weight()
        _check_x(x, self.dim, fn, self._input_modes(), weight.dtype)
        self._check_modes(x.ndim - 2, fn, tuple(x.shape))
        return _check_masks(masks, tuple(x.shape[1:-1]), fn, x.shape[0], self.heads)

    def _check_mode_args(self, nm: int, where: str, fn: str) -> None:
        """The constant arguments against ``nm`` modes: ``rope_modes`` and ``causal_mode`` in range."""
        _check_rope_modes(self.rope_modes, nm, fn)
        _check_causal_range(self.causal_mode, nm, where, fn)

    def _entry(self, x, masks):
        """The checked masks of a public call: ``masks.masks`` if they come checked, else :meth:`_check_input`."""
        if isinstance(masks, CheckedMasks):
            self._check_modes(x.ndim - 2, type(self).__name__, tuple(x.shape))
            return masks.masks
        return self._check_input(x, masks, type(self).__name__)

    def _exit(self, y, x, masks):
        """``y``, checked to be finite where ``x`` is (:func:`~hoformer._checks.check_finite_output`) when this call
        was the public entry (a caller that handed :class:`CheckedMasks` checks its own output)."""
        if not isinstance(masks, CheckedMasks):
            check_finite_output(y, x, type(self).__name__)
        return y

    def _check_modes(self, nm: int, fn: str, shape: tuple | None = None) -> None:
        """:meth:`_check_mode_args` for ``nm`` modes unless it has passed before (``shape``: the input's, for the
        message; ``None`` at construction)."""
        if nm not in self._modes_ok:
            self._check_mode_args(nm, f"num_modes={nm}" if shape is None else f"x {shape}", fn)
            if not torch.compiler.is_compiling():  # traced code only checks (no module state changes)
                self._modes_ok = self._modes_ok | {nm}


def _check_x(x, dim: int, name: str, nmodes: int | None = None, dtype: torch.dtype | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: `x` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: `x` must be floating point, got dtype {x.dtype}")
    _check_dtype(x, dtype, name)
    if x.ndim < 3:
        raise ValueError(f"{name}: `x` must have shape (B, N1, ..., Nk, {dim}) with k >= 1, got {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"{name}: `x` last dim must equal dim={dim}, got shape {tuple(x.shape)}")
    if nmodes is not None and x.ndim - 2 != nmodes:
        raise ValueError(f"{name}: expected {nmodes} modes, got x of shape {tuple(x.shape)}")
    if x.numel() == 0:
        what = "an empty batch (B = 0)" if x.shape[0] == 0 else "an empty mode"
        raise ValueError(f"{name}: `x` has {what}, got shape {tuple(x.shape)}")


def _check_dtype(x: torch.Tensor, dtype: torch.dtype | None, name: str, arg: str = "x") -> None:
    """``x`` has the dtype of the layer's weights (as ``nn.Linear`` requires; not checked under autocast, which
    casts per operation)."""
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name}: `{arg}` must have the dtype of the layer's weights, {dtype}, got {x.dtype}; convert "
                        f"one to the other: {arg}.to({dtype}) or layer.to({x.dtype})")


def _mode_tuple(modes, fn: str, arg: str = "rope_modes") -> tuple[int, ...]:
    """A sequence of mode indices as a tuple (a bare int is refused: ``rope_modes=(1,)``, not ``1``)."""
    if isinstance(modes, (str, bytes)) or not isinstance(modes, Sequence) or not all(is_int(m) for m in modes):
        raise TypeError(f"{fn}: `{arg}` must be a sequence of 0-based mode indices (ints), e.g. (0, 1), got {modes!r}")
    return tuple(int(m) for m in modes)


def _check_rope_modes(rope_modes: tuple[int, ...], nmodes: int, name: str) -> None:
    """Range check against the number of modes (the ints were checked at construction by :func:`_mode_tuple`)."""
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


def _check_causal_range(causal_mode, nmodes: int, where: str, fn: str) -> None:
    if causal_mode is not None and causal_mode >= nmodes:
        raise ValueError(f"{fn}: causal_mode={causal_mode} but {where} has only {nmodes} modes")


def _causal_masks(masks, sizes, causal_mode, device):
    """``masks`` (checked, or None) with the causal mode's entry combined with the lower-triangular mask."""
    if causal_mode is None:
        return masks
    masks = [None] * len(sizes) if masks is None else list(masks)
    tril = causal_mask(sizes[causal_mode], device)
    masks[causal_mode] = tril if masks[causal_mode] is None else masks[causal_mode] & tril
    return masks


def _check_layer_args(fn: str, dim, num_heads, dim_head, dropout, attn_dropout) -> None:
    """Sizes and rates every attention layer takes; ``dim_head=None`` means ``dim // num_heads`` (0 is refused)."""
    check_int(fn, "dim", dim)
    check_int(fn, "num_heads", num_heads)
    check_int(fn, "dim_head", dim_head, optional=True)
    if dim_head is None and dim % num_heads:
        raise ValueError(f"{fn}: dim={dim} is not divisible by num_heads={num_heads}")
    check_fraction(fn, "dropout", dropout)
    check_fraction(fn, "attn_dropout", attn_dropout, optional=True)
