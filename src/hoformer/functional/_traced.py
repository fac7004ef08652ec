"""How traced code calls the hand-written kernels' custom ops: :func:`traced_call`.

Under ``torch.compile`` the opaque custom op runs (its hand-written kernels keep their speed and memory in a compiled
training step). Under ``torch.export`` (``torch.compiler.is_exporting()``) the op's pure-tensor transcription runs
instead (``hoformer.functional._ops.EXPORT_DECOMPOSITIONS``, registered here when that module is imported), so that a
program exported by plain ``torch.export.export`` or ``torch.onnx.export(..., dynamo=True)`` holds core ATen ops
only: it loads without hoformer imported and converts to standard ONNX.

This module imports no kernel module, so that the kernels' modules can import it.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["traced_call", "LOWERINGS"]

#: ``{op overload: its pure-tensor transcription}``, filled by ``hoformer.functional._ops``
LOWERINGS: dict[object, Callable] = {}


def traced_call(op, *args):
    """``op(*args)`` in traced code; under ``torch.export`` the op's transcription (:data:`LOWERINGS`) instead."""
    if torch.compiler.is_exporting():
        return LOWERINGS[op](*args)
    return op(*args)
