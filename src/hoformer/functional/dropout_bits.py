"""Dropout with cheaper masks on the CPU: the same distribution as :func:`torch.nn.functional.dropout` (each element
kept independently with probability ``1 - p`` and scaled by ``1 / (1 - p)``), drawn from raw random bits.

``F.dropout`` on the CPU fills a float mask with ``bernoulli_`` (a double-precision uniform and a comparison per
element, the single most expensive operator of a HOT training step), then multiplies twice. :func:`dropout` draws
``ceil(n / 2)`` 64-bit words of the generator instead (``randint`` over ``[-2^63, 2^63 - 1)``: uniform, independent
bits, but for the one missing value), reads them as ``n`` 32-bit integers ``r``, and builds the scaled mask ``m = (float(r) >= t) / (1 - p)`` with
``t = -2^31 + p * 2^32`` in three float passes; the output is ``x * m`` and the backward pass multiplies by the same
``m``, as ``F.dropout``'s does. An element is kept with probability ``1 - p`` to within ``2^-24`` (the rounding of
``r`` to a float32: the resolution of a float32 uniform).

* Reproducible: the bits come from the global generator (or ``generator``), so ``torch.manual_seed`` /
  ``seed_everything`` and hoformer's per-epoch reseeding fix every mask, and a resumed run draws the masks an
  uninterrupted one draws.
* Off the CPU (CUDA's fused dropout kernel is already cheap) and for ``p = 0`` or eval mode this is exactly
  ``F.dropout`` (in eval mode: ``x`` itself). Under ``torch.compile`` on the CPU the same ``randint`` is traced (a random
  op the compiler neither merges nor reorders); with ATen's generator (:class:`hoformer.train.CompileModel`'s
  ``fallback_random``, its CPU default) a compiled step draws the masks of the eager one.

Axis legend: any shape; the mask has ``x``'s shape.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dropout", "keep_mask"]


def keep_mask(shape, p: float, *, dtype=torch.float32, device=None,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """The scaled dropout mask of ``shape``: each entry ``1 / (1 - p)`` (kept) independently with probability
    ``1 - p`` (to within ``2^-24``; exactly ``1 - p`` rounded to ``2^-32`` in float64), else 0, from 32-bit random
    words of ``generator`` (default: the global one), in ``dtype``. ``0 <= p < 1``."""
    n = 1
    for size in shape:
        n *= int(size)
    words = torch.randint(-2**63, 2**63 - 1, ((n + 1) // 2,), dtype=torch.int64, device=device, generator=generator)
    # uniform integers in [-2^31, 2^31), compared in float32 (float64 for a float64 mask: exact), scaled in `dtype`
    work = torch.float64 if dtype == torch.float64 else torch.float32
    mask = words.view(torch.int32)[:n].view(shape).to(work).ge_(-2.0**31 + p * 2.0**32)
    return (mask if work == dtype else mask.to(dtype)).mul_(1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """:func:`torch.nn.functional.dropout` with the mask of :func:`keep_mask` on a CPU tensor (module doc): the same
    arguments and the same distribution of the result. ``p`` is checked by the caller (:class:`hoformer.layers.Dropout`
    checks it at construction)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training, inplace)
    mask = keep_mask(x.shape, p, dtype=x.dtype, device=x.device)
    return x.mul_(mask) if inplace else x * mask
