"""Incremental decoding along a causal mode: the :class:`DecodingCache` every causal attention layer keeps between
``step`` calls, the ``init_cache`` they share and the checks of every ``step``.

Axis legend: ``b`` batch, ``h`` heads, ``t`` steps so far, ``e`` per-head dim.
"""
from __future__ import annotations

import torch
from torch import nn

from hoformer._checks import check_int

from ._common import CheckedMasks

__all__ = ["DecodingCache"]


class DecodingCache:
    """The state a causal attention layer keeps between decoding steps (from ``init_cache()``): the number of steps
    so far, the running pools of the non-causal modes (Kronecker layers) and the keys and values along the causal
    mode, one pair per attention stage that attends along it, in buffers ``(B, H, capacity, ...)``.

    ``max_steps=None``: the buffers grow by doubling (amortised O(1) copies per step, no limit). An int: they are
    allocated for ``max_steps`` steps at the first step (no copies later), and a step past ``max_steps`` raises.
    """

    def __init__(self, max_steps: int | None = None, fn: str = "DecodingCache") -> None:
        _check_max_steps(fn, max_steps)
        self._reset(max_steps)

    def _reset(self, max_steps: int | None) -> None:
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


def _check_max_steps(fn: str, max_steps) -> None:
    check_int(fn, "max_steps", max_steps, optional=True, note=" (None: buffers that grow)")


class _Decoder:
    """``init_cache`` of the layers that decode along their ``causal_mode`` (each defines ``step``)."""

    causal_mode: int | None

    def init_cache(self, max_steps: int | None = None) -> DecodingCache:
        """An empty decoding state for :meth:`step` (one per layer and sequence batch). ``max_steps``: ``None`` for
        key / value buffers that grow by doubling, or the number of steps to preallocate (stepping past raises)."""
        fn = f"{type(self).__name__}.init_cache"
        _check_max_steps(fn, max_steps)
        return self._new_cache(max_steps)

    def _new_cache(self, max_steps: int | None) -> DecodingCache:
        """:meth:`init_cache` with ``max_steps`` already checked (an :class:`~hoformer.layers.Encoder` checks it once
        for all its layers)."""
        if self.causal_mode is None:
            raise ValueError(f"{type(self).__name__}.init_cache: decoding needs a layer built with `causal_mode`")
        cache = DecodingCache.__new__(DecodingCache)
        cache._reset(max_steps)
        return cache


def _check_eval(module: nn.Module, fn: str) -> None:
    """Decoding is eval-mode arithmetic (no dropout, like the forward it reproduces in eval mode): refuse a module
    with a dropout in training mode at a non-zero rate (``nn.Dropout``, ``DropPath``: a float ``p``) rather than
    drop out silently or differ from its own training forward; at rate 0 the training mode changes nothing here."""
    for m in module.modules():
        p = getattr(m, "p", None)
        if m.training and isinstance(p, float) and p > 0:
            raise RuntimeError(f"{fn}: decoding runs in eval mode (no dropout), got a {type(module).__name__} in "
                               f"training mode with a {type(m).__name__}(p={p}); call .eval() first")


def _check_step_input(layer, fn: str, x, masks):
    """The per-call checks of a ``step`` input: ``layer`` (causal) is in eval mode, ``x`` passes the layer's forward
    checks and is one index of the causal mode (size 1 along it), and ``masks`` are per-mode masks whose causal entry
    is ``None``. Returns the checked masks."""
    _check_eval(layer, fn)
    c = layer.causal_mode
    if (isinstance(x, torch.Tensor) and isinstance(masks, (list, tuple)) and len(masks) == x.ndim - 2
            and c < len(masks) and masks[c] is not None):
        raise ValueError(f"{fn}: `masks[{c}]` (the causal mode's) must be None while decoding")
    masks = layer._check_input(x, masks, fn)
    if x.shape[1 + c] != 1:
        raise ValueError(f"{fn}: `x` must be one index of the causal mode {c} (size 1 along it), got shape "
                         f"{tuple(x.shape)}")
    return masks


def _check_step(layer, fn: str, x, cache, masks):
    """The checks of a ``step`` called directly: ``layer`` decodes (``causal_mode`` set), its input passes
    :func:`_check_step_input` and ``cache`` passes :func:`_check_cache`. Returns the checked masks."""
    if layer.causal_mode is None:
        raise ValueError(f"{fn}: decoding needs a layer built with `causal_mode`")
    masks = _check_step_input(layer, fn, x, masks)
    _check_caches(fn, [cache], x, layer.causal_mode)
    return masks


def _check_caches(fn: str, caches, x, c: int) -> None:
    """Every cache is a :class:`DecodingCache` with room for one more step whose earlier steps had the batch, other
    modes (all but ``c``) and dtype of ``x``."""
    sizes = tuple(x.shape[1:-1])
    for cache in caches:
        if not isinstance(cache, DecodingCache):
            raise TypeError(f"{fn}: `cache` must come from init_cache(), got {type(cache).__name__}")
        cache.check(fn, x.shape[0], sizes[:c] + sizes[c + 1 :], x.dtype)


def _step_entry(layer, fn: str, x, cache, masks):
    """The checked masks of a ``step``: with masks that come as :class:`~hoformer.layers.CheckedMasks` the caller (an
    :class:`~hoformer.layers.Encoder`) has checked the input and every cache once; else :func:`_check_step`."""
    if isinstance(masks, CheckedMasks):
        return masks.masks
    return _check_step(layer, fn, x, cache, masks)
