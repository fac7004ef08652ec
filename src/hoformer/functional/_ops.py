"""The hand-written kernels as ``torch.library`` custom ops, for traced code.

The cache-blocked Kronecker products (:func:`~hoformer.functional.kron_apply`,
:func:`~hoformer.functional.kron_sum_apply`, HOT eqs 8-9) and the tiled triplet kernel
(:func:`~hoformer.functional.triplet_attention`, HOBA Algorithm 1) write into reused buffers, compare data pointers
and loop over host-side chunks, which ``torch.compile`` and ``torch.export`` cannot trace. Eager calls run them
through their ``torch.autograd.Function`` (no dispatcher overhead); while tracing (``torch.compiler.is_compiling()``)
the public functions call the ops registered here instead:

* ``hoformer::kron_apply``, ``hoformer::kron_sum_apply``, ``hoformer::triplet_attention``: the same forward kernels,
  opaque to the tracer, with fake (meta) implementations giving the output shapes and strides;
* their backward is registered with :func:`torch.library.register_autograd` and is itself an opaque op
  (``hoformer::*_backward``) running the same hand-written backward kernels, so a compiled training step keeps
  their speed and memory;
* ``hoformer::entmax15``: the ``entmax`` package's entmax-1.5 (Weaver eq 37), whose autograd ``Function`` Dynamo
  cannot trace, with its Jacobian-vector product registered as plain tensor ops.

:data:`EXPORT_DECOMPOSITIONS` maps each forward op to a pure-tensor transcription of its equation (mode products by
broadcast matmuls; the triplet windows gathered with a constant index, the score cube of eq 2 and the window mean of
eq 4 as a constant averaging matrix; entmax-1.5 op by op). Traced code runs them under ``torch.export``
(:func:`hoformer.functional._traced.traced_call`), so an exported program holds core ATen ops only, which ONNX and
any PyTorch runtime can run without hoformer installed (see :mod:`hoformer.export`).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .products import (
    _kron_apply_backward,
    _kron_apply_forward,
    _kron_sum_apply_backward,
    _kron_sum_apply_forward,
)
from ._traced import LOWERINGS
from .dropout_bits import _apply as _dropout_bits_apply
from .scores import _masked_softmax
from .triplet import _compute_dtype, _triplet_backward, _triplet_forward

__all__ = ["EXPORT_DECOMPOSITIONS"]


def _grads_or_empty(v: Tensor, gv: Tensor | None, gs: Sequence[Tensor | None]) -> list[Tensor]:
    """A custom op returns no ``None``: a gradient that was not asked for is an empty tensor."""
    return [g if g is not None else v.new_empty(0) for g in (gv, *gs)]


def _fake_grads(v: Tensor, factors: Sequence[Tensor], needs: Sequence[bool]) -> list[Tensor]:
    b, h = v.shape[:2]
    out = [torch.empty_like(v) if needs[0] else v.new_empty(0)]
    out += [v.new_empty(b, h, *f.shape[-2:]) if need else v.new_empty(0) for f, need in zip(factors, needs[1:])]
    return out


def _needs(ctx) -> list[bool]:
    """``[v needs a gradient, factor m needs one ...]`` from the context of an op ``(v, factors, ...)``."""
    need_v, need_f = ctx.needs_input_grad[:2]
    if isinstance(need_f, bool):  # one flag for the whole list
        need_f = [need_f] * (len(ctx.saved_tensors) - 1)
    return [bool(need_v), *map(bool, need_f)]


def _unpack(grads: Sequence[Tensor], needs: Sequence[bool]) -> tuple[Tensor | None, list[Tensor | None]]:
    gv, *gs = (g if need else None for g, need in zip(grads, needs))
    return gv, gs


# ------------------------------------------------------------------------------------------- kron_apply
@torch.library.custom_op("hoformer::kron_apply", mutates_args=())
def kron_apply_op(v: Tensor, factors: list[Tensor]) -> Tensor:
    """``S_1 (x) .. (x) S_k`` on ``v (b, h, n1..nk, d)``, factors ``(b, h, n_m, n_m)`` (expanded)."""
    return _kron_apply_forward(v, factors)


@kron_apply_op.register_fake
def _(v, factors):
    return torch.empty_like(v)


@torch.library.custom_op("hoformer::kron_apply_backward", mutates_args=())
def kron_apply_backward_op(grad: Tensor, v: Tensor, factors: list[Tensor], needs: list[bool]) -> list[Tensor]:
    """``[dv, dS_1, .., dS_k]`` of ``hoformer::kron_apply`` (empty where ``needs`` is False)."""
    gv, gs = _kron_apply_backward(grad, v, factors, needs[0], needs[1:])
    return _grads_or_empty(v, gv, gs)


@kron_apply_backward_op.register_fake
def _(grad, v, factors, needs):
    return _fake_grads(v, factors, needs)


def _save_v_factors(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], *inputs[1])


def _kron_apply_autograd(ctx, grad):
    v, *factors = ctx.saved_tensors
    needs = _needs(ctx)
    gv, gs = _unpack(kron_apply_backward_op(grad, v, factors, needs), needs)
    return gv, gs


kron_apply_op.register_autograd(_kron_apply_autograd, setup_context=_save_v_factors)


# ----------------------------------------------------------------------------------------- dropout_bits
@torch.library.custom_op("hoformer::dropout_bits", mutates_args=())
def dropout_bits_op(x: Tensor, seed: Tensor, p: float) -> Tensor:
    """``x * mask(seed)``, the dropout of :mod:`hoformer.functional.dropout_bits` (its C kernel; opaque to the
    tracer, whose integer arithmetic would not be SplitMix64's wrapping one)."""
    return _dropout_bits_apply(x, seed, p)


@dropout_bits_op.register_fake
def _(x, seed, p):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _save_seed(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])
    ctx.p = inputs[2]


def _dropout_bits_autograd(ctx, grad):
    (seed,) = ctx.saved_tensors
    return dropout_bits_op(grad, seed, ctx.p), None, None


dropout_bits_op.register_autograd(_dropout_bits_autograd, setup_context=_save_seed)


# --------------------------------------------------------------------------------------- kron_sum_apply
@torch.library.custom_op("hoformer::kron_sum_apply", mutates_args=())
def kron_sum_apply_op(v: Tensor, factors: list[Tensor], alpha: float) -> Tensor:
    """``alpha * sum_m v x_m S_m`` on ``v (b, h, n1..nk, d)``, factors ``(b, h, n_m, n_m)`` (expanded)."""
    return _kron_sum_apply_forward(v, factors, alpha)


@kron_sum_apply_op.register_fake
def _(v, factors, alpha):
    return torch.empty_like(v)


@torch.library.custom_op("hoformer::kron_sum_apply_backward", mutates_args=())
def kron_sum_apply_backward_op(grad: Tensor, v: Tensor, factors: list[Tensor], alpha: float,
                               needs: list[bool]) -> list[Tensor]:
    """``[dv, dS_1, .., dS_k]`` of ``hoformer::kron_sum_apply`` (empty where ``needs`` is False)."""
    gv, gs = _kron_sum_apply_backward(grad, v, factors, alpha, needs[0], needs[1:])
    return _grads_or_empty(v, gv, gs)


@kron_sum_apply_backward_op.register_fake
def _(grad, v, factors, alpha, needs):
    return _fake_grads(v, factors, needs)


def _save_v_factors_alpha(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], *inputs[1])
    ctx.alpha = inputs[2]


def _kron_sum_apply_autograd(ctx, grad):
    v, *factors = ctx.saved_tensors
    needs = _needs(ctx)
    gv, gs = _unpack(kron_sum_apply_backward_op(grad, v, factors, ctx.alpha, needs), needs)
    return gv, gs, None


kron_sum_apply_op.register_autograd(_kron_sum_apply_autograd, setup_context=_save_v_factors_alpha)


# ------------------------------------------------------------------------------------- triplet_attention
@torch.library.custom_op("hoformer::triplet_attention", mutates_args=())
def triplet_attention_op(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, mask: Tensor | None,
                         block_size: int, overlap: float, scale: float,
                         budget: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, C, lse)``: the triplet attention output and what its backward keeps (per-window outputs and
    log-sum-exps, in the compute dtype)."""
    return _triplet_forward(q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget)


def _window_shape(L, block_size: int, overlap: float):
    """``(number of windows, window size)`` of :func:`~hoformer.functional.triplet_windows`, by integer arithmetic so
    that a symbolic length ``L`` gives a symbolic count: ``ceil((L - s) / stride) + 1`` windows of ``s`` tokens."""
    if L <= block_size:
        return 1, L
    stride = max(1, round(block_size * (1 - overlap)))
    return (L - block_size + stride - 1) // stride + 1, block_size


@triplet_attention_op.register_fake
def _(q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget):
    B, H, L, D = q.shape
    W, S = _window_shape(L, block_size, overlap)
    cdt = _compute_dtype(q.dtype)
    return torch.empty_like(q), q.new_empty(B * H * W, S, D, dtype=cdt), q.new_empty(B * H * W, S, dtype=cdt)


@torch.library.custom_op("hoformer::triplet_attention_backward", mutates_args=())
def triplet_attention_backward_op(grad: Tensor, q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor,
                                  mask: Tensor | None, C: Tensor, lse: Tensor, block_size: int, overlap: float,
                                  scale: float, budget: int) -> list[Tensor]:
    """``[dq, dk1, dk2, dv1, dv2]`` of ``hoformer::triplet_attention``."""
    return _triplet_backward(grad, q, k1, k2, v1, v2, mask, C, lse, block_size, overlap, scale, budget)


@triplet_attention_backward_op.register_fake
def _(grad, q, k1, k2, v1, v2, mask, C, lse, block_size, overlap, scale, budget):
    return [torch.empty_like(x) for x in (q, k1, k2, v1, v2)]


def _triplet_setup(ctx, inputs, output) -> None:
    q, k1, k2, v1, v2, mask, *cfg = inputs
    _, C, lse = output
    ctx.has_mask, ctx.cfg = mask is not None, cfg
    ctx.save_for_backward(q, k1, k2, v1, v2, C, lse, *([mask] if mask is not None else []))


def _triplet_autograd(ctx, grad, grad_c, grad_lse):
    q, k1, k2, v1, v2, C, lse, *mask = ctx.saved_tensors
    grads = triplet_attention_backward_op(grad, q, k1, k2, v1, v2, mask[0] if ctx.has_mask else None, C, lse,
                                          *ctx.cfg)
    return (*grads, None, None, None, None, None)


triplet_attention_op.register_autograd(_triplet_autograd, setup_context=_triplet_setup)


# ---------------------------------------------------------------------------------------------- entmax15
@torch.library.custom_op("hoformer::entmax15", mutates_args=())
def entmax15_op(x: Tensor, dim: int) -> Tensor:
    """entmax-1.5 of the ``entmax`` package (Weaver's dictionary retrieval, eq 37): its autograd ``Function`` (a
    classmethod ``forward``) is not traceable by ``torch.compile``."""
    from entmax import entmax15

    return entmax15(x, dim=dim)


@entmax15_op.register_fake
def _(x, dim):
    return torch.empty_like(x)


def _entmax15_setup(ctx, inputs, output) -> None:
    ctx.dim = inputs[1]
    ctx.save_for_backward(output)


def _entmax15_autograd(ctx, grad):
    """The entmax-1.5 Jacobian-vector product (Peters et al. 2019): ``dx = g' - (sum g' / sum sqrt(y)) sqrt(y)``
    with ``g' = g * sqrt(y)``, as the ``entmax`` package computes it."""
    (y,) = ctx.saved_tensors
    gppr = y.sqrt()
    dx = grad * gppr
    return dx - (dx.sum(ctx.dim, keepdim=True) / gppr.sum(ctx.dim, keepdim=True)) * gppr, None


entmax15_op.register_autograd(_entmax15_autograd, setup_context=_entmax15_setup)


def _entmax15_lowered(x: Tensor, dim: int) -> Tensor:
    """The ``entmax`` package's entmax-1.5 forward transcribed op by op (sort, cumulative sums, threshold; Peters et
    al. 2019, Algorithm 2), without its autograd ``Function``, which strict ``torch.export`` cannot trace."""
    x = x.movedim(dim, -1)
    x = (x - x.amax(-1, keepdim=True)) / 2
    xs = x.sort(-1, descending=True).values
    rho = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    mean = xs.cumsum(-1) / rho
    mean_sq = (xs * xs).cumsum(-1) / rho
    tau = mean - ((1 - rho * (mean_sq - mean * mean)) / rho).clamp_min(0).sqrt()
    support = (tau <= xs).sum(-1, keepdim=True)
    tau_star = tau.gather(-1, support - 1)
    return ((x - tau_star).clamp_min(0) ** 2).movedim(-1, dim)


# ----------------------------------------------------------------------------------- export lowerings
def _mode_product(s: Tensor, x: Tensor, m: int) -> Tensor:
    """``x x_m S`` for ``x (b, h, n1..nk, d)`` and ``s (b|1, h|1, n_m, n_m)``: one broadcast matmul."""
    k = x.ndim - 3
    s = s.reshape(*s.shape[:2], *([1] * (k - 1)), *s.shape[-2:])
    return torch.matmul(s, x.movedim(2 + m, -2)).movedim(-2, 2 + m)


def _kron_apply_lowered(v: Tensor, factors: list[Tensor]) -> Tensor:
    """HOT eq 8 as ``k`` mode products (what ``hoformer::kron_apply`` computes)."""
    for m, s in enumerate(factors):
        v = _mode_product(s, v, m)
    return v


def _kron_sum_apply_lowered(v: Tensor, factors: list[Tensor], alpha: float) -> Tensor:
    """HOT eq 9: ``alpha * sum_m v x_m S_m``."""
    out = _mode_product(factors[0], v, 0)
    for m in range(1, len(factors)):
        out = out + _mode_product(factors[m], v, m)
    return out * alpha


def _triplet_attention_lowered(q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget):
    """HOBA eqs 2-4 on every window at once: gather the windows with a constant index, form the score cube, the
    joint softmax over key pairs and ``C[i] = sum_j v1[j] * (A[i, j, :] @ v2)``, then average the window outputs of
    each token with a constant ``(L, W * s)`` matrix. Returns ``(out, C, lse)`` like the op; ``C`` and ``lse`` are
    only there for the backward and are given as zeros (an inference program never reads them)."""
    B, H, L, D = q.shape
    cdt = _compute_dtype(q.dtype)
    W, S = _window_shape(L, block_size, overlap)
    stride = max(1, round(block_size * (1 - overlap)))
    # the starts of triplet_windows: 0, stride, 2 stride, .. and, when the end is not covered, L - s (no data tensors:
    # a tensor constant made inside a decomposition is not allowed in the lowered graph)
    starts = (torch.arange(W, device=q.device) * stride).clamp_max(L - S)
    idx = (starts[:, None] + torch.arange(S, device=q.device)).flatten()  # (W * s,) token of each window row
    hit = (torch.arange(L, device=q.device)[:, None] == idx).to(cdt)  # (L, W * s)
    avg = hit / hit.sum(-1, keepdim=True)  # eq 4: the mean over the windows covering each token
    qw, k1w, k2w, v1w, v2w = (x.to(cdt).index_select(2, idx).unflatten(2, (W, S)) for x in (q, k1, k2, v1, v2))
    t = torch.matmul((qw * scale)[..., :, None, :] * k1w[..., None, :, :], k2w.mT[..., None, :, :])  # b h w i j l
    pair = None
    if mask is not None:
        km = mask.index_select(1, idx).unflatten(1, (W, S))[:, None, :, None, :]  # b 1 w 1 s
        pair = (km[..., :, None] & km[..., None, :]).flatten(-2)  # b 1 w 1 (j l)
    a = _masked_softmax(t.flatten(-2), pair).unflatten(-1, (S, S))
    c = (torch.matmul(a, v2w[..., None, :, :]) * v1w[..., None, :, :]).sum(-2)  # b h w i d
    out = torch.matmul(avg, c.flatten(2, 3))  # b h L d
    if mask is not None:
        out = out * mask[:, None, :, None]
    n = B * H * W
    return out.to(q.dtype), q.new_zeros(n, S, D, dtype=cdt), q.new_zeros(n, S, dtype=cdt)


#: ``{op overload: its pure-tensor transcription}``: what traced code runs under ``torch.export``
#: (:func:`hoformer.functional._traced.traced_call`)
EXPORT_DECOMPOSITIONS = {
    torch.ops.hoformer.kron_apply.default: _kron_apply_lowered,
    torch.ops.hoformer.kron_sum_apply.default: _kron_sum_apply_lowered,
    torch.ops.hoformer.triplet_attention.default: _triplet_attention_lowered,
    torch.ops.hoformer.entmax15.default: _entmax15_lowered,
}


LOWERINGS.update(EXPORT_DECOMPOSITIONS)
