"""One attention-map API for every hoformer model (HOT paper 000 section 5.5 / appendix D, Weaver 003 Fig 6,
HOBA 004 Figs 2-4).

:func:`attention_maps` runs one forward pass under :func:`hoformer.layers.record_attention` (the recorder of every
recordable attention layer: Kronecker, full, axial, divided, triplet / block attention, Weaver's valence attention),
the one way to get attention maps out of a model. Normal forward passes are untouched: recording is switched on only
inside the call.

Each entry is an :class:`AttentionRecord` ``(name, kind, maps, combine, modes)``:

=============  ==========================================================================================
``kind``       ``maps``
=============  ==========================================================================================
``kronecker``  per-mode factors ``S_i (B, H, Ni, Ni)`` (HOT eq 7; Weaver ``[Theta_T, Theta_S]``, signed)
``full``       ``[(B, H, N, N)]`` dense attention over the flattened tokens
``axial``      per mode ``(B, H, *fibers, Ni, Ni)``
``triplet``    ``[local (B, H, W, s, s, s)]`` (+ ``cross (B, H, M, M)``) HOBA triplet cubes per window
``block``      ``[local (B, H, W, s, s) or (B, H, L, L)]`` (+ ``cross``) 2D block / full baselines of HOBA
=============  ==========================================================================================

Axis legend: ``b`` batch, ``h`` heads, ``n_i`` mode sizes, ``w`` windows, ``s`` window size.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, NamedTuple

import torch
from torch import nn

from hoformer.layers.attention import AxialAttention, record_attention

__all__ = [
    "AttentionRecord",
    "attention_maps",
    "recording",
    "batch_mean_maps",
    "split_batch",
    "record_kind",
]


class AttentionRecord(NamedTuple):
    """One attention layer's maps from one forward pass (see the module docstring for ``kind``)."""

    name: str
    kind: str
    maps: list
    combine: str | None = None
    modes: tuple | None = None  # the mode index of each map (``None``: 0, 1, ..); axial layers on a subset of modes

    def mode_indices(self) -> tuple:
        return tuple(range(len(self.maps))) if self.modes is None else tuple(self.modes)


def record_kind(module: nn.Module | None, maps) -> tuple[str, str | None]:
    """``(kind, combine)`` of a recorded layer: its class's ``record_kind``
    (:class:`~hoformer.layers.recording.RecordableAttention`; ``combine`` for Kronecker layers), else from the map
    shapes."""
    kind = getattr(module, "record_kind", None)
    if kind is not None:
        return kind, getattr(module, "combine", None) if kind == "kronecker" else None
    if len(maps) == 1 and maps[0].ndim == 4 and maps[0].shape[-1] == maps[0].shape[-2]:
        return "full", None
    return "unknown", None


@contextlib.contextmanager
def recording(model: nn.Module):
    """Context manager behind :func:`attention_maps`: records every forward inside the block (training forwards
    too, which is how :class:`~hoformer.analysis.StableRankCallback` reads the maps without an extra pass) and yields a
    list that is filled with :class:`AttentionRecord` when the block exits."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"attention_maps: `model` must be an nn.Module, got {type(model).__name__}")
    out: list[AttentionRecord] = []
    with record_attention(model) as raw:
        yield out
    modules = dict(model.named_modules())
    for name, maps in raw:
        module = modules.get(name)
        kind, combine = record_kind(module, maps)
        modes = getattr(module, "modes", None) if isinstance(module, AxialAttention) else None
        out.append(AttentionRecord(name, kind, [m for m in maps if m is not None], combine,
                                   tuple(modes) if modes is not None else None))


@torch.no_grad()
def attention_maps(model: nn.Module, *args: Any, **kwargs: Any) -> list[AttentionRecord]:
    """Per-layer attention maps of one forward ``model(*args, **kwargs)`` (no gradients; the model's train/eval
    mode is left as it is: call ``model.eval()`` first for deterministic maps).

    Returns the list of :class:`AttentionRecord` in call order; raises ``ValueError`` if the model has no
    recordable attention layer.
    """
    with recording(model) as out:
        model(*args, **kwargs)
    if not out:
        raise ValueError(f"attention_maps: {type(model).__name__} recorded no attention maps (none of its layers "
                         "is a recordable attention layer of hoformer.layers)")
    return out


def batch_mean_maps(records: list[AttentionRecord]) -> list[AttentionRecord]:
    """Average every map over the batch dim (dim 0), keeping heads: ``(B, H, ...) -> (H, ...)``. Axial maps are also
    averaged over their fibers (``(B, H, *fibers, Ni, Ni) -> (H, Ni, Ni)``); HOBA triplet / block maps over windows
    are kept (``(H, W, s, s, s)``)."""
    out = []
    for r in records:
        maps = []
        for m in r.maps:
            m = m.float().mean(0)
            if r.kind == "axial" and m.ndim > 3:
                m = m.flatten(1, -3).mean(1)
            maps.append(m)
        out.append(r._replace(maps=maps))
    return out


def split_batch(model: nn.Module, batch) -> tuple[tuple, dict, Any]:
    """Turn a dataloader batch into ``(args, kwargs, target)`` for ``model``.

    Tensors -> ``(batch,)``; tuples / lists ``(x, y, *extra)`` -> ``(x,)`` and target ``y``; dicts: the first
    ``forward`` parameter takes ``batch["x"]`` / ``batch["ids"]`` / ``batch["input_ids"]``, other keys are passed when
    ``forward`` accepts them (``time``, ``mask``), target ``batch["y"]`` / ``"label"`` / ``"labels"``.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}, None
    if isinstance(batch, (tuple, list)):
        if not batch or not isinstance(batch[0], torch.Tensor):
            raise TypeError(f"split_batch: expected a batch (x, y, ...) of tensors, got {type(batch).__name__}")
        return (batch[0],), {}, (batch[1] if len(batch) > 1 else None)
    if isinstance(batch, dict):
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        first = next((k for k in ("x", "ids", "input_ids") if k in batch), None)
        if first is None or not params:
            raise ValueError(f"split_batch: dict batch needs an input key 'x', 'ids' or 'input_ids', "
                             f"got {sorted(batch)}")
        names = {p.name for p in params[1:]}
        kwargs = {k: v for k, v in batch.items() if k in names and k != first}
        target = next((batch[k] for k in ("y", "label", "labels") if k in batch), None)
        return (batch[first],), kwargs, target
    raise TypeError(f"split_batch: unsupported batch type {type(batch).__name__} (tensor, tuple, list or dict)")
