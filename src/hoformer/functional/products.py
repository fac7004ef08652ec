"""The Kronecker product and sum applied to a value tensor without forming them (HOT, paper 000 eqs 8-9; Weaver's
P^Delta-KMV, paper 003 appendix F): the cache-blocked kernels behind :func:`kron_apply` / :func:`kron_sum_apply` and
their hand-written backward.

Axis legend
-----------
``b``  batch, ``h`` heads, ``n1..nk`` the k tensor modes, ``d`` per-head features, ``c`` (batch, head) pairs of a chunk.

For a value tensor ``v (b, h, n1..nk, d)`` and one small matrix per mode ``S_m (b, h, nm, nm)``:

* product (eq 8):  ``y = (S_1 (x) ... (x) S_k) vec(v)``, i.e.
  ``y[.., i1..ik, d] = sum_j prod_m S_m[i_m, j_m] v[.., j1..jk, d]`` (row-major flattening, mode 1 slowest);
* sum (eq 9):      ``y = (1/k) sum_m v x_m S_m`` (mode-m product), the Kronecker sum ``S_1 (+) ... (+) S_k``.

Neither forms the ``prod(n) x prod(n)`` matrix: ``k`` batched matmuls, one per mode, applied in place of layout
(mode 1 is one bmm; for a later mode the fibres before it become batch entries), so the value is not transposed
except to unfold a long mode with a short tail (:func:`_mode_mul`). Both products (:class:`_KronApply`,
:class:`_KronSumApply`) run their whole chain (forward, recompute, backward) on cache-sized chunks of (batch, head)
pairs between reused buffers (see the note above :func:`_chunk_pairs`). The linear kernel's operator-valued factors
use plain batched matmuls on the whole value (:func:`_kron_apply_ops`, :func:`_kron_sum_ops`).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch

__all__ = ["kron_apply", "kron_sum_apply"]


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
# mode product), while the value-sized workspace buffers of a very large input stay bounded (a few x 256 MiB, pooled
# by _Workspace) instead of growing with it; there the product kernel rotates the layout (_rotate) so that its only
# value-sized buffers are the contiguous copies and two step results.
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


def _chunked(v: torch.Tensor, factors: Sequence[torch.Tensor]):
    """Per chunk of (batch, head) pairs of ``v (b, h, n.., d)``: ``(batch slice, head slice, the chunk's factors
    (c, n_m, n_m), the chunk's value shape (c, n.., d))``."""
    b, h = v.shape[:2]
    for bs, hs in _chunks(b, h, _chunk_pairs(v)):
        fs = _pair_factors(factors, bs, hs)
        yield bs, hs, fs, (fs[0].shape[0], *v.shape[2:])


def _grad_buffers(v: torch.Tensor, factors: Sequence[torch.Tensor], need_v: bool, need_s: Sequence[bool]):
    """The gradients a backward kernel fills: ``dv`` like ``v`` and ``dS_m (b, h, n_m, n_m)``, None where not needed."""
    b, h = v.shape[:2]
    gv = torch.empty_like(v) if need_v else None
    return gv, [v.new_empty(b, h, *f.shape[-2:]) if need_s[m] else None for m, f in enumerate(factors)]


def _expand_factors(factors: list[torch.Tensor], v: torch.Tensor) -> list[torch.Tensor]:
    b, h = v.shape[:2]
    return [s.to(v.dtype).expand(b, h, *s.shape[-2:]) for s in factors]


class _Workspace:
    """The scratch buffers of one call, pooled. A buffer is taken for one role (a chunk's contiguous copy of its
    input, the result of one mode product, an unfolding, a repeated factor, per-fibre grams) and given back as soon
    as that role ends, so that the next role, in the same chunk or the next one, reuses it (the smallest free buffer
    that is large enough). The pool holds as many buffers as are live at once, two to four value-sized ones per
    chunk whatever the number of modes, rather than one per role; on CPU the reuse also spares allocations (a fresh
    allocation of a few hundred KiB costs page faults and cache misses worth more than the matmul that fills it), on
    an accelerator it bounds the peak memory of a call. Buffers are reused in stream order (no synchronisation)."""

    def __init__(self, like: torch.Tensor):
        self.like, self.free, self.taken = like, [], {}

    def take(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        fits = [i for i, buf in enumerate(self.free) if buf.numel() >= n]
        if fits:
            buf = self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        else:
            buf = self.like.new_empty(n)
        out = buf[:n].view(shape)
        self.taken[out.data_ptr()] = buf
        return out

    def give(self, t: torch.Tensor) -> None:
        self.free.append(self.taken.pop(t.data_ptr()))

    def contiguous(self, src: torch.Tensor, shape) -> tuple[torch.Tensor, bool]:
        """``(src as shape, taken)``: a view when ``src`` is contiguous (``taken`` False), else a copy into a taken
        buffer (to give back)."""
        if src.is_contiguous():
            return src.view(shape), False
        out = self.take(shape)
        out.view(src.shape).copy_(src)
        return out, True


def _unfolded(t: torch.Tensor, c: int, a: int, n: int, r: int, ws: _Workspace) -> torch.Tensor:
    """The mode unfolding ``(c, n, a * r)`` of a contiguous chunk tensor ``t`` read as ``(c, a, n, r)`` (``a`` fibres
    before the mode, ``r`` the trailing size), copied in runs of ``r`` into a taken buffer (to give back)."""
    u = ws.take((c, n, a, r))
    u.copy_(t.view(c, a, n, r).transpose(1, 2))
    return u.view(c, n, a * r)


def _mode_mul(s: torch.Tensor, x: torch.Tensor, sizes: Sequence[int], m: int, out: torch.Tensor,
              ws: _Workspace, accumulate: bool = False) -> torch.Tensor:
    """Mode-``m`` product in place of layout: ``x (c, n1..nk, d)`` contiguous, ``s (c, n_m, n_m)`` (or a transposed
    view); writes (or adds, if ``accumulate``) ``y[c, .., i_m, .., :] = sum_j s[c, i_m, j] x[c, .., j, .., :]`` into
    ``out`` (same layout). Mode 1 is one bmm. For the others, with ``a`` fibres before mode ``m`` and ``r`` the
    trailing size: while ``n <= 2 r`` the fibres become batch entries and only ``s`` is repeated ``a`` times (``n / r``
    times the size of ``x``; a cheap contiguous write into a pooled buffer, no transposed copy of ``x``); for a long
    mode with a short tail (``n > 2 r``, e.g. Weaver's sensor mode: n = 325, r = d = 16, where the repeat would be
    20x the value) ``x`` is unfolded to ``(c, n, a r)`` instead, one bmm, and folded back (two value-sized copies)."""
    c, n = x.shape[0], sizes[m]
    a = math.prod(sizes[:m])
    r = x[0].numel() // (a * n)
    if a > 1 and n > 2 * r:
        xu = _unfolded(x, c, a, n, r, ws)
        yu = ws.take((c, n, a, r))
        torch.bmm(s, xu, out=yu.view(c, n, a * r))
        ws.give(xu)
        ov = out.view(c, a, n, r)
        if accumulate:
            ov.add_(yu.transpose(1, 2))
        else:
            ov.copy_(yu.transpose(1, 2))
        ws.give(yu)
        return out
    se = None
    if a > 1:
        se = ws.take((c, a, n, n))
        se.copy_(s.unsqueeze(1).expand(c, a, n, n))
        s = se.view(c * a, n, n)
    xv, ov = x.view(c * a, n, -1), out.view(c * a, n, -1)
    if accumulate:
        torch.baddbmm(ov, s, xv, out=ov)
    else:
        torch.bmm(s, xv, out=ov)
    if se is not None:
        ws.give(se)
    return out


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
        t = ws.take((c, a, n, n))
        torch.bmm(g.view(c * a, n, r), x.view(c * a, n, r).transpose(1, 2), out=t.view(c * a, n, n))
        torch.sum(t, 1, out=out)
        ws.give(t)
        return out
    gu, xu = _unfolded(g, c, a, n, r, ws), _unfolded(x, c, a, n, r, ws)
    torch.bmm(gu, xu.transpose(1, 2), out=out)
    ws.give(gu)
    ws.give(xu)
    return out


def _result_buffer(dst: torch.Tensor, ws: _Workspace, shape) -> tuple[torch.Tensor, bool]:
    """Where a chunk result goes: ``(dst as shape, False)`` when it is contiguous, else ``(a taken buffer, True)``
    (copied into ``dst`` and given back afterwards)."""
    return (dst.view(shape), False) if dst.is_contiguous() else (ws.take(shape), True)


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


# On an accelerator the mode products rotate the layout instead (:func:`_rotate`): each is one batched matmul that
# reads its input through a transposed view and writes mode m last, so no factor is repeated and no mode is unfolded
# (on the CPU's cache-sized chunks those copies are cheap and the in-place layout is faster; on an accelerator's
# whole-batch chunk they are value-sized buffers, one to two times the value each, and the peak memory).
def _rotates(v: torch.Tensor) -> bool:
    """Whether the product kernels rotate the layout (:func:`_rotate`) for ``v``: on accelerators."""
    return v.device.type != "cpu"


def _rotate(s: torch.Tensor, x: torch.Tensor, n: int, ws: _Workspace) -> torch.Tensor:
    """One mode product that rotates the layout: ``x`` contiguous with the mode (size ``n``) first, read as
    ``(c, n, P)``; returns ``(S x)^T`` as ``(c, P, n)`` in a taken buffer (the mode last)."""
    c = x.shape[0]
    y = ws.take((c, x[0].numel() // n, n))
    return torch.bmm(x.view(c, n, -1).transpose(1, 2), s.transpose(1, 2), out=y)


def _rotating_chunk_forward(x: torch.Tensor, taken: bool, fs, sizes, dst: torch.Tensor, ws: _Workspace) -> None:
    """``dst (cb, ch, n1..nk, d) = S_1 (x) .. (x) S_k`` of the contiguous chunk ``x (c, n1..nk, d)``: after the ``k``
    rotations the layout is ``(d, n1..nk)``, copied into ``dst``."""
    for m, s in enumerate(fs):
        y = _rotate(s, x, sizes[m], ws)
        if taken:
            ws.give(x)
        x, taken = y, True
    dst.copy_(x.view(*dst.shape[:2], dst.shape[-1], *sizes).movedim(2, -1))
    ws.give(x)


def _rotating_chunk_backward(gy, load_x, fs, sizes, gv, gs, need_s, last: int, ws: _Workspace) -> None:
    """The gradients of :func:`_rotating_chunk_forward` for one chunk: ``gy`` and ``gv`` ``(cb, ch, n1..nk, d)``
    (``gv`` None if not needed), ``gs[m]`` ``(cb, ch, n_m, n_m)`` or None; ``load_x()`` gives ``(x, taken)``, the
    chunk's contiguous value (loaded twice, to hold no copy of it between its two uses). With ``X_m`` the input of
    step ``m`` (mode ``m`` first) and ``G`` the gradient of its output ``(c, P, n_m)``: ``dS_m = G^T X_m^T`` and the
    gradient of ``X_m`` is ``S_m^T G^T``, each one batched matmul on transposed views, no copies."""
    x, x_taken = load_x()
    c, d = x.shape[0], x.shape[-1]
    inputs = [(x, x_taken)]
    for m in range(last):  # the input of every step whose factor needs a gradient
        inputs.append((_rotate(fs[m], inputs[m][0], sizes[m], ws), True))
    if x_taken and last > 0:  # reloaded for step 0's gram
        ws.give(x)
        inputs[0] = None
    g = ws.take((c, d, *sizes))  # the gradient of the last step's output, layout (d, n1..nk)
    g.view(*gy.shape[:2], d, *sizes).copy_(gy.movedim(-1, 2))
    for m in reversed(range(len(fs))):
        n = sizes[m]
        gt = g.view(c, -1, n).transpose(1, 2)  # (c, n, P)
        if need_s[m]:
            if inputs[m] is None:
                inputs[m] = load_x()
            torch.bmm(gt, inputs[m][0].view(c, n, -1).transpose(1, 2), out=gs[m].view(c, n, n))
        if m < len(inputs) and inputs[m] is not None and inputs[m][1]:
            ws.give(inputs[m][0])
        if m == 0 and gv is None:
            break
        direct = m == 0 and gv.is_contiguous()
        dst = gv.view(c, n, -1) if direct else ws.take((c, n, g[0].numel() // n))
        torch.bmm(fs[m].transpose(1, 2), gt, out=dst)
        ws.give(g)
        g = dst
        if m == 0 and not direct:
            gv.copy_(g.view(gv.shape))
            ws.give(g)
        if m == 0:
            return
    ws.give(g)


@_autocast_off  # everything runs in v's dtype, fwd and bwd alike
def _kron_apply_forward(v: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``S_1 (x) .. (x) S_k`` applied to ``v (b, h, n1..nk, d)``, factors expanded to ``(b, h, n_m, n_m)``.

    Per chunk of (batch, head) pairs the value is read as ``(c, n1..nk, d)`` and the ``k`` mode products are applied
    in place of layout (:func:`_mode_mul`), each from the previous one's pooled buffer into another (given back as
    soon as it has been read: two value-sized chunk buffers for any ``k``), so no transposed copy and no fresh
    allocation is made per chunk; the last product writes straight into the output when it can. The output is
    allocated like ``v`` (same strides): when ``v`` is the head-split view of a ``(b, n.., h*d)`` projection, merging
    the heads afterwards is free.
    """
    sizes, k = v.shape[2:-1], len(factors)
    out, ws = torch.empty_like(v), _Workspace(v)
    for bs, hs, fs, shape in _chunked(v, factors):
        x, taken = ws.contiguous(v[bs, hs], shape)
        if _rotates(v):
            _rotating_chunk_forward(x, taken, fs, sizes, out[bs, hs], ws)
            continue
        for m, s in enumerate(fs):
            dst, dst_taken = _result_buffer(out[bs, hs], ws, shape) if m == k - 1 else (ws.take(shape), True)
            _mode_mul(s, x, sizes, m, dst, ws)
            if taken:
                ws.give(x)
            x, taken = dst, dst_taken
        if taken:
            out[bs, hs] = x.view(out[bs, hs].shape)
            ws.give(x)
    return out


@_autocast_off
def _kron_apply_backward(gy: torch.Tensor, v: torch.Tensor, factors: Sequence[torch.Tensor], need_v: bool,
                         need_s: Sequence[bool]) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
    """Gradients ``(dv, [dS_m])`` of :func:`_kron_apply_forward` (``None`` where not needed): per chunk, recompute the
    step inputs ``X_m``, then walk back with ``dS_m = G_(m) X_(m)^T`` and ``G <- G x_m S_m^T``, giving each ``X_m``
    back to the pool once its gram is formed, so that the next ``G`` reuses its buffer (``k + 1`` value-sized chunk
    buffers at most, including the contiguous copies of ``v`` and ``gy``). Only ``v`` (usually a view of a tensor
    autograd keeps anyway) and the factors are needed."""
    sizes, k = v.shape[2:-1], len(factors)
    gv, gs = _grad_buffers(v, factors, need_v, need_s)
    last = max([m for m in range(k) if need_s[m]], default=-1)  # recompute no further than needed
    ws = _Workspace(v)
    gy = gy.to(v.dtype)
    for bs, hs, fs, shape in _chunked(v, factors):
        if _rotates(v):
            _rotating_chunk_backward(gy[bs, hs], lambda bs=bs, hs=hs: ws.contiguous(v[bs, hs], shape), fs, sizes,
                                     None if gv is None else gv[bs, hs], [None if g is None else g[bs, hs] for g in gs],
                                     need_s, last, ws)
            continue
        inputs = [ws.contiguous(v[bs, hs], shape)]  # (X_m, taken from the pool)
        for m in range(last):  # the input of every step whose factor needs a gradient
            inputs.append((_mode_mul(fs[m], inputs[m][0], sizes, m, ws.take(shape), ws), True))
        g, g_taken = ws.contiguous(gy[bs, hs], shape)
        for m in reversed(range(k)):
            if gs[m] is not None:
                _mode_gram(g, inputs[m][0], sizes, m, gs[m][bs, hs].view(shape[0], sizes[m], sizes[m]), ws)
            if m < len(inputs) and inputs[m][1]:
                ws.give(inputs[m][0])
            if m or need_v:
                dst, dst_taken = _result_buffer(gv[bs, hs], ws, shape) if m == 0 else (ws.take(shape), True)
                _mode_mul(fs[m].transpose(1, 2), g, sizes, m, dst, ws)
                if g_taken:
                    ws.give(g)
                g, g_taken = dst, dst_taken
        if need_v and g_taken:
            gv[bs, hs] = g.view(gv[bs, hs].shape)
        if g_taken:
            ws.give(g)
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


def _kron_sum_chunk(x, dst, fs, alpha: float, transpose: bool, ws: _Workspace) -> None:
    """``dst = alpha * sum_m x x_m S_m`` (``S_m^T`` if ``transpose``) for one chunk: ``x (c, n1..nk, d)``
    contiguous, ``dst (cb, ch, n1..nk, d)``."""
    sizes, shape = x.shape[1:-1], x.shape
    y, taken = _result_buffer(dst, ws, shape)
    for m, s in enumerate(fs):
        _mode_mul(s.transpose(1, 2) if transpose else s, x, sizes, m, y, ws, accumulate=m > 0)
    if alpha != 1.0:
        y.mul_(alpha)
    if taken:
        dst.copy_(y.view(dst.shape))
        ws.give(y)


@_autocast_off
def _kron_sum_apply_forward(v: torch.Tensor, factors: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """``alpha * sum_m v x_m S_m``, cache-blocked and copy-free like :func:`_kron_apply_forward` (the terms accumulate
    in one buffer through ``baddbmm``)."""
    out, ws = torch.empty_like(v), _Workspace(v)
    for bs, hs, fs, shape in _chunked(v, factors):
        x, taken = ws.contiguous(v[bs, hs], shape)
        _kron_sum_chunk(x, out[bs, hs], fs, alpha, False, ws)
        if taken:
            ws.give(x)
    return out


@_autocast_off
def _kron_sum_apply_backward(g: torch.Tensor, v: torch.Tensor, factors: Sequence[torch.Tensor], alpha: float,
                             need_v: bool, need_s: Sequence[bool]):
    """Gradients ``(dv, [dS_m])`` of :func:`_kron_sum_apply_forward` (``None`` where not needed):
    ``dv = alpha * sum_m g x_m S_m^T`` (the adjoint of a Kronecker sum is the sum of the transposes) and
    ``dS_m = alpha * G_(m) V_(m)^T`` from the chunk's mode-``m`` fibres."""
    sizes = v.shape[2:-1]
    gv, gs = _grad_buffers(v, factors, need_v, need_s)
    ws = _Workspace(v)
    g = g.to(v.dtype)
    for bs, hs, fs, shape in _chunked(v, factors):
        gc, g_taken = ws.contiguous(g[bs, hs], shape)
        if need_v:
            _kron_sum_chunk(gc, gv[bs, hs], fs, alpha, True, ws)
        if any(need_s):
            vc, v_taken = ws.contiguous(v[bs, hs], shape)
            for m in range(len(fs)):
                if gs[m] is not None:
                    d = _mode_gram(gc, vc, sizes, m, gs[m][bs, hs].view(shape[0], sizes[m], sizes[m]), ws)
                    if alpha != 1.0:
                        d.mul_(alpha)
            if v_taken:
                ws.give(vc)
        if g_taken:
            ws.give(gc)
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
