"""What every benchmark script measures with: call timing on ``torch.utils.benchmark.Timer`` (accelerator
synchronisation before each clock read; PyTorch's thread count kept, not the Timer's default of one), the
round-robin minimum that makes ratios meaningful on a shared machine, and the resident-memory readings of
``/proc/self`` on the CPU.

    import timing
    best = timing.interleaved_times({"a": f, "b": g}, device, reps=5)   # {"a": seconds, "b": seconds}
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils import benchmark

__all__ = ["time_call", "interleaved_times", "proc_status_bytes", "reset_peak_rss"]


def time_call(fn: Callable[[], object], device=None, clock: Callable[[], float] | None = None) -> float:
    """Seconds of one call of ``fn`` (``torch.utils.benchmark.Timer``: the device synchronised around it; ``clock``:
    another clock, e.g. ``time.process_time`` for CPU time)."""
    kwargs = {"timer": clock} if clock is not None else {}
    t = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(), **kwargs)
    return t.timeit(1).raw_times[0]


def interleaved_times(fns: dict, device=None, reps: int = 5, warmup: int = 1,
                      clock: Callable[[], float] | None = None) -> dict:
    """Minimum seconds of every callable over ``reps`` rounds, one call of each per round (round-robin), after
    ``warmup`` untimed calls of each: a load change on a shared machine hits all variants alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            best[name] = min(best[name], time_call(fn, device, clock))
    return best


def proc_status_bytes(key: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (``"VmRSS:"``, ``"VmHWM:"``); 0 where the field is absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> int:
    """Reset the process's peak resident set (``VmHWM``) to its current one (``/proc/self/clear_refs``); returns the
    current resident bytes, the baseline of a peak read afterwards."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status_bytes("VmRSS:")
