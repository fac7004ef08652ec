"""Test helpers shared by the model test files: the tensors of a model's output, whatever its structure."""
from __future__ import annotations

import torch


def tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in tensors(v)]
    return []


def float_outputs(model, args, kwargs):
    """The floating-point tensors of ``model(*args, **kwargs)`` (tuples, lists and dicts flattened in order)."""
    return [t for t in tensors(model(*args, **kwargs)) if t.is_floating_point()]
