"""``x @ weight.T`` whose weight gradient takes the faster of its two layouts.

The weight gradient of a linear map is ``g^T x`` (``g (M, out)``, ``x (M, in)``, ``M`` the rows). MKL reading ``g``
transposed runs it well below its peak when ``out > in``: at the MLP's first map of the paper-size Weather step
(``M = 16128``, 128 -> 512, one thread) ``(x.t() @ g).t()``, the same product as a ``(in, out)`` matrix, takes about
two thirds of the time of ``g.t() @ x``. :func:`linear_t` computes it that way when ``out > in`` and as autograd
would otherwise.

Axis legend: ``x (..., in)``, ``weight (out, in)``, output ``(..., out)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["linear_t"]


class _LinearT(torch.autograd.Function):
    """``F.linear(x, weight)`` (no bias) with the weight gradient ``(x^T g)^T`` when ``out > in``."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = g @ weight
        if ctx.needs_input_grad[1]:
            g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
            gw = (x2.t() @ g2).t() if weight.shape[0] > weight.shape[1] else g2.t() @ x2
        return gx, gw


def linear_t(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` (:func:`torch.nn.functional.linear` without bias), differentiable, its weight gradient in the
    faster layout (module doc). Float32 outside autocast is where it was measured; the caller chooses it there."""
    return _LinearT.apply(x, weight)
