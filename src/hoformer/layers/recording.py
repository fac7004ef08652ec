"""Attention maps without changing outputs: :class:`RecordableAttention`, the base class of every attention layer
whose maps can be collected, and :func:`record_attention`, the context manager that collects them."""
from __future__ import annotations

import contextlib

from torch import nn

__all__ = ["RecordableAttention", "record_attention"]


class RecordableAttention(nn.Module):
    """Base class of every attention layer whose maps :func:`record_attention` collects (the one way to get attention
    maps: forwards return tensors only).

    A layer subclasses it and, in its ``forward``, computes its maps only while ``self._recording`` is True (the
    normal path pays one ``if``) and hands them to ``self._maybe_record(maps)`` (a list of tensors, detached there).
    Every active ``record_attention`` block adds a sink ``(records, layer_name)`` to the layer; ``records`` receives
    ``(layer_name, maps)``. Blocks nest: an inner recording (e.g. a callback's) leaves the outer one's intact.
    """

    _sinks: tuple = ()
    #: what the recorded maps are (:func:`hoformer.analysis.attention_maps` labels and plots them by it):
    #: ``"kronecker"`` (one factor per mode, combined by the layer's ``combine``), ``"full"``, ``"axial"``,
    #: ``"triplet"``, ``"block"``; ``None``: told apart by the maps' shapes
    record_kind: str | None = None

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
