"""The C allocator of a CPU training process: large temporaries served from the heap, not from fresh ``mmap`` pages.

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB on 64-bit Linux, however the dynamic
threshold adapts) with a new ``mmap`` and gives it back with ``munmap`` when it is freed, and PyTorch's CPU allocator
keeps no cache: a training step that creates and frees the same large activations every step (a paper-size Weather
HOT forecaster's MLP hidden tensor is 32 x 21 x 24 x 512 floats, 33 MB) then pays the kernel's page faults and
zero-filling on every one of them. :func:`keep_large_allocations` turns ``mmap`` off for ``malloc`` and raises the
trim threshold (``mallopt(M_MMAP_MAX, 0)``, ``mallopt(M_TRIM_THRESHOLD, 1 TiB)``: what the environment variables
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`` do at start-up), so freed blocks are reused; measured on a
paper-size Weather step: 10 % less time per step (``benchmarks/train_step.py``, docs/benchmarks.md). The memory a
process has used stays reserved by it until it exits.

``hoformer fit`` / ``validate`` / ``test`` / ``predict`` / ``tune`` call it on a CPU machine with glibc; set
``HOFORMER_SYSTEM_MALLOC=1`` to leave the allocator as it is. Elsewhere (macOS, Windows, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["keep_large_allocations"]

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h
_DONE: list[bool] = []


def keep_large_allocations() -> bool:
    """Serve large blocks from the heap and keep freed ones (module doc). Returns whether the allocator was set
    (``False``: not glibc, or ``HOFORMER_SYSTEM_MALLOC=1``). Safe to call more than once."""
    if _DONE:
        return _DONE[0]
    ok = False
    if sys.platform.startswith("linux") and os.environ.get("HOFORMER_SYSTEM_MALLOC", "") in ("", "0"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    _DONE.append(ok)
    return ok
