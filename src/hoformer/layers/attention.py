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

from torch import nn

from ._common import CheckedMasks
from .decoding import DecodingCache
from .dense import AxialAttention, DividedAttention, FullAttention
from .kronecker import FavorFeatures, KroneckerAttention
from .recording import RecordableAttention, record_attention

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
    "CheckedMasks",
]


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
