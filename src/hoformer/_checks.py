"""Value checks that do not stall an accelerator.

Checking tensor *values* (labels in range, token ids below the vocabulary size, time features in their periods)
needs the answer on the host: on a GPU that is a device-to-host copy that waits for every queued kernel, once per
training step. :func:`check_values` raises the full, descriptive error for CPU tensors and, on any other device,
queues an asynchronous device-side assertion with the same message instead (``torch._assert_async``; also on CPU
while ``torch.compile`` traces, where a host read would break the graph): bad input
still stops the run (at the next synchronisation, as an out-of-range embedding index would), but good input never
waits.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import torch


DETAIL = "{detail}"


def is_int(v: Any) -> bool:
    """An integer that is not a bool (Python or NumPy ints): ``True`` is an ``int`` in Python but never a size."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(fn: str, name: str, value: Any, *, low: int = 1, optional: bool = False, note: str = "") -> None:
    """The one argument check for sizes, lengths and counts: raise
    ``ValueError("{fn}: `{name}` must be an int >= {low}[ or None][note], got {value!r}")`` unless ``value`` is an
    int (:func:`is_int`: bools and floats are refused, NumPy ints accepted) ``>= low``, or None when ``optional``."""
    if optional and value is None:
        return
    if not is_int(value) or value < low:
        raise ValueError(f"{fn}: `{name}` must be an int >= {low}{' or None' if optional else ''}{note}, "
                         f"got {value!r}")


def check_fraction(fn: str, name: str, value: Any, *, optional: bool = False) -> None:
    """The one check for rates and overlaps: raise ``ValueError("{fn}: `{name}` must be a float in [0, 1), got
    {value!r}")`` unless ``value`` is a real number (bools refused) in ``[0, 1)``, or None when ``optional``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{fn}: `{name}` must be a float in [0, 1), got {value!r}")


def check_values(ok: torch.Tensor, message: str, detail: Callable[[], str] | None = None,
                 exc: type[Exception] = ValueError) -> None:
    """Require the 0-dim bool tensor ``ok``. On CPU, when it is False: ``raise exc(message)`` with the literal
    ``{detail}`` in ``message`` replaced by ``detail()`` (which may inspect the offending values: it runs only on
    failure). Elsewhere: an asynchronous device-side assert with ``message`` (``{detail}`` removed), no host sync."""
    if ok.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(ok):
            raise exc(message.replace(DETAIL, detail() if detail is not None else ""))
    else:  # accelerators, and any device under torch.compile (a host read would break the graph)
        torch._assert_async(ok, message.replace(DETAIL, ""))


def check_scale(fn: str, scale: Any) -> None:
    """The one check of an attention logit ``scale``: None (the default ``D ** -0.5``) or a finite real number.
    ``TypeError`` for another type (bools, strings, tensors), ``ValueError`` for NaN / inf."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{fn}: `scale` must be a finite float or None (default D ** -0.5), got "
                        f"{type(scale).__name__} {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: `scale` must be a finite float or None (default D ** -0.5), got {scale!r}")


def check_finite_output(y: torch.Tensor, x: torch.Tensor, fn: str, arg: str = "x") -> None:
    """Raise ``FloatingPointError`` naming the input ``arg`` when the output ``y`` of a module is not finite although
    its input ``x`` is: finite values too large for the dtype's arithmetic (e.g. ``x * 1e30`` in float32, whose
    squares overflow in a norm or a softmax) otherwise give an all-NaN output without a word.

    Raised only when the input is large enough to be the cause (its magnitude's fourth power exceeds the dtype's
    range: ~4e9 in float32). Made on the CPU only, where reading the answer costs no device synchronisation (one pass over ``y``, its minimum
    and maximum, and over ``x`` only when ``y`` is not finite); skipped on accelerators, where it would stall every call (or, as an
    asynchronous assert, end the process), and while ``torch.compile`` traces. Training runs are covered on any device
    by the trainer's non-finite guard, which names the first module whose output went non-finite."""
    if y.device.type != "cpu" or torch.compiler.is_compiling():
        return
    if y.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(y.detach()))).all()):
        return  # min and max propagate NaN / inf: one pass over y, no y-sized temporary
    if not bool(torch.isfinite(x).all()):
        return
    big = x.detach().abs().amax().item()
    if big < torch.finfo(x.dtype).max ** 0.25:  # too small for a product of its values to overflow: the input is not
        return  # the cause (non-finite weights are; the trainer's guard names the module during training)
    raise FloatingPointError(
        f"{fn}: the output is not finite (NaN / inf) although the input `{arg}` is finite: its largest magnitude "
        f"{big:.3g} overflows {x.dtype} arithmetic inside (squares and exponentials of values this large exceed "
        f"{torch.finfo(x.dtype).max:.3g}); scale or standardise `{arg}` (e.g. to unit variance), or compute in "
        f"float64")


def _named_tensors(name: str, value) -> list[tuple[str, torch.Tensor]]:
    """The floating-point tensors of an argument (a tensor or a sequence of them), named ``name`` / ``name[i]``."""
    if isinstance(value, torch.Tensor):
        return [(name, value)] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return []


def check_finite_result(y: torch.Tensor, fn: str, **inputs: Any) -> None:
    """The output check of the public functional API (:mod:`hoformer.functional`), as the layers'
    :func:`check_finite_output`: raise ``FloatingPointError`` when ``y`` is not finite although every floating-point
    input is (tensors, or sequences of tensors such as the per-mode ``q`` of :func:`kronecker_attention`), naming the
    input with the largest magnitude; finite inputs too large for the dtype (``q * 1e30``: the logits overflow)
    otherwise give an all-NaN result without a word. Non-finite inputs are the caller's: not checked here. CPU only
    and not while ``torch.compile`` traces (one pass over ``y``: its minimum and maximum), as
    :func:`check_finite_output`."""
    if not isinstance(y, torch.Tensor) or y.device.type != "cpu" or torch.compiler.is_compiling():
        return
    if y.numel() == 0 or not y.is_floating_point() or bool(torch.isfinite(torch.stack(torch.aminmax(y.detach()))).all()):
        return
    named = [t for k, v in inputs.items() for t in _named_tensors(k, v)]
    if not named or not all(bool(torch.isfinite(t).all()) for _, t in named):
        return
    name, big = max(((n, t.detach().abs().amax().item()) for n, t in named if t.numel()), key=lambda p: p[1],
                    default=("?", 0.0))
    dtype = y.dtype
    why = (f"their largest magnitude, {big:.3g} in `{name}`, overflows {dtype} arithmetic inside (products and "
           f"exponentials of values this large exceed {torch.finfo(dtype).max:.3g}); scale or normalise the inputs "
           "(e.g. LayerNorm on q and k, or a smaller `scale`), or compute in float64"
           if big >= torch.finfo(dtype).max ** 0.25 else
           f"their largest magnitude is {big:.3g} (in `{name}`), too small to overflow: please report this with the "
           "inputs' shapes and dtypes")
    raise FloatingPointError(f"{fn}: the output is not finite (NaN / inf) although the inputs "
                             f"({', '.join(n for n, _ in named[:6])}{', ...' if len(named) > 6 else ''}) are finite: "
                             f"{why}")
