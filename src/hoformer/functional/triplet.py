"""Triplet (3D) block-diagonal attention (HOBA, paper 004 section 3.2, appendix A.3 Algorithm 1).

Axis legend
-----------
``b`` batch, ``h`` heads, ``n`` sequence positions (``L``), ``d`` per-head features, ``w`` windows (blocks),
``i`` query / ``j, l`` key-pair positions inside one window of ``s = block_size`` tokens.

Within window ``m`` (Algorithm 1, lines 9-14)::

    T[i, j, l] = scale * sum_d q[i, d] k1[j, d] k2[l, d]            (3D score cube, eq 2)
    A[i]       = softmax over (j, l) of T[i]                          (joint softmax over key pairs)
    C[i, d]    = sum_{j, l} A[i, j, l] v1[j, d] v2[l, d]              (g(x_j, x_l) = v1_j * v2_l, eq 2)

and a token covered by several overlapping windows (eq 3) receives the mean of its window outputs (eq 4).
:func:`cross_block_attention` is the global routing of eqs 5-7 over the means of non-overlapping blocks, and
:func:`block_attention` the matched pairwise (2D) block-local baseline of section 4.3 (same windows, same overlap).

:func:`triplet_attention` never forms the ``(s, s, d)`` value-pair tensor ``U = v1 (x) v2`` of Algorithm 1: it uses
``C[i] = sum_j v1[j] * (A[i, j, :] @ v2)``. It processes tiles of (windows x query rows) under an element budget, so
the live ``(s, s)`` score slices never exceed ``chunk_elements``; the backward pass recomputes the scores from
``q, k1, k2`` (flash-attention style), so only the inputs, the per-window outputs and one log-sum-exp per (window,
query) are kept for autograd. Its only ``(s, s, d)`` temporary is the gradient ``dU = A^T dC`` of a tile of whole
windows (within the same budget as that tile's score cube), which yields ``dv1`` and ``dv2`` in one contraction; a
window split into row chunks takes two contractions instead. :func:`triplet_attention_naive` is the literal
per-window algorithm of the paper (explicit score cube and value-pair tensor) and serves as the test reference.
"""
from __future__ import annotations

import functools

import torch

from hoformer._checks import check_finite_result, check_fraction, check_int, check_scale

from .products import _autocast_off
from .scores import _masked_softmax

__all__ = [
    "triplet_windows",
    "triplet_grid_length",
    "triplet_attention",
    "triplet_attention_naive",
    "triplet_attention_weights",
    "block_attention",
    "block_attention_weights",
    "cross_block_attention",
    "cross_block_attention_weights",
]


# ----------------------------------------------------------------------------------------------- windows
def triplet_windows(seq_len: int, block_size: int, overlap: float = 0.0) -> list[int]:
    """Start positions of the (overlapping) windows of eq 3.

    Stride ``max(1, round(block_size * (1 - overlap)))``; starts ``0, stride, ...`` while ``start + block_size <=
    seq_len``, plus a final window ``[seq_len - block_size, seq_len)`` when the end is not covered. A sequence
    shorter than ``block_size`` is one window ``[0, seq_len)`` (start 0, effective size ``seq_len``).
    """
    _check_window_args(seq_len, block_size, overlap, "triplet_windows")
    return _windows(seq_len, block_size, overlap)


def _windows(seq_len: int, block_size: int, overlap: float) -> list[int]:
    """:func:`triplet_windows` without the argument checks."""
    if seq_len <= block_size:
        return [0]
    stride = max(1, round(block_size * (1 - overlap)))
    starts = list(range(0, seq_len - block_size + 1, stride))
    if starts[-1] + block_size < seq_len:
        starts.append(seq_len - block_size)
    return starts


def triplet_grid_length(seq_len: int, block_size: int, overlap: float = 0.0) -> int:
    """Length to pad a ``seq_len`` sequence to so that its windows are the fixed grid of eq 3.

    :func:`triplet_windows` ends a sequence whose length is off the stride grid with a window ``[L - s, L)``, so
    the windows over a token would depend on how much padding follows it (a text batch is padded to its longest
    sample). Padded (with masked positions) to ``((seq_len - 1) // stride) * stride + block_size``, every grid window
    ``[m * stride, m * stride + block_size)`` that starts before ``seq_len`` is present and nothing else: a token gets
    the same windows, hence the same output, whatever the padding (the paper pads every sequence to one length).
    ``seq_len <= stride`` is returned as is: its one window ``[0, seq_len)`` already equals the first grid window.
    """
    _check_window_args(seq_len, block_size, overlap, "triplet_grid_length")
    return _grid_length(seq_len, block_size, overlap)


def _grid_length(seq_len: int, block_size: int, overlap: float) -> int:
    """:func:`triplet_grid_length` without the argument checks."""
    stride = max(1, round(block_size * (1 - overlap)))
    return seq_len if seq_len <= stride else ((seq_len - 1) // stride) * stride + block_size


def _check_window_args(seq_len, block_size, overlap, fn: str) -> None:
    check_int(fn, "block_size", block_size)
    check_fraction(fn, "overlap", overlap)
    check_int(fn, "seq_len", seq_len, note=" (the sequence length)")


def _check_inputs(q, k1, k2, v1, v2, mask, block_size, overlap, fn: str, names=("q", "k1", "k2", "v1", "v2")):
    for name, t in zip(names, (q, k1, k2, v1, v2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{fn}: `{name}` must be a floating-point tensor, got dtype {t.dtype}")
        if t.ndim != 4:
            raise ValueError(f"{fn}: `{name}` must have shape (B, H, L, D), got {tuple(t.shape)}")
        if t.shape != q.shape:
            raise ValueError(f"{fn}: `{name}` must have the shape of `q` {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(f"{fn}: `{name}` is {t.dtype} on {t.device}, expected `q`'s {q.dtype} on {q.device}")
    if q.numel() == 0:
        raise ValueError(f"{fn}: inputs are empty, got shape {tuple(q.shape)}")
    B, _, L, _ = q.shape
    _check_window_args(L, block_size, overlap, fn)
    return _check_token_mask(mask, B, L, q.device, fn)


def _check_token_mask(mask, B: int, L: int, device, fn: str):
    """``mask`` (None, or a bool ``(B, L)`` tensor with True = real token) on ``device``; a clear error otherwise."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{fn}: `mask` must be a bool tensor (B, L) with True = real token, got {got}")
    if mask.shape != (B, L):
        raise ValueError(f"{fn}: `mask` must have shape (B, L) = {(B, L)}, got {tuple(mask.shape)}")
    return mask.to(device)


def _eager_cache(fn):
    """``functools.lru_cache(maxsize=512)`` for eager calls (512 entries cover every padded length of a bucketed text
    batch stream); a traced call (``torch.compile``, ``torch.export``) builds its tensor afresh: made while tracing it
    is a fake tensor or a graph constant, which must not be served to later eager calls."""
    cached = functools.lru_cache(maxsize=512)(fn)

    @functools.wraps(fn)
    def call(*args):
        return fn(*args) if torch.compiler.is_compiling() else cached(*args)

    return call


# cached per shape and device
@_eager_cache
def _window_index(L: int, block_size: int, overlap: float, device: torch.device) -> torch.Tensor:
    """``(w, s)`` long tensor of token positions per window, ``s = min(block_size, L)``; cached per shape and device
    (built from a Python list: one host-to-device copy per forward and backward otherwise). Read-only. Made outside
    inference mode, so that an index first built during validation can still be saved for a later backward."""
    with torch.inference_mode(False):
        starts = torch.tensor(triplet_windows(L, block_size, overlap), device=device)
        return starts[:, None] + torch.arange(min(block_size, L), device=device)


@_eager_cache
def _window_count(L: int, block_size: int, overlap: float, device: torch.device) -> torch.Tensor:
    """``(L,)`` float32 number of windows covering each token (the divisor of eq 4), counted on the host: a
    ``torch.bincount`` of the index would copy its min / max to the host, a sync per call on CUDA. Cached, read-only."""
    s, count = min(block_size, L), [0] * L
    for st in triplet_windows(L, block_size, overlap):
        for i in range(st, st + s):
            count[i] += 1
    with torch.inference_mode(False):
        return torch.tensor(count, dtype=torch.float32, device=device)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # half / bf16 scores and softmax in fp32


# ------------------------------------------------------------------------------------------------ naive
def triplet_attention_naive(q, k1, k2, v1, v2, *, block_size: int, overlap: float = 0.0, scale=None, mask=None):
    """Literal Algorithm 1 of the paper: a Python loop over windows with the explicit ``(s, s, s)`` score cube
    and ``(s, s, d)`` value-pair tensor. Reference for tests and the benchmark baseline; same contract as
    :func:`triplet_attention`."""
    mask = _check_inputs(q, k1, k2, v1, v2, mask, block_size, overlap, "triplet_attention_naive")
    B, H, L, D = q.shape
    check_scale("triplet_attention_naive", scale)
    scale = D**-0.5 if scale is None else scale
    out = torch.zeros_like(q)
    count = q.new_zeros(L)
    s = min(block_size, L)
    for st in triplet_windows(L, block_size, overlap):
        sl = slice(st, st + s)
        t = torch.einsum("bhid,bhjd,bhld->bhijl", q[:, :, sl], k1[:, :, sl], k2[:, :, sl]) * scale
        km = None if mask is None else mask[:, None, None, sl]  # b 1 1 j
        pair = None if km is None else (km[..., :, None] & km[..., None, :]).flatten(-2)  # b 1 1 (j l)
        a = _masked_softmax(t.flatten(-2), pair).view_as(t)  # joint softmax over (j, l)
        u = torch.einsum("bhjd,bhld->bhjld", v1[:, :, sl], v2[:, :, sl])  # value-pair tensor
        out[:, :, sl] = out[:, :, sl] + torch.einsum("bhijl,bhjld->bhid", a, u)
        count[sl] += 1
    out = out / count[:, None]
    if mask is not None:
        out = out * mask[:, None, :, None]
    return out


def triplet_attention_weights(q, k1, k2, *, block_size: int, overlap: float = 0.0, scale=None, mask=None):
    """Per-window triplet attention tensors ``A (B, H, w, s, s, s)`` (query, key1, key2), rows summing to 1 over
    ``(key1, key2)`` for real queries (zeros for padded queries). Dense; meant for analysis / attention maps."""
    mask = _check_inputs(q, k1, k2, k1, k1, mask, block_size, overlap, "triplet_attention_weights",
                         ("q", "k1", "k2", "k1", "k1"))
    check_scale("triplet_attention_weights", scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    idx = _window_index(q.shape[2], block_size, overlap, q.device)
    cdt = _compute_dtype(q.dtype)  # scores in fp32 like the fast kernel, so the maps are the weights it uses
    qw, k1w, k2w = (x[:, :, idx].to(cdt) for x in (q, k1, k2))  # b h w s d
    t = torch.einsum("bhwid,bhwjd,bhwld->bhwijl", qw, k1w, k2w) * scale
    pair = None
    if mask is not None:
        mw = mask[:, idx]  # b w s
        km = mw[:, None, :, None]
        pair = (km[..., :, None] & km[..., None, :]).flatten(-2)
    a = _masked_softmax(t.flatten(-2), pair).view_as(t)
    if mask is not None:
        a = a * mw[:, None, :, :, None, None]
    return a.to(q.dtype)


# ------------------------------------------------------------------------------------------------- fast
_DEFAULT_CHUNK = {"cpu": 1 << 19}  # elements of the largest live tile tensor; other devices: 1 << 24


def _tile_rows(n_win: int, s: int, d: int, budget: int) -> tuple[int, int]:
    """(windows per tile, query rows per tile) so that ``nw * c * s * max(s, d) <= budget``."""
    per_row = s * max(s, d)
    c = max(1, min(s, budget // per_row))
    nw = max(1, min(n_win, budget // (c * per_row))) if c == s else 1
    return nw, c


@_autocast_off
def _triplet_forward(q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget):
    """Forward of :func:`triplet_attention`: ``(out, C, lse)``, the output and what the backward keeps (per-window
    outputs ``C (B*H*W, s, d)`` and log-sum-exps ``(B*H*W, s)``, in the compute dtype)."""
    B, H, L, D = q.shape
    cdt = _compute_dtype(q.dtype)
    idx = _window_index(L, block_size, overlap, q.device)  # w s
    W, S = idx.shape
    N = B * H * W
    flat = [x.reshape(B * H, L, D) for x in (q, k1, k2, v1, v2)]
    bias = _key_bias(mask, idx, cdt)
    C = torch.empty(N, S, D, device=q.device, dtype=cdt)
    lse = torch.empty(N, S, device=q.device, dtype=cdt)
    nw, c = _tile_rows(N, S, D, budget)
    for n0 in range(0, N, nw):
        n1 = min(N, n0 + nw)
        qw, k1w, k2w, v1w, v2w, bw = _gather(flat, bias, idx, n0, n1, H, W, cdt)
        for i0 in range(0, S, c):
            i1 = min(S, i0 + c)
            a, _, lse[n0:n1, i0:i1] = _scores(qw[:, i0:i1] * scale, k1w, k2w, bw)
            w_ = torch.matmul(a.flatten(1, 2), v2w).view(n1 - n0, i1 - i0, S, D)  # n i j d
            C[n0:n1, i0:i1] = w_.mul_(v1w[:, None]).sum(2)
    out = _scatter_mean(C, idx, _window_count(L, block_size, overlap, q.device), B, H, L, mask).to(q.dtype)
    return out, C, lse


@_autocast_off
def _triplet_backward(g, q, k1, k2, v1, v2, mask, C, lse, block_size, overlap, scale, budget):
    """Gradients ``[dq, dk1, dk2, dv1, dv2]`` of :func:`_triplet_forward`: the scores are recomputed per tile from
    ``q, k1, k2`` and the stored log-sum-exps (flash-attention style)."""
    B, H, L, D = q.shape
    cdt = C.dtype
    idx = _window_index(L, block_size, overlap, q.device)
    W, S = idx.shape
    N = B * H * W
    count = _window_count(L, block_size, overlap, q.device).to(cdt)
    g = g.to(cdt) / count[:, None]
    if mask is not None:
        g = g * mask[:, None, :, None]
    gflat = g.reshape(B * H, L, D)
    flat = [x.reshape(B * H, L, D) for x in (q, k1, k2, v1, v2)]
    bias = _key_bias(mask, idx, cdt)
    grads = [torch.zeros(B * H * L, D, device=q.device, dtype=cdt) for _ in range(5)]
    nw, c = _tile_rows(N, S, D, budget)
    for n0 in range(0, N, nw):
        n1 = min(N, n0 + nw)
        n = n1 - n0
        qw, k1w, k2w, v1w, v2w, bw = _gather(flat, bias, idx, n0, n1, H, W, cdt)
        pos = _positions(idx, n0, n1, H, W, L)  # n s, rows of the flattened (B*H*L) tensors
        gw = gflat.reshape(-1, D)[pos]  # n s d : dL/dC per window
        dq, dk1, dk2, dv1, dv2 = (torch.zeros(n, S, D, device=q.device, dtype=cdt) for _ in range(5))
        for i0 in range(0, S, c):
            i1 = min(S, i0 + c)
            ci = i1 - i0
            qc, gc = qw[:, i0:i1] * scale, gw[:, i0:i1]
            a, p, _ = _scores(qc, k1w, k2w, bw, lse[n0:n1, i0:i1])
            dw = (gc[:, :, None] * v1w[:, None]).flatten(1, 2)  # n (i j) d
            da = torch.matmul(dw, v2w.mT)  # n (i j) l
            if ci == S:  # whole windows: one contraction dU = A^T dC gives both value gradients
                du = torch.matmul(a.flatten(2).mT, gc).view(n, S, S, D)  # n j l d, one tile's worth
                dv1 += (du * v2w[:, None]).sum(2)
                dv2 += du.mul_(v1w[:, :, None]).sum(1)
            else:  # row chunks of a large window: no (s, s, d) tensor, two contractions
                a2 = a.flatten(1, 2)  # n (i j) l
                dv2 += torch.matmul(a2.mT, dw)
                dv1 += (torch.matmul(a2, v2w).view(n, ci, S, D) * gc[:, :, None]).sum(1)
            delta = (gc * C[n0:n1, i0:i1]).sum(-1)  # n i  (= sum_jl A dA)
            # dT / scale (the scale sits in qc), so dk1 and dk2 come out right and dq takes it once
            dt = da.view(n, ci, S, S).sub_(delta[..., None, None]).mul_(a).flatten(1, 2)  # n (i j) l
            z = torch.matmul(dt, k2w).view(n, ci, S, D)  # sum_l dT[i,j,l] k2[l] / scale
            dq[:, i0:i1] = (z * k1w[:, None]).sum(2).mul_(scale)
            dk1 += z.mul_(qc[:, :, None]).sum(1)
            dk2 += torch.matmul(dt.mT, p.flatten(1, 2))
        for acc, part in zip(grads, (dq, dk1, dk2, dv1, dv2)):
            acc.index_add_(0, pos.flatten(), part.flatten(0, 1))
    return [x.view(B, H, L, D).to(q.dtype) for x in grads]


class _TripletFn(torch.autograd.Function):
    """:func:`triplet_attention` with its hand-written backward (first-order gradients only). Eager only: traced code
    calls the same kernels as the custom op ``hoformer::triplet_attention`` (:mod:`._ops`)."""

    @staticmethod
    def forward(ctx, q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget):
        out, C, lse = _triplet_forward(q, k1, k2, v1, v2, mask, block_size, overlap, scale, budget)
        ctx.save_for_backward(q, k1, k2, v1, v2, mask if mask is not None else torch.empty(0), C, lse)
        ctx.cfg = (block_size, overlap, scale, budget, mask is not None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, k1, k2, v1, v2, mask, C, lse = ctx.saved_tensors
        block_size, overlap, scale, budget, has_mask = ctx.cfg
        grads = _triplet_backward(g, q, k1, k2, v1, v2, mask if has_mask else None, C, lse, block_size, overlap,
                                  scale, budget)
        return (*grads, None, None, None, None, None)


def _key_bias(mask, idx, cdt):
    """Additive key bias per window ``(B, w, s)``: 0 for real tokens, -1e30 for padding (finite, so that a window of
    padding only gives a uniform, later zeroed row instead of NaN); ``cdt`` is fp32 or fp64."""
    if mask is None:
        return None
    return torch.zeros(mask[:, idx].shape, device=mask.device, dtype=cdt).masked_fill(~mask[:, idx], -1e30)


def _positions(idx, n0, n1, H, W, L):
    n = torch.arange(n0, n1, device=idx.device)
    return (n // W)[:, None] * L + idx[n % W]  # (n, s) rows in the (B*H*L) flattening


def _gather(flat, bias, idx, n0, n1, H, W, cdt):
    n = torch.arange(n0, n1, device=idx.device)
    bh, w = n // W, n % W
    rows = idx[w]  # n s
    out = [x[bh[:, None], rows].to(cdt) for x in flat]
    bw = None if bias is None else bias[bh // H, w]  # n s
    return (*out, bw)


def _scores(qc, k1w, k2w, bw, lse=None):
    """Triplet softmax for query rows ``qc (n, c, d)``, already multiplied by the score scale -> ``A (n, c, s, s)``,
    the query-key1 products ``P (n, c, s, d)`` and the log-sum-exp ``(n, c)``. Given ``lse`` (the backward), the
    stored one is reused; otherwise the softmax takes one ``exp`` pass over the cube (max, exp, sum, divide) instead
    of ``logsumexp``'s own pass plus a second one. Scaling the ``(c, d)`` queries instead of the ``(c, s, s)`` scores
    is one cube-sized pass less in the forward and one in the backward."""
    n, c, d = qc.shape
    s = k1w.shape[1]
    p = qc[:, :, None] * k1w[:, None]  # n i j d
    t = torch.matmul(p.view(n, c * s, d), k2w.mT).view(n, c, s, s)  # n i j l
    if bw is not None:
        t += bw[:, None, :, None] + bw[:, None, None, :]
    if lse is not None:
        return t.sub_(lse[..., None, None]).exp_(), p, lse
    m = t.flatten(2).amax(-1)
    e = t.sub_(m[..., None, None]).exp_()
    tot = e.flatten(2).sum(-1)
    return e.div_(tot[..., None, None]), p, m + tot.log()


def _scatter_mean(C, idx, count, B, H, L, mask):
    """Window outputs ``C (B*H*W, s, d)`` -> token outputs ``(B, H, L, d)``, mean over covering windows (eq 4)."""
    W, S = idx.shape
    D = C.shape[-1]
    pos = _positions(idx, 0, C.shape[0], H, W, L)
    out = torch.zeros(B * H * L, D, device=C.device, dtype=C.dtype).index_add_(0, pos.flatten(), C.flatten(0, 1))
    out = out.view(B, H, L, D) / count.to(C.dtype)[:, None]
    return out if mask is None else out * mask[:, None, :, None]


def triplet_attention(
    q: torch.Tensor,
    k1: torch.Tensor,
    k2: torch.Tensor,
    v1: torch.Tensor,
    v2: torch.Tensor,
    *,
    block_size: int,
    overlap: float = 0.0,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    chunk_elements: int | None = None,
) -> torch.Tensor:
    """Block-diagonal triplet attention (HOBA eqs 2-4, Algorithm 1 lines 1-17 and 22 without ``W_O``).

    Args:
        q, k1, k2, v1, v2: ``(B, H, L, D)`` (``b h n d``).
        block_size: window size ``s``; ``block_size >= L`` gives full (unblocked) 3D attention, one window.
        overlap: overlap ratio ``lambda`` in ``[0, 1)``; stride ``max(1, round(s (1 - lambda)))`` (eq 3).
        scale: score scale, default ``D ** -0.5``.
        mask: optional bool key-padding mask ``(B, L)``, True = real token. Padded keys get no weight in any
            pair, padded queries return zeros.
        chunk_elements: cap on the elements of the largest live tile tensor (``windows x rows x s x max(s, d)``);
            default ``2**19`` on CPU (cache-sized), ``2**24`` elsewhere.

    Returns:
        ``(B, H, L, D)``: ``o_i = mean_{m covering i} sum_{j,l} A^m[i,j,l] v1[j] * v2[l]`` (eq 4).

    Memory: ``O(B H L D)`` saved for backward (inputs, per-window outputs, one log-sum-exp per row) plus one
    tile; time ``O(B H L s^2 D)`` (forward 2, backward 5 ``s^3 d`` contractions per window; 6 when a window is
    split into row chunks because ``s * s * max(s, D)`` exceeds ``chunk_elements``).
    """
    mask = _check_inputs(q, k1, k2, v1, v2, mask, block_size, overlap, "triplet_attention")
    check_scale("triplet_attention", scale)
    check_int("triplet_attention", "chunk_elements", chunk_elements, optional=True)
    y = _triplet_attention(q, k1, k2, v1, v2, block_size, overlap, scale, mask, chunk_elements)
    check_finite_result(y, "triplet_attention", q=q, k1=k1, k2=k2, v1=v1, v2=v2)
    return y


def _triplet_attention(q, k1, k2, v1, v2, block_size: int, overlap: float, scale, mask,
                       chunk_elements: int | None = None) -> torch.Tensor:
    """:func:`triplet_attention` without the argument checks (``mask`` on ``q``'s device)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if chunk_elements is None:
        chunk_elements = _DEFAULT_CHUNK.get(q.device.type, 1 << 24)
    if torch.compiler.is_compiling():  # torch.compile: the same kernels as one opaque custom op (export: core ops)
        from ._traced import traced_call

        return traced_call(torch.ops.hoformer.triplet_attention.default, q, k1, k2, v1, v2, mask, block_size,
                           float(overlap), scale, chunk_elements)[0]
    return _TripletFn.apply(q, k1, k2, v1, v2, mask, block_size, float(overlap), scale, chunk_elements)


# ----------------------------------------------------------------------------------- 2D and cross-block
def _block_weights(q, k, block_size: int, overlap: float, scale, mask):
    """``(a (B, H, w, s, s), idx (w, s), mw (B, w, s) | None)``: the per-window pairwise softmax of
    :func:`block_attention` (unchecked; rows of padded queries are zeroed by the caller)."""
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    idx = _window_index(q.shape[2], block_size, overlap, q.device)
    qw, kw = q[:, :, idx], k[:, :, idx]  # b h w s d
    t = torch.matmul(qw, kw.transpose(-1, -2)).to(_compute_dtype(q.dtype)) * scale  # b h w i j
    mw = None if mask is None else mask[:, idx]  # b w s
    a = _masked_softmax(t, None if mw is None else mw[:, None, :, None, :]).to(q.dtype)  # all-padding windows: 0
    return a, idx, mw


def block_attention(q, k, v, *, block_size: int, overlap: float = 0.0, scale=None, mask=None):
    """Pairwise (2D) softmax attention inside the same overlapping windows as :func:`triplet_attention`, outputs
    averaged over covering windows (eq 4): the "2D block-local" baseline of section 4.3 / Table 7.

    ``q, k, v (B, H, L, D)``, optional bool key mask ``(B, L)``; returns ``(B, H, L, D)``. Padded queries return
    zeros. The per-window maps are :func:`block_attention_weights`.
    """
    mask = _check_inputs(q, k, k, v, v, mask, block_size, overlap, "block_attention", ("q", "k", "k", "v", "v"))
    check_scale("block_attention", scale)
    y = _block_attention(q, k, v, block_size, overlap, scale, mask)
    check_finite_result(y, "block_attention", q=q, k=k, v=v)
    return y


def _block_attention(q, k, v, block_size: int, overlap: float, scale, mask) -> torch.Tensor:
    """:func:`block_attention` without the argument checks."""
    B, H, L, D = q.shape
    a, idx, _ = _block_weights(q, k, block_size, overlap, scale, mask)
    cw = torch.matmul(a, v[:, :, idx])  # b h w s d
    out = torch.zeros_like(q).index_add_(2, idx.flatten(), cw.flatten(2, 3))
    out = out / _window_count(L, block_size, overlap, q.device).to(q.dtype)[:, None]
    if mask is not None:
        out = out * mask[:, None, :, None]
    return out


def block_attention_weights(q, k, *, block_size: int, overlap: float = 0.0, scale=None, mask=None):
    """The per-window maps ``(B, H, w, s, s)`` of :func:`block_attention` (rows summing to 1 over real keys, zeros for
    padded queries). Meant for analysis / attention maps."""
    mask = _check_inputs(q, k, k, k, k, mask, block_size, overlap, "block_attention_weights",
                         ("q", "k", "k", "k", "k"))
    check_scale("block_attention_weights", scale)
    a, _, mw = _block_weights(q, k, block_size, overlap, scale, mask)
    return a if mw is None else a * mw[:, None, :, :, None]


def _check_cross(o, block_size: int, mask, fn: str):
    if not isinstance(o, torch.Tensor) or not o.is_floating_point():
        got = f"dtype {o.dtype}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise TypeError(f"{fn}: `o` must be a floating-point tensor (B, H, L, D), got {got}")
    if o.ndim != 4 or o.numel() == 0:
        raise ValueError(f"{fn}: `o` must have shape (B, H, L, D), non-empty, got {tuple(o.shape)}")
    B, H, L, D = o.shape
    _check_window_args(L, block_size, 0.0, fn)
    return _check_token_mask(mask, B, L, o.device, fn)


def _cross_weights(o, block_size: int, mask, scale):
    """``(a (B, H, M, M), r (B, H, M, D))``: block means (eq 5) and their softmax attention (eq 6), unchecked."""
    B, H, L, D = o.shape
    scale = D**-0.5 if scale is None else scale
    M = -(-L // block_size)
    pad = M * block_size - L
    w = o.new_ones(B, L) if mask is None else mask.to(o.dtype)
    w = torch.nn.functional.pad(w, (0, pad)).view(B, 1, M, block_size, 1)
    xs = torch.nn.functional.pad(o, (0, 0, 0, pad)).view(B, H, M, block_size, D)
    cnt = w.sum(3)  # b 1 m 1
    r = (xs * w).sum(3) / cnt.clamp_min(1)  # b h m d  (eq 5)
    t = torch.matmul(r, r.transpose(-1, -2)).to(_compute_dtype(o.dtype)) * scale  # b h m m'
    a = _masked_softmax(t, cnt[..., 0][:, :, None, :] > 0).to(o.dtype)  # eq 6; empty blocks get no weight
    return a, r


def cross_block_attention(o, *, block_size: int, mask=None, scale=None):
    """Cross-block interaction (eqs 5-7): ``o_i + sum_m' softmax_m'(r_m . r_m' * scale) r_m'`` with ``m = i // b``.

    Args:
        o: ``(B, H, L, D)`` local outputs (``b h n d``).
        block_size: ``b``; blocks ``[m b, (m + 1) b)`` (the last one may be shorter).
        mask: optional bool ``(B, L)``, True = real token. Block means ``r_m`` (eq 5) average real tokens only;
            blocks without real tokens get no weight; padded tokens are returned as they came (zeros from the local
            attention) without the cross-block term.
        scale: default ``D ** -0.5`` (eq 6).

    Returns:
        ``(B, H, L, D)``. The block attention ``(B, H, M, M)`` is :func:`cross_block_attention_weights`.
    """
    mask = _check_cross(o, block_size, mask, "cross_block_attention")
    check_scale("cross_block_attention", scale)
    y = _cross_block_attention(o, block_size, mask, scale)
    check_finite_result(y, "cross_block_attention", o=o)
    return y


def _cross_block_attention(o, block_size: int, mask, scale=None) -> torch.Tensor:
    """:func:`cross_block_attention` without the argument checks."""
    L = o.shape[2]
    a, r = _cross_weights(o, block_size, mask, scale)
    g = torch.matmul(a, r)  # b h m d
    g = g.repeat_interleave(block_size, 2)[:, :, :L]  # token i gets row m = i // b  (eq 7)
    if mask is not None:
        g = g * mask[:, None, :, None]
    return o + g


def cross_block_attention_weights(o, *, block_size: int, mask=None, scale=None):
    """The block attention ``A (B, H, M, M)`` of :func:`cross_block_attention` (eq 6), ``M = ceil(L / block_size)``.
    Meant for analysis / attention maps."""
    mask = _check_cross(o, block_size, mask, "cross_block_attention_weights")
    check_scale("cross_block_attention_weights", scale)
    return _cross_weights(o, block_size, mask, scale)[0]
