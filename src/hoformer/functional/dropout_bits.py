"""Dropout whose CPU masks are a counter-based random stream, fused with their use: the same distribution as
:func:`torch.nn.functional.dropout` (each element kept independently with probability ``1 - p``, to within
``2^-32``, and scaled by ``1 / (1 - p)``) at a fraction of its cost, and no mask kept for the backward pass.

``F.dropout`` on the CPU fills a float mask with ``bernoulli_`` (a double-precision uniform and a comparison per
element, the most expensive operator of a HOT training step after the matmuls), multiplies by it and keeps it for
the backward pass. Here a call draws one 64-bit ``seed`` from the generator, and the mask is a function of it:

* word ``j`` of the mask is SplitMix64's (Steele, Lea & Flood 2014) ``mix(seed + (j + 1) * GAMMA)``; element
  ``j < h = ceil(n / 2)`` of the flattened tensor reads its low 32 bits, element ``h + j`` its high 32 bits; an
  element is kept iff those bits, unsigned, are ``>= round(p * 2^32)``;
* the output is ``x * m`` with ``m = 1 / (1 - p)`` (in ``x``'s dtype) where kept, else 0, and the backward pass
  multiplies the gradient by the same mask, recomputed from the seed.

The fast path is a small C kernel (``csrc/dropout_bits.c``: one pass that reads ``x`` and writes ``y``, vectorised,
split over ``torch.get_num_threads()`` threads with the same result on any number), compiled with the system's C
compiler (``$CC`` or ``cc``) at first use into ``$HOFORMER_CACHE`` (default ``~/.cache/hoformer``) and called through
:mod:`ctypes`; traced code (``torch.compile``) calls it as the opaque op ``hoformer::dropout_bits``, so with ATen's
generator (:class:`hoformer.train.CompileModel`'s CPU default ``fallback_random``) a compiled step draws the eager
masks. The kernel takes float32, float64 and bfloat16 (CPU autocast's dtype: a bfloat16 product rounded as torch
rounds it). :func:`keep_mask_reference` computes the same mask with torch integer operations, eagerly: the path of
float16 inputs and of a machine without a C compiler (a warning says so once;
``HOFORMER_DROPOUT_KERNEL=0`` chooses it without warning). Every path gives the same masks.

* Reproducible: the seed comes from the global generator (or ``generator``), so ``torch.manual_seed`` /
  ``seed_everything`` and hoformer's per-epoch reseeding fix every mask, and a resumed run draws the masks an
  uninterrupted one draws.
* Off the CPU (CUDA's fused dropout kernel is already cheap) and for ``p = 1``, non-float tensors or ``inplace``,
  this is ``F.dropout``; for ``p = 0`` or eval mode it returns ``x`` itself.

Axis legend: any shape; the mask has ``x``'s shape.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

__all__ = ["bias_gelu_dropout", "dropout", "fuses_bias_gelu", "keep_mask", "keep_mask_reference"]

_SOURCE = Path(__file__).with_name("csrc") / "dropout_bits.c"
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's constants
_PARALLEL_MIN = 1 << 18  # fewer elements than this run on the calling thread
# -fno-trapping-math: the kernels' selects may evaluate both sides (what lets the compiler vectorise them)
_FLAGS = ("-O3", "-fno-trapping-math", "-shared", "-fPIC")


def _signed(u: int) -> int:
    """A 64-bit unsigned constant as the int64 of the same bits (torch's integers are signed)."""
    return u - (1 << 64) if u >= 1 << 63 else u


def _threshold(p: float) -> int:
    return min(round(p * 2**32), 2**32 - 1)


def _draw_seed(generator: torch.Generator | None, device=None) -> torch.Tensor:
    return torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64, device=device, generator=generator)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def keep_mask_reference(shape, p: float, seed: torch.Tensor | int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The scaled mask of ``shape`` for ``seed`` (module doc) in torch integer operations: what the C kernel
    multiplies by, written out (int64 arithmetic wraps as uint64 does)."""
    n = 1
    for size in shape:
        n *= int(size)
    h = (n + 1) // 2
    seed = torch.as_tensor(seed, dtype=torch.int64, device=device)
    z = torch.arange(1, h + 1, dtype=torch.int64, device=seed.device) * _signed(_GAMMA) + seed
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    z = z ^ _shr(z, 31)
    bits = torch.cat([z & 0xFFFFFFFF, _shr(z, 32)])[:n]  # element j: low half of word j; h + j: its high half
    scale = torch.tensor(1.0 / (1.0 - p), dtype=dtype, device=seed.device)
    return torch.where(bits >= _threshold(p), scale, torch.zeros((), dtype=dtype, device=seed.device)).view(shape)


def _cache_dir() -> Path:
    if os.environ.get("HOFORMER_CACHE"):
        return Path(os.environ["HOFORMER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hoformer"


def _compile(source: Path, target: Path, cc: list[str]) -> str | None:
    """Compile ``source`` into the shared library ``target`` (written atomically); the error text, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    error = ""
    for extra in (["-DHOFORMER_CLONES"], []):  # per-ISA clones where the toolchain has them (x86-64 glibc), else not
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            run = subprocess.run([*cc, *_FLAGS, *extra, "-o", tmp, str(source)],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode == 0:
                os.replace(tmp, target)
                return None
            error = run.stderr.strip() or f"exit status {run.returncode}"
        except (OSError, subprocess.SubprocessError) as e:
            error = str(e)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return error


#: the dtypes of the C kernel: ``{dtype: its function's name}``
_KERNELS = {torch.float32: "hoformer_dropout_bits_f32", torch.float64: "hoformer_dropout_bits_f64",
            torch.bfloat16: "hoformer_dropout_bits_bf16"}


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel (built at the first call), or None: ``HOFORMER_DROPOUT_KERNEL=0``, or no C compiler."""
    if os.environ.get("HOFORMER_DROPOUT_KERNEL", "1") == "0":
        return None
    cc = shlex.split(os.environ.get("CC") or "cc")
    source = _SOURCE.read_bytes()
    tag = hashlib.sha256(b"\0".join([source, " ".join([*cc, *_FLAGS]).encode(), platform.machine().encode()]))
    tag = tag.hexdigest()[:16]
    target = _cache_dir() / f"dropout_bits-{tag}.so"
    error = None if target.exists() else _compile(_SOURCE, target, cc)
    try:
        lib = None if error else ctypes.CDLL(str(target))
    except OSError as e:
        lib, error = None, str(e)
    if lib is None:
        warnings.warn(f"hoformer dropout: could not build the CPU kernel {_SOURCE.name} with {' '.join(cc)!r} "
                      f"({error.splitlines()[-1] if error else 'no error text'}); dropout uses the same masks in "
                      "torch operations, slower (set CC to a C compiler, or HOFORMER_DROPOUT_KERNEL=0 to silence "
                      "this)", RuntimeWarning, stacklevel=3)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for dtype, name in _KERNELS.items():  # the scale is a double for float64, else a float (bfloat16's widened)
        fn = getattr(lib, name)
        fn.argtypes = [p, p, i64, ctypes.c_uint64, ctypes.c_uint32,
                       ctypes.c_double if dtype == torch.float64 else ctypes.c_float, i64, i64]
        fn.restype = None
    for t in ("f32", "bf16"):
        fwd = getattr(lib, f"hoformer_bias_gelu_dropout_{t}")
        bwd = getattr(lib, f"hoformer_bias_gelu_dropout_backward_{t}")
        fwd.argtypes = [p, p, p, p, i64, i64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_float, i64, i64]
        bwd.argtypes = [p, p, p, p, i64, i64, i64]
        fwd.restype = bwd.restype = None
    return lib


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="hoformer-dropout")


def _ranges(n: int) -> list[tuple[int, int]]:
    """The word ranges of a mask of ``n`` elements, one per thread of ``torch.get_num_threads()`` (one range for a
    small tensor)."""
    words, threads = (n + 1) // 2, torch.get_num_threads()
    threads = 1 if n < _PARALLEL_MIN else threads
    return [(words * i // threads, words * (i + 1) // threads) for i in range(threads)]


def _run(call, n: int) -> None:
    """``call(i, w0, w1)`` for the word ranges of :func:`_ranges`; ctypes releases the GIL, so they run at once."""
    ranges = _ranges(n)
    if len(ranges) == 1:
        call(0, *ranges[0])
    else:
        list(_pool(len(ranges)).map(lambda i: call(i, *ranges[i]), range(len(ranges))))


def _kernel_apply(fn, x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """``x * mask(seed)`` by the C kernel ``fn`` (``x`` contiguous, on the CPU). The scale is the mask's value in
    ``x``'s dtype (for bfloat16 its rounding, widened), what the torch path multiplies by."""
    y = torch.empty_like(x)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=x.dtype).item()
    args = (x.data_ptr(), y.data_ptr(), x.numel(), seed % 2**64, _threshold(p), scale)
    _run(lambda i, w0, w1: fn(*args, w0, w1), x.numel())
    return y


def _apply(x: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    lib = _library() if x.dtype in _KERNELS else None
    if lib is None:
        return x * keep_mask_reference(x.shape, p, seed, dtype=x.dtype, device=x.device)
    return _kernel_apply(getattr(lib, _KERNELS[x.dtype]), x.contiguous(), int(seed), p)


class _Dropout(torch.autograd.Function):
    """``x * mask(seed)``; the gradient is the incoming one times the same mask (recomputed, not stored)."""

    @staticmethod
    def forward(ctx, x, seed, p):
        ctx.save_for_backward(seed)
        ctx.p = p
        return _apply(x, seed, p)

    @staticmethod
    def backward(ctx, grad):
        (seed,) = ctx.saved_tensors
        return _Dropout.apply(grad, seed, ctx.p), None, None


#: the storage dtypes of the fused kernel (its arithmetic is float32): ``{dtype: its functions' suffix}``
_FUSED = {torch.float32: "f32", torch.bfloat16: "bf16"}


class _BiasGeluDropout(torch.autograd.Function):
    """``m * gelu(h + b)`` (``m``: the scaled mask of ``seed``) in one pass of the C kernel, which also writes
    ``d = m * gelu'(h + b)``, the one tensor saved; the backward pass is ``g * d`` and its column sums, one pass.
    ``h``: float32 or bfloat16 (``y``, ``d`` and the gradient in its dtype, each value rounded once), contiguous, on
    the CPU, last dimension ``b``'s; ``b``: float32."""

    @staticmethod
    def forward(ctx, h, b, seed, p):
        kind = _FUSED[h.dtype]
        fn, y, d = getattr(_library(), f"hoformer_bias_gelu_dropout_{kind}"), torch.empty_like(h), torch.empty_like(h)
        args = (h.data_ptr(), b.data_ptr(), y.data_ptr(), d.data_ptr(), h.numel(), h.shape[-1],
                int(seed) % 2**64, _threshold(p), 1.0 / (1.0 - p))
        _run(lambda i, w0, w1: fn(*args, w0, w1), h.numel())
        ctx.save_for_backward(d)
        ctx.kind, ctx.bias_dtype = kind, b.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (d,) = ctx.saved_tensors
        grad, cols, n = grad.to(d.dtype).contiguous(), d.shape[-1], d.numel()
        gh, ranges = torch.empty_like(d), _ranges(n)
        partial = torch.zeros(len(ranges), cols, dtype=torch.float64)  # each thread's column sums
        fn = getattr(_library(), f"hoformer_bias_gelu_dropout_backward_{ctx.kind}")
        # element ranges: twice the word ranges (whole words' worth of elements per thread)
        _run(lambda i, w0, w1: fn(grad.data_ptr(), d.data_ptr(), gh.data_ptr(), partial[i].data_ptr(), cols,
                                  min(2 * w0, n), min(2 * w1, n)), n)
        return gh, partial.sum(0).to(ctx.bias_dtype), None, None


def fuses_bias_gelu(x: torch.Tensor, training: bool = True) -> bool:
    """Whether :func:`bias_gelu_dropout` runs its C kernel on ``x`` (or on a linear map's output of ``x``): training,
    on the CPU, float32 outside autocast or under bfloat16 CPU autocast (the linear map's output is then bfloat16),
    outside traced code, the kernel built."""
    if not (training and x.device.type == "cpu" and not torch.compiler.is_compiling() and _library() is not None):
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16 and x.dtype in _FUSED
    return x.dtype == torch.float32


def bias_gelu_dropout(h: torch.Tensor, bias: torch.Tensor, p: float = 0.0, training: bool = True) -> torch.Tensor:
    """``dropout(gelu(h + bias), p, training)`` (the exact, erf GELU; :func:`dropout`'s masks): the hidden activation
    of an MLP whose first linear map left out its bias. On a float32 or bfloat16 CPU tensor in training, one pass of
    the C kernel forward (the bias add, the GELU, the mask, and the masked GELU derivative, the one tensor kept) and
    one backward (the product with the gradient and the bias gradient's column sums), in float32 arithmetic, each
    bfloat16 result rounded once (torch's three operations round three times). Its erf is Abramowitz & Stegun
    7.1.26, the approximation of ATen's vectorised float erf, so it agrees with :func:`torch.nn.functional.gelu`
    to float32 rounding (about ``1e-7`` of the value). Elsewhere (eval, other dtypes or devices, autocast to another
    dtype, traced code, no C compiler: :func:`fuses_bias_gelu`) the three operations of torch and :func:`dropout`.
    ``bias``: ``(h.shape[-1],)``; ``0 <= p <= 1``."""
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"bias_gelu_dropout: `p` must be a probability in [0, 1], got {p!r}")
    if bias.ndim != 1 or bias.shape[0] != h.shape[-1]:
        raise ValueError(f"bias_gelu_dropout: `bias` must have shape ({h.shape[-1]},) (h's last dimension), got "
                         f"{tuple(bias.shape)}")
    if not (fuses_bias_gelu(h, training) and p < 1.0 and bias.dtype == torch.float32):  # h: a dtype of _FUSED
        return dropout(F.gelu(h + bias), p, training)
    seed = _draw_seed(None) if p > 0.0 else torch.zeros((), dtype=torch.int64)  # p = 0 draws nothing
    return _BiasGeluDropout.apply(h.contiguous(), bias.contiguous(), seed, p)


def keep_mask(shape, p: float, *, dtype=torch.float32, device=None,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """The scaled dropout mask of ``shape`` that :func:`dropout` would apply next: each entry ``1 / (1 - p)``
    (kept) independently with probability ``1 - p`` (to within ``2^-32``), else 0, for a seed drawn from
    ``generator`` (default: the global one), in ``dtype``. ``0 <= p < 1``."""
    seed = _draw_seed(generator, device)
    if torch.device(seed.device).type != "cpu":
        return keep_mask_reference(shape, p, seed, dtype=dtype, device=device)
    return _apply(torch.ones(shape, dtype=dtype), seed, p)


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """:func:`torch.nn.functional.dropout` with the masks of the module doc on a CPU tensor: the same arguments and
    the same distribution of the result. ``p`` is checked by the caller (:class:`hoformer.layers.Dropout` checks it
    at construction)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or not x.is_floating_point() or inplace:
        return F.dropout(x, p, training, inplace)
    seed = _draw_seed(None)
    if torch.compiler.is_compiling():  # the same kernel as an opaque op (hoformer.functional._ops)
        return torch.ops.hoformer.dropout_bits(x, seed, p)
    return _Dropout.apply(x, seed, p)
