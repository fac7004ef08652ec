"""Kronecker-structured attention (HOT, paper 000 sections 3-4; kernelized variant: paper 002 section 4.3).

Axis legend
-----------
``b``  batch, ``h`` heads, ``n1..nk`` the k tensor modes, ``d`` per-head features, ``f`` random features.

For a value tensor ``v (b, h, n1..nk, d)`` and one small attention matrix per mode ``S_m (b, h, nm, nm)``:

* product (eq 3, 8):  ``y = (S_1 (x) ... (x) S_k) vec(v)``, i.e.
  ``y[.., i1..ik, d] = sum_j prod_m S_m[i_m, j_m] v[.., j1..jk, d]`` (row-major flattening, mode 1 slowest);
* sum (eq 4, 9):      ``y = (1/k) sum_m v x_m S_m`` (mode-m product), the Kronecker sum ``S_1 (+) ... (+) S_k``.

Neither forms the ``prod(n) x prod(n)`` matrix. :func:`kron_apply` is also Weaver's P^Delta-KMV (paper 003,
appendix F): ``k`` batched matmuls, one per mode, applied in place of layout (mode 1 is one bmm; for a later mode the
fibres before it become batch entries), so the value is not transposed except to unfold a long mode with a short
tail (:func:`_mode_mul`). The softmax path of both products (:class:`_KronApply`, :class:`_KronSumApply`) runs its
whole chain (forward, recompute, backward) on cache-sized chunks of (batch, head) pairs between reused buffers on
CPU (see the note above :func:`_chunk_pairs`). The linear kernel forms its factors too when that is cheaper (short
modes) or a mode is masked, and then shares that path; otherwise its operator-valued factors use plain batched
matmuls on the whole value (:func:`_linear_attention`).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from hoformer._checks import DETAIL, check_fraction, check_scale, check_values

from .scores import _dot, masked_softmax

__all__ = [
    "kron_apply",
    "kron_sum_apply",
    "kronecker_attention",
    "mode_attention_factors",
    "full_attention",
    "elu_feature_map",
    "kron_dense",
    "kron_sum_dense",
]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------------- validation
def _check_tensor(t, name: str, fn: str, min_ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{fn}: `{name}` must be a floating-point tensor, got dtype {t.dtype}")
    if t.ndim < min_ndim:
        raise ValueError(f"{fn}: `{name}` must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{fn}: `{name}` is empty, got shape {tuple(t.shape)}")


def _check_factors(factors, v: torch.Tensor, fn: str) -> list[torch.Tensor]:
    if isinstance(factors, torch.Tensor) or not isinstance(factors, Sequence) or len(factors) == 0:
        raise TypeError(f"{fn}: `factors` must be a non-empty list of tensors, got {type(factors).__name__}")
    _check_tensor(v, "v", fn, 4)
    k = v.ndim - 3
    if len(factors) != k:
        raise ValueError(
            f"{fn}: `v` of shape {tuple(v.shape)} has {k} modes (layout (B, H, N1..Nk, D)) but "
            f"{len(factors)} factors were given"
        )
    out = []
    for m, s in enumerate(factors):
        _check_tensor(s, f"factors[{m}]", fn, 2)
        n = v.shape[2 + m]
        if s.ndim > 4 or s.shape[-2:] != (n, n):
            raise ValueError(
                f"{fn}: `factors[{m}]` must have shape (B, H, {n}, {n}) (size-1 B/H broadcast) to match mode {m + 1}"
                f" of `v` {tuple(v.shape)}, got {tuple(s.shape)}"
            )
        lead = (1,) * (4 - s.ndim) + tuple(s.shape[:-2])
        for dim, (a, b) in enumerate(zip(lead[-2:], v.shape[:2])):
            if a not in (1, b):
                raise ValueError(
                    f"{fn}: `factors[{m}]` batch/head dims {tuple(s.shape[:-2])} do not broadcast to "
                    f"`v` batch/head dims {tuple(v.shape[:2])}"
                )
        out.append(s.reshape(lead[-2:] + tuple(s.shape[-2:])))
    return out


def _flat_factor(s: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """``(B'|1, H'|1, n, m)`` -> ``(b*h, n, m)`` (expanding a broadcast factor costs only ``b*h*n*m``)."""
    return s.expand(b, h, *s.shape[-2:]).reshape(b * h, *s.shape[-2:])


# ------------------------------------------------------------------------------------------------ primitives
def _kron_apply_ops(factors: list[Callable], vt: torch.Tensor, mode_sizes: Sequence[int]) -> torch.Tensor:
    """Product of operator-valued factors (the linear kernel) on a channels-first value ``vt (b, h, d, n1..nk)``;
    returns ``(b, h, n1..nk, d)``. ``factors[m]`` is a callable ``X (bh, P, n_m) -> (bh, n_m, P)`` computing
    ``S_m X^T`` (each step takes the last axis of a rotating layout and emits it first, so after ``k`` steps the
    layout is ``(n1..nk, d)`` again); the softmax path uses :class:`_KronApply` instead.
    """
    b, h = vt.shape[:2]
    sizes = list(mode_sizes)
    total = vt[0, 0].numel()
    x = vt.reshape(b * h, total)  # layout (d, n1..nk): one copy if vt is a strided view
    for m in reversed(range(len(sizes))):  # layout (.., n_m) -> (n_m, ..)
        n = sizes[m]
        x = factors[m](x.view(b * h, total // n, n))
    return x.view(b, h, *sizes, -1)


# Cache blocking. On CPU the mode products are memory-bound (the inner dimension is a mode size, often 8-32), and
# a value-sized temporary per mode costs more in page faults and DRAM traffic than the matmul itself. Both autograd
# Functions therefore run their whole chain on chunks of (batch, head) pairs small enough to stay in L2 (about
# 1 MiB of value per thread), writing each finished chunk once into the output. On accelerators kernel launches, not
# caches, are the cost: one chunk holds up to 256 MiB of value, so an ordinary batch is one chunk (one launch per
# mode product), while the value-sized workspace buffers of a very large input stay bounded (about 4 x 256 MiB)
# instead of growing with it. Smaller accelerator chunks trade time for memory: on an H200 at batch 32 (values of
# 4-64 MiB, benchmarks/attention.py shapes), 2 MiB chunks cut the layer's peak memory by 10-45% and cost 1.2-3.7x the
# time.
_CPU_CHUNK_BYTES = 1 << 20
_ACCELERATOR_CHUNK_BYTES = 256 << 20


def _chunk_pairs(v: torch.Tensor) -> int:
    """How many (batch, head) pairs one chunk holds for ``v (b, h, n.., d)``."""
    b, h = v.shape[:2]
    per_pair = max(1, v[0, 0].numel() * v.element_size())
    if v.device.type != "cpu":
        return max(1, min(b * h, _ACCELERATOR_CHUNK_BYTES // per_pair))
    return max(1, _CPU_CHUNK_BYTES // per_pair) * max(1, torch.get_num_threads())


def _chunks(b: int, h: int, c: int):
    """``(batch slice, head slice)`` pairs covering ``b x h`` in chunks of about ``c`` pairs (whole heads first)."""
    if c >= h:
        step = c // h
        for b0 in range(0, b, step):
            yield slice(b0, min(b, b0 + step)), slice(0, h)
    else:
        for b0 in range(b):
            for h0 in range(0, h, c):
                yield slice(b0, b0 + 1), slice(h0, min(h, h0 + c))


def _pair_factors(factors, bs: slice, hs: slice) -> list[torch.Tensor]:
    """The chunk's factors as ``(c, n, n)`` (a tiny copy when a factor was broadcast)."""
    return [f[bs, hs].reshape(-1, *f.shape[-2:]) for f in factors]


def _expand_factors(factors: list[torch.Tensor], v: torch.Tensor) -> list[torch.Tensor]:
    b, h = v.shape[:2]
    return [s.to(v.dtype).expand(b, h, *s.shape[-2:]) for s in factors]


class _Workspace:
    """Chunk-sized scratch buffers reused for every chunk of one call: a fresh CPU allocation of a few hundred KiB
    costs page faults (and cache misses) worth more than the matmul that fills it."""

    def __init__(self, like: torch.Tensor):
        self.like, self.bufs = like, {}

    def get(self, key, shape) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.bufs.get(key)
        if buf is None or buf.numel() < n:
            buf = self.bufs[key] = self.like.new_empty(n)
        return buf[:n].view(shape)

    def as_contiguous(self, key, src: torch.Tensor, shape) -> torch.Tensor:
        """``src`` reshaped to ``shape``: a view when ``src`` is contiguous, else a copy into a reused buffer."""
        if src.is_contiguous():
            return src.view(shape)
        out = self.get(key, shape)
        out.view(src.shape).copy_(src)
        return out


def _unfolded(t: torch.Tensor, c: int, a: int, n: int, r: int, key, ws: _Workspace) -> torch.Tensor:
    """The mode unfolding ``(c, n, a * r)`` of a contiguous chunk tensor ``t`` read as ``(c, a, n, r)`` (``a`` fibres
    before the mode, ``r`` the trailing size), copied in runs of ``r`` into the reused buffer ``key``."""
    u = ws.get(key, (c, n, a, r))
    u.copy_(t.view(c, a, n, r).transpose(1, 2))
    return u.view(c, n, a * r)


def _mode_mul(s: torch.Tensor, x: torch.Tensor, sizes: Sequence[int], m: int, out: torch.Tensor,
              ws: _Workspace, accumulate: bool = False) -> torch.Tensor:
    """Mode-``m`` product in place of layout: ``x (c, n1..nk, d)`` contiguous, ``s (c, n_m, n_m)`` (or a transposed
    view); writes (or adds, if ``accumulate``) ``y[c, .., i_m, .., :] = sum_j s[c, i_m, j] x[c, .., j, .., :]`` into
    ``out`` (same layout). Mode 1 is one bmm. For the others, with ``a`` fibres before mode ``m`` and ``r`` the
    trailing size: while ``n <= 2 r`` the fibres become batch entries and only ``s`` is repeated ``a`` times (``n / r``
    times the size of ``x``; a cheap contiguous write into a reused buffer, no transposed copy of ``x``); for a long
    mode with a short tail (``n > 2 r``, e.g. Weaver's sensor mode: n = 325, r = d = 16, where the repeat would be
    20x the value) ``x`` is unfolded to ``(c, n, a r)`` instead, one bmm, and folded back (two value-sized copies)."""
    c, n = x.shape[0], sizes[m]
    a = math.prod(sizes[:m])
    r = x[0].numel() // (a * n)
    if a > 1 and n > 2 * r:
        yu = ws.get("unfold_b", (c, n, a, r))
        torch.bmm(s, _unfolded(x, c, a, n, r, "unfold_a", ws), out=yu.view(c, n, a * r))
        ov = out.view(c, a, n, r)
        if accumulate:
            ov.add_(yu.transpose(1, 2))
        else:
            ov.copy_(yu.transpose(1, 2))
        return out
    if a > 1:
        se = ws.get("s", (c, a, n, n))
        se.copy_(s.unsqueeze(1).expand(c, a, n, n))
        s = se.view(c * a, n, n)
    xv, ov = x.view(c * a, n, -1), out.view(c * a, n, -1)
    if accumulate:
        return torch.baddbmm(ov, s, xv, out=ov).view(out.shape)
    return torch.bmm(s, xv, out=ov).view(out.shape)


def _mode_gram(g: torch.Tensor, x: torch.Tensor, sizes: Sequence[int], m: int, out: torch.Tensor,
               ws: _Workspace) -> torch.Tensor:
    """``out[c, i, j] = sum g[c, .., i, .., :] x[c, .., j, .., :]`` over everything but mode ``m``, ``out (c, n_m, n_m)``
    (the gradient of :func:`_mode_mul` w.r.t. ``s``)."""
    c, n = x.shape[0], sizes[m]
    a = math.prod(sizes[:m])
    r = x[0].numel() // (a * n)
    if a == 1:
        return torch.bmm(g.view(c, n, r), x.view(c, n, r).transpose(1, 2), out=out)
    if r >= n:  # per-fibre grams, then a reduction: no copies of g or x
        t = ws.get("gram", (c, a, n, n))
        torch.bmm(g.view(c * a, n, r), x.view(c * a, n, r).transpose(1, 2), out=t.view(c * a, n, n))
        return torch.sum(t, 1, out=out)
    gu, xu = _unfolded(g, c, a, n, r, "unfold_a", ws), _unfolded(x, c, a, n, r, "unfold_b", ws)
    return torch.bmm(gu, xu.transpose(1, 2), out=out)


def _dst_buffer(dst: torch.Tensor, key, ws: _Workspace, shape) -> torch.Tensor:
    """Where a chunk result goes: straight into ``dst`` when it is contiguous, else into a buffer (then copied)."""
    return dst.view(shape) if dst.is_contiguous() else ws.get(key, shape)


def _autocast_off(fn):
    """Run the kernel ``fn(...)`` with autocast disabled on the device of its first tensor argument: the
    hand-written kernels choose their compute dtype themselves (the Kronecker products run in the value's dtype, the
    triplet kernel in fp32 for half / bf16 inputs) and their backward recomputes in that same dtype, so an autocast
    region around the call must not turn their matmuls into bf16."""

    @functools.wraps(fn)
    def wrapped(*args):
        x = next(a for a in args if isinstance(a, torch.Tensor))
        with torch.autocast(x.device.type, enabled=False):
            return fn(*args)

    return wrapped


@_autocast_off  # everything runs in v's dtype, fwd and bwd alike
def _kron_apply_forward(v: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``S_1 (x) .. (x) S_k`` applied to ``v (b, h, n1..nk, d)``, factors expanded to ``(b, h, n_m, n_m)``.

    Per chunk of (batch, head) pairs the value is read as ``(c, n1..nk, d)`` and the ``k`` mode products are applied
    in place of layout (:func:`_mode_mul`) between two reused chunk buffers, so no transposed copy and no fresh
    allocation is made per chunk; the last product writes straight into the output when it can. The output is
    allocated like ``v`` (same strides): when ``v`` is the head-split view of a ``(b, n.., h*d)`` projection, merging
    the heads afterwards is free.
    """
    b, h, sizes, k = v.shape[0], v.shape[1], v.shape[2:-1], len(factors)
    out, ws = torch.empty_like(v), _Workspace(v)
    for bs, hs in _chunks(b, h, _chunk_pairs(v)):
        fs = _pair_factors(factors, bs, hs)
        shape = (fs[0].shape[0], *sizes, v.shape[-1])
        x = ws.as_contiguous("x", v[bs, hs], shape)
        for m, s in enumerate(fs):
            dst = _dst_buffer(out[bs, hs], "y", ws, shape) if m == k - 1 else ws.get(("t", m % 2), shape)
            x = _mode_mul(s, x, sizes, m, dst, ws)
        if x.data_ptr() != out[bs, hs].data_ptr():
            out[bs, hs] = x.view(out[bs, hs].shape)
    return out


@_autocast_off
def _kron_apply_backward(gy: torch.Tensor, v: torch.Tensor, factors: Sequence[torch.Tensor], need_v: bool,
                         need_s: Sequence[bool]) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
    """Gradients ``(dv, [dS_m])`` of :func:`_kron_apply_forward` (``None`` where not needed): per chunk, recompute the
    step inputs ``X_m``, then walk back with ``dS_m = G_(m) X_(m)^T`` and ``G <- G x_m S_m^T``. Only ``v`` (usually a
    view of a tensor autograd keeps anyway) and the factors are needed."""
    b, h, sizes, k = v.shape[0], v.shape[1], v.shape[2:-1], len(factors)
    gv = torch.empty_like(v) if need_v else None
    gs = [v.new_empty(b, h, *f.shape[-2:]) if need_s[m] else None for m, f in enumerate(factors)]
    last = max([m for m in range(k) if need_s[m]], default=-1)  # recompute no further than needed
    ws = _Workspace(v)
    gy = gy.to(v.dtype)
    for bs, hs in _chunks(b, h, _chunk_pairs(v)):
        fs = _pair_factors(factors, bs, hs)
        c = fs[0].shape[0]
        shape = (c, *sizes, v.shape[-1])
        inputs = [ws.as_contiguous("x", v[bs, hs], shape)]
        for m in range(last):  # the input of every step whose factor needs a gradient
            inputs.append(_mode_mul(fs[m], inputs[m], sizes, m, ws.get(("in", m), shape), ws))
        g = ws.as_contiguous("g", gy[bs, hs], shape)
        for m in reversed(range(k)):
            if gs[m] is not None:
                _mode_gram(g, inputs[m], sizes, m, gs[m][bs, hs].view(c, sizes[m], sizes[m]), ws)
            if m or need_v:
                dst = _dst_buffer(gv[bs, hs], "gv", ws, shape) if m == 0 else ws.get(("t", m % 2), shape)
                g = _mode_mul(fs[m].transpose(1, 2), g, sizes, m, dst, ws)
        if need_v and g.data_ptr() != gv[bs, hs].data_ptr():
            gv[bs, hs] = g.view(gv[bs, hs].shape)
    return gv, gs


class _KronApply(torch.autograd.Function):
    """``S_1 (x) .. (x) S_k`` with the hand-written, cache-blocked backward (:func:`_kron_apply_forward`,
    :func:`_kron_apply_backward`); only ``v`` and the factors are saved. Eager only: traced code (``torch.compile``,
    ``torch.export``) calls the same kernels as the custom op ``hoformer::kron_apply`` (:mod:`._ops`)."""

    @staticmethod
    def forward(ctx, v: torch.Tensor, *factors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v, *factors)
        return _kron_apply_forward(v, factors)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy: torch.Tensor):
        v, *factors = ctx.saved_tensors
        gv, gs = _kron_apply_backward(gy, v, factors, ctx.needs_input_grad[0], ctx.needs_input_grad[1:])
        return (gv, *gs)


def kron_apply(factors: Sequence[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """Apply ``S_1 (x) ... (x) S_k`` to every ``(b, h, :, d)`` fiber of ``v`` (HOT eq 8; Weaver P^Delta-KMV).

    Args:
        factors: ``k`` tensors ``(B, H, Ni, Ni)``; size-1 (or missing) batch/head dims broadcast.
        v: ``(B, H, N1, ..., Nk, D)``, any strides (the output is allocated with the same memory layout).

    Returns:
        ``(B, H, N1, ..., Nk, D)`` with ``y[.., i1..ik, d] = sum_j prod_m S_m[i_m, j_m] v[.., j1..jk, d]``.

    First-order gradients only (the backward is hand-written and ``once_differentiable``): a second backward through
    it raises, and ``torch.autograd.grad(..., allow_unused=True)`` of a gradient w.r.t. the factors gives ``None``.
    """
    return _kron_apply(_check_factors(factors, v, "kron_apply"), v)


def _kron_apply(factors: Sequence[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """:func:`kron_apply` without the argument checks: factors ``(.., Ni, Ni)`` broadcasting to ``(B, H)``."""
    factors = _expand_factors(factors, v)
    if torch.compiler.is_compiling():  # torch.compile: the same kernels as one opaque custom op (export: core ops)
        from ._traced import traced_call

        return traced_call(torch.ops.hoformer.kron_apply.default, v, factors)
    return _KronApply.apply(v, *factors)


def kron_sum_apply(factors: Sequence[torch.Tensor], v: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """Apply the Kronecker sum ``S_1 (+) ... (+) S_k`` (HOT eq 9): ``sum_m v x_m S_m``, times ``1/k`` if ``normalize``.

    Shapes and first-order gradients as in :func:`kron_apply`.
    """
    return _kron_sum_apply(_check_factors(factors, v, "kron_sum_apply"), v, normalize)


def _kron_sum_apply(factors: Sequence[torch.Tensor], v: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """:func:`kron_sum_apply` without the argument checks."""
    alpha = 1.0 / len(factors) if normalize else 1.0
    factors = _expand_factors(factors, v)
    if torch.compiler.is_compiling():  # torch.compile: the same kernels as one opaque custom op (export: core ops)
        from ._traced import traced_call

        return traced_call(torch.ops.hoformer.kron_sum_apply.default, v, factors, alpha)
    return _KronSumApply.apply(v, alpha, *factors)


def _unfold(x: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """``(b, h, n1..nk, d) -> (bh, P, n_m)``: mode ``m`` last (one copy; none for a size-1 rest)."""
    return x.movedim(2 + m, -1).reshape(x.shape[0] * x.shape[1], -1, n)


def _fold_add(out: torch.Tensor | None, y: torch.Tensor, m: int, like: torch.Tensor) -> torch.Tensor:
    """Add ``y (bh, n_m, P)`` (mode ``m`` first) into ``out`` in the layout of ``like (b, h, n1..nk, d)``."""
    rest = [s for i, s in enumerate(like.shape[2:-1]) if i != m] + [like.shape[-1]]
    y = y.view(*like.shape[:2], like.shape[2 + m], *rest).movedim(2, 2 + m)
    return y.contiguous() if out is None else out.add_(y)


def _kron_sum_chunk(src, dst, fs, alpha: float, transpose: bool, ws: _Workspace) -> None:
    """``dst = alpha * sum_m src x_m S_m`` (``S_m^T`` if ``transpose``) for one chunk ``(cb, ch, n1..nk, d)``."""
    sizes = src.shape[2:-1]
    shape = (fs[0].shape[0], *sizes, src.shape[-1])
    x = ws.as_contiguous("x", src, shape)
    y = _dst_buffer(dst, "y", ws, shape)
    for m, s in enumerate(fs):
        _mode_mul(s.transpose(1, 2) if transpose else s, x, sizes, m, y, ws, accumulate=m > 0)
    if alpha != 1.0:
        y.mul_(alpha)
    if y.data_ptr() != dst.data_ptr():
        dst.copy_(y.view(dst.shape))


@_autocast_off
def _kron_sum_apply_forward(v: torch.Tensor, factors: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """``alpha * sum_m v x_m S_m``, cache-blocked and copy-free like :func:`_kron_apply_forward` (the terms accumulate
    in one buffer through ``baddbmm``)."""
    b, h = v.shape[:2]
    out, ws = torch.empty_like(v), _Workspace(v)
    for bs, hs in _chunks(b, h, _chunk_pairs(v)):
        _kron_sum_chunk(v[bs, hs], out[bs, hs], _pair_factors(factors, bs, hs), alpha, False, ws)
    return out


@_autocast_off
def _kron_sum_apply_backward(g: torch.Tensor, v: torch.Tensor, factors: Sequence[torch.Tensor], alpha: float,
                             need_v: bool, need_s: Sequence[bool]):
    """Gradients ``(dv, [dS_m])`` of :func:`_kron_sum_apply_forward` (``None`` where not needed):
    ``dv = alpha * sum_m g x_m S_m^T`` (the adjoint of a Kronecker sum is the sum of the transposes) and
    ``dS_m = alpha * G_(m) V_(m)^T`` from the chunk's mode-``m`` fibres."""
    b, h, sizes = v.shape[0], v.shape[1], v.shape[2:-1]
    gv = torch.empty_like(v) if need_v else None
    gs = [v.new_empty(b, h, *f.shape[-2:]) if need_s[m] else None for m, f in enumerate(factors)]
    ws = _Workspace(v)
    g = g.to(v.dtype)
    for bs, hs in _chunks(b, h, _chunk_pairs(v)):
        fs = _pair_factors(factors, bs, hs)
        if need_v:
            _kron_sum_chunk(g[bs, hs], gv[bs, hs], fs, alpha, True, ws)
        if not any(need_s):
            continue
        c = fs[0].shape[0]
        shape = (c, *sizes, v.shape[-1])
        gc, vc = ws.as_contiguous("g", g[bs, hs], shape), ws.as_contiguous("x", v[bs, hs], shape)
        for m in range(len(fs)):
            if gs[m] is not None:
                d = _mode_gram(gc, vc, sizes, m, gs[m][bs, hs].view(c, sizes[m], sizes[m]), ws)
                if alpha != 1.0:
                    d.mul_(alpha)
    return gv, gs


class _KronSumApply(torch.autograd.Function):
    """``alpha * sum_m v x_m S_m`` with the hand-written backward (:func:`_kron_sum_apply_forward`,
    :func:`_kron_sum_apply_backward`); saves ``v`` and the factors. Eager only: traced code calls the same kernels
    as the custom op ``hoformer::kron_sum_apply`` (:mod:`._ops`)."""

    @staticmethod
    def forward(ctx, v: torch.Tensor, alpha: float, *factors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v, *factors)
        ctx.alpha = alpha
        return _kron_sum_apply_forward(v, factors, alpha)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        v, *factors = ctx.saved_tensors
        gv, gs = _kron_sum_apply_backward(g, v, factors, ctx.alpha, ctx.needs_input_grad[0],
                                          ctx.needs_input_grad[2:])
        return (gv, None, *gs)


def _kron_sum_ops(ops, v: torch.Tensor) -> torch.Tensor:
    """Kronecker sum for operator-valued factors (the linear kernel): ``op(X (bh, P, n_m)) -> S_m X^T``."""
    out = None
    for m, op in enumerate(ops):
        out = _fold_add(out, op(_unfold(v, m, v.shape[2 + m])), m, v)
    return out / len(ops) if len(ops) > 1 else out


# ------------------------------------------------------------------------------------------------ attention
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``, the positive feature map of linear attention (Katharopoulos et al.)."""
    return F.elu(x) + 1.0


def mode_attention_factors(
    q: Sequence[torch.Tensor],
    k: Sequence[torch.Tensor],
    *,
    scale: float | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    score_fn: Callable[..., torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Per-mode attention matrices ``S_i = softmax(q_i k_i^T * scale + mask_i)`` (HOT eq 7), ``(B, H, Ni, Ni)``.

    With ``score_fn`` (e.g. :func:`~hoformer.functional.tanimoto_scores`) the signed scores are used directly
    as weights (Weaver valence attention); masked entries are then set to 0.
    A row whose mask allows no key yields zeros (never NaN).
    """
    if isinstance(q, torch.Tensor) or not isinstance(q, Sequence):
        raise TypeError(f"mode_attention_factors: `q` must be a list of per-mode tensors (B, H, Ni, Dqk), got "
                        f"{type(q).__name__}")
    _check_qk_masks(q, k, masks, [qi.shape[-2] if isinstance(qi, torch.Tensor) and qi.ndim >= 2 else -1 for qi in q],
                    "mode_attention_factors")
    check_scale("mode_attention_factors", scale)
    return _mode_factors(q, k, scale, masks, score_fn)


def _mode_factors(q, k, scale, masks, score_fn) -> list[torch.Tensor]:
    """:func:`mode_attention_factors` without the argument checks (its callers have made them)."""
    out = []
    for i, (qi, ki) in enumerate(zip(q, k)):
        mask = None if masks is None else masks[i]
        if score_fn is not None:
            s = score_fn(qi, ki)
            if mask is not None:
                s = s * mask
        else:
            s = masked_softmax(_dot(qi, ki, scale), mask)  # fully masked rows: 0
        out.append(s)
    return out


def _check_qk_masks(q, k, masks, sizes, fn, where: str = "") -> None:
    """Per-mode queries / keys ``(B, H, Ni, Dqk)`` and optional bool masks ``(..., Ni, Ni)`` for mode sizes ``sizes``."""
    nmodes = len(sizes)
    for name, seq in (("q", q), ("k", k)):
        if isinstance(seq, torch.Tensor) or not isinstance(seq, Sequence):
            raise TypeError(f"{fn}: `{name}` must be a list of {nmodes} per-mode tensors (B, H, Ni, Dqk)")
        if len(seq) != nmodes:
            raise ValueError(f"{fn}: {where}{nmodes} modes but `{name}` has {len(seq)} tensors")
    for i, n in enumerate(sizes):
        for name, t in ((f"q[{i}]", q[i]), (f"k[{i}]", k[i])):
            _check_tensor(t, name, fn, 2)
            if t.shape[-2] != n:
                raise ValueError(f"{fn}: `{name}` must have shape (B, H, {n}, Dqk) to match mode {i + 1}"
                                 f"{' of ' + where.rstrip(': ') if where else ''}, got {tuple(t.shape)}")
        if q[i].shape[-1] != k[i].shape[-1]:
            raise ValueError(f"{fn}: `q[{i}]` {tuple(q[i].shape)} and `k[{i}]` {tuple(k[i].shape)} differ in Dqk")
    _check_mode_masks(masks, sizes, fn)


def _check_mode_masks(masks, sizes, fn: str, bh: tuple[int, int] | None = None) -> None:
    """Per-mode masks: ``None``, or a list with one entry per mode of ``sizes``, each ``None`` or a bool
    ``(..., Ni, Ni)``; given ``bh = (B, H)``, also at most 4-d and broadcasting like ``(B|1, H|1, Ni, Ni)``."""
    if masks is None:
        return
    nmodes = len(sizes)
    if isinstance(masks, torch.Tensor) or len(masks) != nmodes:
        raise ValueError(f"{fn}: `masks` must be a list of {nmodes} entries (one per mode, None allowed), got "
                         f"{type(masks).__name__ if isinstance(masks, torch.Tensor) else len(masks)}")
    for i, (m, n) in enumerate(zip(masks, sizes)):
        if m is None:
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise TypeError(f"{fn}: `masks[{i}]` must be a bool tensor (True = attend), got "
                            f"{getattr(m, 'dtype', type(m))}")
        if bh is None:
            if m.ndim < 2 or m.shape[-2:] != (n, n):
                raise ValueError(f"{fn}: `masks[{i}]` must have shape (..., {n}, {n}), got {tuple(m.shape)}")
        elif not 2 <= m.ndim <= 4 or m.shape[-2:] != (n, n) or any(
                a not in (1, c) for a, c in zip(m.shape[:-2][::-1], bh[::-1])):
            raise ValueError(f"{fn}: `masks[{i}]` must broadcast like (B|1, H|1, {n}, {n}) with (B, H) = {bh}, "
                             f"got {tuple(m.shape)}")


def _check_qkv(q, k, v, masks, fn):
    _check_tensor(v, "v", fn, 4)
    _check_qk_masks(q, k, masks, v.shape[2:-1], fn, f"`v` of shape {tuple(v.shape)} has ")
    bh = tuple(v.shape[:2])
    named = [(f"{name}[{i}]", t) for i in range(len(q)) for name, t in (("q", q[i]), ("k", k[i]))]
    named += [(f"masks[{i}]", m) for i, m in enumerate(masks or ()) if m is not None]
    for name, t in named:  # leading dims broadcast against v's (B, H): size 1 or equal, at most two of them
        lead = tuple(t.shape[:-2])
        if len(lead) > 2 or any(a not in (1, c) for a, c in zip(lead[::-1], bh[::-1])):
            raise ValueError(f"{fn}: `{name}` must have leading dims broadcastable to (B, H) = {bh} of `v` (at most "
                             f"two, each 1 or equal), got shape {tuple(t.shape)}")
    if not torch.is_autocast_enabled(v.device.type):
        for i in range(len(q)):
            if q[i].dtype != k[i].dtype:
                raise TypeError(f"{fn}: `q[{i}]` ({q[i].dtype}) and `k[{i}]` ({k[i].dtype}) must share a dtype")


def kronecker_attention(
    q: Sequence[torch.Tensor],
    k: Sequence[torch.Tensor],
    v: torch.Tensor,
    *,
    combine: str = "product",
    kernel: str = "softmax",
    scale: float | None = None,
    masks: Sequence[torch.Tensor | None] | None = None,
    feature_map: FeatureMap | None = None,
    dropout_p: float = 0.0,
    return_factors: bool = False,
    score_fn: Callable[..., torch.Tensor] | None = None,
):
    """Kronecker-structured high-order attention (HOT eqs 3-9; linear kernel: paper 002 eqs 10-12).

    Args:
        q, k: ``k`` pooled per-mode queries / keys ``(B, H, Ni, Dqk)``.
        v: values ``(B, H, N1..Nk, Dv)``.
        combine: ``"product"`` (``S_1 (x) .. (x) S_k``) or ``"sum"`` (``(1/k) S_1 (+) .. (+) S_k``).
        kernel: ``"softmax"`` or ``"linear"`` (``S_i = diag(A_i 1)^-1 A_i``, ``A_i = phi(q_i) phi(k_i)^T``; applied
            by associativity without forming ``S_i``, or formed when that is cheaper or the mode is masked).
        scale: softmax logit scale, keyword only; default ``Dqk ** -0.5``.
        masks: per mode ``None`` or bool ``(..., Ni, Ni)``, True = may attend (SDPA convention); any kernel (linear:
            masked entries of ``A_i`` are 0 before the row normalisation). A row with no allowed key gives zeros.
        feature_map: ``phi`` of the linear kernel (default ``elu(x) + 1``); it must return positive features.
        dropout_p: dropout on the factor matrices (softmax kernel).
        return_factors: also return the list of ``S_i`` (for the linear kernel the normalised ``A_i``).
        score_fn: optional signed score kernel ``(q_i, k_i) -> (B, H, Ni, Ni)`` used as the factor instead of the
            softmax (e.g. ``tanimoto_scores``); kernel must be ``"softmax"``.

    Returns:
        ``y (B, H, N1..Nk, Dv)`` or ``(y, factors)``.
    """
    fn = "kronecker_attention"
    _check_qkv(q, k, v, masks, fn)
    if combine not in ("product", "sum"):
        raise ValueError(f"{fn}: `combine` must be 'product' or 'sum', got {combine!r}")
    if kernel not in ("softmax", "linear"):
        raise ValueError(f"{fn}: `kernel` must be 'softmax' or 'linear', got {kernel!r}")
    check_fraction(fn, "dropout_p", dropout_p)
    check_scale(fn, scale)
    if score_fn is not None and scale is not None:
        raise ValueError(f"{fn}: `scale` has no effect with a signed `score_fn` (its scores are used as they are)")
    if kernel == "linear":
        if score_fn is not None:
            raise ValueError(f"{fn}: `score_fn` needs kernel='softmax' (the linear kernel's factors are "
                             f"row-normalised phi(q_i) phi(k_i)^T)")
        if scale is not None or dropout_p:
            raise ValueError(f"{fn}: `scale` and `dropout_p` apply to softmax factors only; kernel='linear' may "
                             f"apply S_i by associativity without forming it (got scale={scale}, "
                             f"dropout_p={dropout_p})")
        phi = feature_map or elu_feature_map
        feats = [(phi(qi), phi(ki)) for qi, ki in zip(q, k)]
        if feature_map is not None:  # negative features make the row normaliser cross 0: NaN / inf, silently
            check_values(torch.stack([torch.stack([fq.min(), fk.min()]) for fq, fk in feats]).min() >= 0,
                         f"{fn}: kernel='linear' needs finite `q` / `k` and a `feature_map` returning non-negative "
                         f"features (e.g. elu(x) + 1, FAVOR+){DETAIL}", lambda: _feature_problem(q, k, feats))
        return _linear_attention(feats, v, combine, masks, return_factors)
    return _kronecker_attention(q, k, v, combine, scale, masks, dropout_p, return_factors, score_fn)


def _kronecker_attention(q, k, v, combine: str, scale, masks, dropout_p: float, return_factors: bool, score_fn):
    """The softmax / signed-score path of :func:`kronecker_attention` without the argument checks (the linear kernel's
    unchecked entry is :func:`_linear_attention`, on features)."""
    factors = _mode_factors(q, k, scale, masks, score_fn)
    factors = [s.to(v.dtype) for s in factors]
    used = [F.dropout(s, p=dropout_p) for s in factors] if dropout_p > 0 else factors
    y = _kron_apply(used, v) if combine == "product" else _kron_sum_apply(used, v, normalize=True)
    return (y, factors) if return_factors else y


def _feature_problem(q, k, feats) -> str:
    """What made the linear kernel's feature check fail: a non-finite input, non-finite features or a negative one."""
    for i, (fq, fk) in enumerate(feats):
        for name, x, f in ((f"q[{i}]", q[i], fq), (f"k[{i}]", k[i], fk)):
            bad = ~torch.isfinite(x)
            if bad.any():
                nan = int(torch.isnan(x).sum())
                return (f"; got non-finite input `{name}` ({nan} NaN, {int(bad.sum()) - nan} inf of {x.numel()} "
                        f"values, shape {tuple(x.shape)})")
            if not torch.isfinite(f).all():
                return f"; `feature_map` returned non-finite features for the finite input `{name}`"
    lo = min(min(fq.min(), fk.min()) for fq, fk in feats).item()
    return f"; `feature_map` must return non-negative features, got a minimum of {lo:.3g}"


def linear_factor(fq: torch.Tensor, fk: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The linear kernel's factor ``S = diag(A 1)^-1 A`` with ``A = fq fk^T`` (entries where the bool ``mask`` is False
    set to 0 first), formed explicitly. A row without mass (a query whose keys are all masked, or all-zero features)
    is 0, with finite gradients, as in the associative :func:`_linear_op`."""
    fq, fk = _rescaled(fq, fk)
    a = torch.matmul(fq, fk.transpose(-1, -2))
    if mask is not None:
        a = a.masked_fill(~mask, 0.0)
    return a / _safe_denominator(a.sum(-1, keepdim=True))


def _rescaled(fq: torch.Tensor, fk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fq / max_f fq`` per query and ``fk / max fk`` per (batch, head): factors common to a row of ``S`` (they cancel
    in its normalisation; detached, so gradients are unchanged) that keep small features off the subnormal numbers,
    whose sums and reciprocals lose precision or overflow."""
    cq = fq.detach().amax(-1, keepdim=True)
    ck = fk.detach().amax((-2, -1), keepdim=True)
    return fq / _safe_denominator(cq), fk / _safe_denominator(ck)


def _safe_denominator(s: torch.Tensor) -> torch.Tensor:
    """Non-negative ``s`` with its zeros replaced by 1 (the rows they normalise are 0). Not a clamp at the dtype's
    smallest normal number: FAVOR+ row sums are often below fp16's (6e-5), and ``g / tiny`` overflows in backward."""
    return torch.where(s > 0, s, torch.ones_like(s))


def forms_linear_factor(n: int, f: int, p: int) -> bool:
    """The linear kernel's route for an unmasked mode of size ``n``: whether forming its factor ``S (n, n)`` and
    applying it to ``p`` columns (``2 n^2 (f + p)`` flops: ``fq fk^T``, then ``S X``) costs no more than applying it
    by associativity (``4 n f p``: ``fk^T X``, then ``fq (.)``), for ``f`` features. HOT's modes are short (``n``
    below ``2 f`` or so), so usually it does."""
    return n * (f + p) <= 2 * f * p


def _linear_attention(feats, v: torch.Tensor, combine: str, masks, return_factors: bool):
    """The linear kernel (paper 002 eqs 10-12) on features ``feats[i] = (phi(q_i), phi(k_i))`` ``(B, H, Ni, F)``.

    Per mode, ``S_i = diag(A_i 1)^-1 A_i`` with ``A_i = phi(q_i) phi(k_i)^T`` (masked entries of ``A_i`` set to 0) is
    applied either by associativity, ``phi(q_i) (phi(k_i)^T X)`` (:func:`_linear_op`, cost linear in ``Ni``), or
    formed explicitly (:func:`linear_factor`) when it is cheaper (:func:`forms_linear_factor`) or masked (a mask is
    not a low-rank operator). When every factor is explicit, the cache-blocked :func:`kron_apply` /
    :func:`kron_sum_apply` apply them, as for the softmax kernel; under ``torch.compile`` plain matmuls do, so the
    kernel stays traceable. Both routes compute the same operator.
    """
    b, h, sizes = v.shape[0], v.shape[1], v.shape[2:-1]
    total = v[0, 0].numel()
    masks = [None] * len(sizes) if masks is None else list(masks)
    # in v's dtype (autocast off: its casts would undo this choice), but fp16 runs in float32: its range ends at 6e-5
    # (normal) / 6e-8 (subnormal), where FAVOR+ row sums and products often are; bf16 has float32's range
    dtype = torch.float32 if v.dtype == torch.float16 else v.dtype
    with torch.autocast(v.device.type, enabled=False):
        va = v.to(dtype)
        feats = [(fq.to(dtype), fk.to(dtype)) for fq, fk in feats]
        explicit = [m is not None or forms_linear_factor(n, fq.shape[-1], total // n)
                    for (fq, _), m, n in zip(feats, masks, sizes)]
        factors = [linear_factor(fq, fk, m) if e or return_factors else None
                   for (fq, fk), m, e in zip(feats, masks, explicit)]
        if all(explicit) and not torch.compiler.is_compiling():
            y = _kron_apply(factors, va) if combine == "product" else _kron_sum_apply(factors, va, normalize=True)
        else:
            ops = [_matrix_op(s, b, h) if e else _linear_op(fq, fk, b, h)
                   for (fq, fk), s, e in zip(feats, factors, explicit)]
            y = _kron_apply_ops(ops, va.movedim(-1, 2), sizes) if combine == "product" else _kron_sum_ops(ops, va)
    y = y.to(v.dtype)
    return (y, [f.to(v.dtype) for f in factors]) if return_factors else y


def _matrix_op(s: torch.Tensor, b: int, h: int) -> Callable:
    """``X (bh, P, n) -> S X^T`` for an explicit factor ``s (B|1, H|1, n, n)``."""
    s = _flat_factor(s, b, h)
    return lambda x: torch.matmul(s, x.transpose(1, 2))


def _linear_op(fq: torch.Tensor, fk: torch.Tensor, b: int, h: int) -> Callable:
    """``X (bh, P, n) -> S X^T`` with ``S = diag(fq fk^T 1)^-1 fq fk^T``, never forming ``S`` (cost O(n f P))."""
    fq, fk = _rescaled(fq, fk)
    fq, fk = _flat_factor(fq, b, h), _flat_factor(fk, b, h)  # (bh, n, f)
    denom = _safe_denominator(torch.matmul(fq, fk.sum(dim=1, keepdim=True).transpose(1, 2)))  # (bh, n, 1)

    def op(x: torch.Tensor) -> torch.Tensor:
        kv = torch.matmul(fk.transpose(1, 2), x.transpose(1, 2))  # (bh, f, P)
        return torch.matmul(fq, kv) / denom  # a division: the reciprocal of a tiny sum can overflow

    return op


def full_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Non-factorized high-order attention (HOT eqs 1-2): flatten the modes and run SDPA.

    ``q, k (B, H, N1..Nk, Dqk)``, ``v (B, H, N1..Nk, Dv)``, ``mask`` bool ``(..., prod N, prod N)`` True = attend.
    """
    fn = "full_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, name, fn, 4)
    if q.shape[:-1] != k.shape[:-1] or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"{fn}: `q`, `k`, `v` must share (B, H, N1..Nk), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_fraction(fn, "dropout_p", dropout_p)
    check_scale(fn, scale)
    b, h = v.shape[:2]
    sizes = v.shape[2:-1]
    n = math.prod(sizes)
    if mask is not None and (mask.dtype != torch.bool or mask.shape[-2:] != (n, n)):
        raise ValueError(f"{fn}: `mask` must be bool (..., {n}, {n}), got {mask.dtype} {tuple(mask.shape)}")
    y = sdpa(q.reshape(b, h, n, -1), k.reshape(b, h, n, -1), v.reshape(b, h, n, -1), mask=mask, scale=scale,
             dropout_p=dropout_p)
    return y.view(b, h, *sizes, -1)


def sdpa(q, k, v, *, mask=None, scale=None, dropout_p=0.0) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` over the second-to-last dim (unchecked), with hoformer's masking rule: a
    row whose ``mask`` allows no key gives zeros (some SDPA kernels and torch versions give NaN there), as in the
    Kronecker path."""
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return y if mask is None else y.masked_fill(~mask.any(-1, keepdim=True), 0.0)


# ------------------------------------------------------------------------------------- dense references
def kron_dense(factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dense ``S_1 (x) ... (x) S_k`` batched over leading dims (reference / analysis only: O(prod(N)^2))."""
    out = factors[0]
    for s in factors[1:]:
        lead = torch.broadcast_shapes(out.shape[:-2], s.shape[:-2])
        a, c = out.expand(*lead, *out.shape[-2:]), s.expand(*lead, *s.shape[-2:])
        out = (a[..., :, None, :, None] * c[..., None, :, None, :]).reshape(
            *lead, a.shape[-2] * c.shape[-2], a.shape[-1] * c.shape[-1]
        )
    return out


def kron_sum_dense(factors: Sequence[torch.Tensor], normalize: bool = False) -> torch.Tensor:
    """Dense Kronecker sum ``sum_m I (x) .. (x) S_m (x) .. (x) I`` (times ``1/k`` if ``normalize``)."""
    sizes = [s.shape[-1] for s in factors]
    total = None
    for m, s in enumerate(factors):
        parts = [torch.eye(n, dtype=s.dtype, device=s.device) for n in sizes]
        parts[m] = s
        term = kron_dense(parts)
        total = term if total is None else total + term
    return total / len(factors) if normalize else total
