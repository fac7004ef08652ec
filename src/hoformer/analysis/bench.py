"""``hoformer bench``: FLOPs, time and peak memory of every attention type and HOT model over a sweep of input sizes
(HOT paper 000 section 5.5: Fig 6, GFLOPs of 3D inputs up to 224^3; Fig 7, training / inference time and memory per
sample).

For each attention type and cube side ``n`` the input is ``(batch, n, .., n, dim)`` with ``--modes`` modes; the table
(CSV) holds per sample: analytic matmul FLOPs (:func:`~hoformer.analysis.attention_flops`), the FLOPs counted by
``FlopCounterMode`` on the same layer (small sizes), forward (inference, ``no_grad``) and forward+backward time, and
peak memory. On CUDA the times are CUDA-synchronised and memory is the caching allocator's peak above the baseline;
on CPU memory is reconstructed from ``torch.profiler`` memory events (running sum of ``self_cpu_memory_usage`` in
start-time order). A log-log PNG per metric shows the fitted growth exponent of each attention type in the number
of tokens (fitted on the larger half of the sweep, where fixed per-call overheads no longer dominate). The analytic
sweep of ``hot_volume_classifier`` continues to ``--analytic-max`` (224^3 as in Fig 6) without running anything.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from hoformer._io import atomic_write

from .flops import attention_flops, count_flops, hot_model_flops
from .plots import fit_exponent, plot_scaling, require_matplotlib

__all__ = ["run_bench", "bench_main", "cpu_peak_memory", "peak_memory", "measure", "DEFAULT_ATTENTIONS"]

DEFAULT_ATTENTIONS = ("kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial", "divided")


# ------------------------------------------------------------------------------------------------- measurements
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_stderr():
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured / replaced stderr
        yield
        return
    sys.stderr.flush()
    saved, null = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(null)


def cpu_peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes allocated by ``fn()`` on the CPU: profile with ``profile_memory=True`` and take the maximum of the
    running sum of the allocations and frees of the profiler's memory timeline (every tensor's creation and
    destruction in time order, including scratch buffers that an operator or an autograd ``Function`` allocates and
    frees inside one call, which a sum of the per-operator ``self_cpu_memory_usage`` misses)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)
    with _quiet_stderr():  # the profiler's C++ start/stop banners
        prof.__enter__()
    try:
        fn()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    peak = run = 0
    for _, action, _, nbytes in prof._memory_profile().timeline:
        if action == Action.CREATE:
            run += nbytes
        elif action == Action.DESTROY:
            run -= nbytes
        peak = max(peak, run)
    return peak


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by ``fn()`` above what was live before: the CUDA allocator on GPU, else
    :func:`cpu_peak_memory`."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    return cpu_peak_memory(fn)


def _time(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(module: torch.nn.Module, args: tuple, kwargs: dict | None = None, *, repeats: int = 3, warmup: int = 1,
            memory: bool = True) -> dict[str, float]:
    """Forward (``no_grad``) and forward+backward seconds (median of ``repeats``) and peak bytes of one call of
    ``module(*args, **kwargs)`` on the device of its inputs."""
    kwargs = kwargs or {}
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))

    def fwd():
        with torch.no_grad():
            return module(*args, **kwargs)

    def fwd_bwd():
        out = module(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        out.float().mean().backward()
        module.zero_grad(set_to_none=True)

    res = {"fwd_s": _time(fwd, device, repeats, warmup), "fwdbwd_s": _time(fwd_bwd, device, repeats, warmup)}
    if memory:
        res["mem_fwd_b"] = float(peak_memory(fwd, device))
        res["mem_fwdbwd_b"] = float(peak_memory(fwd_bwd, device))
    return res


# ---------------------------------------------------------------------------------------------------- sweeps
def _layer_case(attention: str, sizes: tuple, dim: int, heads: int, batch: int, device, dtype):
    from hoformer.layers import build_attention

    m = build_attention(attention, dim, heads, num_modes=len(sizes)).to(device=device, dtype=dtype)
    x = torch.randn(batch, *sizes, dim, device=device, dtype=dtype)
    return m, (x,)


def _model_case(model: str, attention: str, side: int, dim: int, heads: int, depth: int, patch: int, batch: int,
                device, dtype):
    from hoformer.models import create_model

    if model != "hot_volume_classifier":
        raise ValueError(f"bench: --models supports 'hot_volume_classifier' (3D sweep of HOT Fig 6/7), got {model!r}")
    m = create_model(model, attention=attention, input_size=side * patch, patch_size=patch, dim=dim, depth=depth,
                     num_heads=heads, dropout=0.0).to(device=device, dtype=dtype)
    args, kwargs = m.example_inputs(batch_size=batch)
    return m, tuple(a.to(device=device, dtype=dtype) for a in args)


def run_bench(*, attentions: Sequence[str] = DEFAULT_ATTENTIONS, sides: Sequence[int] = (4, 6, 8, 12, 16),
              modes: int = 3, dim: int = 64, heads: int = 4, batch: int = 2, repeats: int = 3, warmup: int = 1,
              models: Sequence[str] = (), model_sides: Sequence[int] = (2, 4, 6), model_depth: int = 2,
              patch: int = 4, max_full_tokens: int = 4096, max_seconds: float = 5.0, flop_check_tokens: int = 4096,
              device: str = "auto", dtype: str = "float32", memory: bool = True, log=print) -> list[dict]:
    """Run the measured sweep (the ``hoformer bench`` logic); returns one row (dict) per (target, attention, size)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    dt = getattr(torch, dtype)
    rows: list[dict] = []
    cases = [("layer", a, s) for a in attentions for s in sides] + [(m, a, s) for m in models for a in attentions
                                                                     for s in model_sides]
    slow: set = set()
    for target, att, side in cases:
        sizes = (side,) * modes if target == "layer" else tuple(side for _ in range(3))
        tokens = math.prod(sizes)
        key = (target, att)
        if key in slow or (att in ("full", "divided") and tokens > max_full_tokens):
            continue
        torch.manual_seed(0)
        if target == "layer":
            mod, args = _layer_case(att, sizes, dim, heads, batch, dev, dt)
            flops = attention_flops(att, sizes, dim, heads)["total"]
        else:
            mod, args = _model_case(target, att, side, dim, heads, model_depth, patch, batch, dev, dt)
            flops = hot_model_flops(att, side * patch, patch_size=patch, dim=dim, depth=model_depth, num_heads=heads)
        counted = float("nan")
        if target == "layer" and tokens <= flop_check_tokens:
            counted = count_flops(mod, args[0][:1])
        r = measure(mod, args, repeats=repeats, warmup=warmup, memory=memory)
        row = {"target": target, "attention": att, "modes": len(sizes), "side": side,
               "sizes": "x".join(map(str, sizes)), "tokens": tokens, "batch": batch, "dim": dim, "heads": heads,
               "device": dev.type, "dtype": dtype, "gflops": flops / 1e9, "gflops_counted": counted / 1e9,
               "time_fwd_ms": 1e3 * r["fwd_s"] / batch, "time_fwdbwd_ms": 1e3 * r["fwdbwd_s"] / batch,
               "mem_fwd_mb": r.get("mem_fwd_b", float("nan")) / batch / 2**20,
               "mem_fwdbwd_mb": r.get("mem_fwdbwd_b", float("nan")) / batch / 2**20}
        rows.append(row)
        log(f"  {target:22s} {att:18s} {row['sizes']:>10s} tokens={tokens:6d}  fwd {row['time_fwd_ms']:8.3f} ms  "
            f"fwd+bwd {row['time_fwdbwd_ms']:8.3f} ms  mem {row['mem_fwdbwd_mb']:8.2f} MB  {row['gflops']:.4f} GFLOP")
        if r["fwdbwd_s"] > max_seconds:
            slow.add(key)
        del mod, args
    return rows


def analytic_3d_sweep(attentions: Sequence[str], sides: Sequence[int], *, patch: int, dim: int, depth: int,
                      heads: int) -> list[dict]:
    """GFLOPs per sample of ``hot_volume_classifier`` on ``side^3`` volumes (HOT Fig 6), analytic only."""
    rows = []
    for att in attentions:
        for s in sides:
            grid = s // patch
            rows.append({"attention": att, "input_side": s, "grid": grid, "tokens": grid**3,
                         "gflops": hot_model_flops(att, s, patch_size=patch, dim=dim, depth=depth,
                                                   num_heads=heads) / 1e9})
    return rows


def _tail_exponent(d, x: str, y: str) -> float:
    return fit_exponent(d[x].values, d[y].values, tail=0.5)


def summarize(df) -> "object":
    """Growth exponents in the number of tokens per (target, attention): analytic FLOPs, time, memory."""
    import pandas as pd

    out = []
    for (target, att), d in df.groupby(["target", "attention"], sort=False):
        out.append({"target": target, "attention": att, "points": len(d), "max_tokens": int(d["tokens"].max()),
                    "exp_flops": _tail_exponent(d, "tokens", "gflops"),
                    "exp_fwd": _tail_exponent(d, "tokens", "time_fwd_ms"),
                    "exp_fwdbwd": _tail_exponent(d, "tokens", "time_fwdbwd_ms"),
                    "exp_mem": _tail_exponent(d, "tokens", "mem_fwdbwd_mb"),
                    "flop_check_max_rel_err": float(((d["gflops_counted"] - d["gflops"]).abs()
                                                     / d["gflops"]).max())})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------------ CLI
def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v.strip()]


def _strs(s: str) -> list[str]:
    return [v.strip() for v in s.split(",") if v.strip()]


def _to_csv(df, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``hoformer bench``: attention / model scaling benchmark; writes ``bench.csv``, ``bench_summary.csv``,
    ``bench_flops_3d.csv`` and PNGs to ``--output`` and prints a summary table."""
    p = argparse.ArgumentParser(prog="hoformer bench", description=bench_main.__doc__)
    p.add_argument("--output", default="runs/bench", help="output folder (default runs/bench)")
    p.add_argument("--attention", type=_strs, default=list(DEFAULT_ATTENTIONS),
                   help="comma-separated attention types (hoformer.layers.ATTENTION_TYPES)")
    p.add_argument("--modes", type=int, default=3, help="number of modes of the layer inputs (default 3)")
    p.add_argument("--sides", type=_ints, default=[4, 6, 8, 10, 12, 16, 20, 24],
                   help="mode sizes of the layer sweep (cube side), comma-separated")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", type=_strs, default=[], help="also sweep these models (hot_volume_classifier)")
    p.add_argument("--model-sides", type=_ints, default=[2, 4, 6, 8], help="token-grid sides of the model sweep")
    p.add_argument("--model-depth", type=int, default=2)
    p.add_argument("--patch", type=int, default=4, help="patch size of the model sweeps (measured and analytic)")
    p.add_argument("--analytic-max", type=int, default=224, help="largest volume side of the analytic 3D sweep")
    p.add_argument("--analytic-depth", type=int, default=6)
    p.add_argument("--analytic-dim", type=int, default=128)
    p.add_argument("--max-full-tokens", type=int, default=4096, help="skip full/divided attention above this")
    p.add_argument("--max-seconds", type=float, default=5.0, help="stop growing an attention type once one "
                   "forward+backward takes longer than this")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:1 ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument("--quick", action="store_true", help="small sweep (< 60 s on a CPU): product, sum and full "
                   "attention on 3-mode cubes of side 4..12, one model size")
    a = p.parse_args(argv)
    for opt in ("repeats", "dim", "heads", "batch", "modes", "patch", "analytic_depth", "analytic_dim"):
        if getattr(a, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(a, opt)}")
    require_matplotlib(p)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.quick:
        a.attention, a.sides, a.repeats = ["kronecker_product", "kronecker_sum", "full"], [4, 6, 8, 10, 12], 2
        a.models, a.model_sides, a.model_depth, a.dim = a.models[:1], [2, 3], 1, 32
    from hoformer.layers import ATTENTION_TYPES

    bad = [x for x in a.attention if x not in ATTENTION_TYPES]
    if bad:
        p.error(f"--attention: unknown {bad}; expected names from {sorted(ATTENTION_TYPES)}")
    import pandas as pd

    sides3 = sorted({s for s in (28, 56, 84, 112, 140, 168, 196, 224) if s <= a.analytic_max and s % a.patch == 0})
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print(f"hoformer bench: {len(a.attention)} attention types, sides {a.sides} ({a.modes} modes), dim {a.dim}, "
          f"heads {a.heads}, batch {a.batch}, threads {torch.get_num_threads()}")
    rows = run_bench(attentions=a.attention, sides=a.sides, modes=a.modes, dim=a.dim, heads=a.heads, batch=a.batch,
                 repeats=a.repeats, models=a.models, model_sides=a.model_sides, model_depth=a.model_depth,
                 patch=a.patch, max_full_tokens=a.max_full_tokens, max_seconds=a.max_seconds, device=a.device,
                 dtype=a.dtype, memory=not a.no_memory)
    if not rows:
        print(f"hoformer bench: error: every case was skipped (--max-full-tokens {a.max_full_tokens}, "
              f"--max-seconds {a.max_seconds}, sides {a.sides}); nothing measured", file=sys.stderr)
        return 2
    df = pd.DataFrame(rows)
    _to_csv(df, out / "bench.csv")
    summary = summarize(df)
    _to_csv(summary, out / "bench_summary.csv")
    files = [out / "bench.csv", out / "bench_summary.csv"]
    for target, d in df.groupby("target", sort=False):
        tag = "" if target == "layer" else f"_{target}"
        for y, label in (("time_fwd_ms", "forward time per sample (ms)"),
                         ("time_fwdbwd_ms", "forward+backward time per sample (ms)"),
                         ("mem_fwdbwd_mb", "peak memory per sample, forward+backward (MB)"),
                         ("gflops", "analytic GFLOPs per sample (forward)")):
            if d[y].notna().any() and (d[y] > 0).any():
                files.append(plot_scaling(d, out / f"bench{tag}_{y}.png", y=y, ylabel=label, tail=0.5,
                                          title=f"{target} ({d['device'].iloc[0]}): slopes fitted on the larger half"))
    atts3 = [x for x in ("kronecker_product", "kronecker_sum", "full", "divided", "axial") if x in ATTENTION_TYPES]
    ana = None
    if sides3:
        ana = pd.DataFrame(analytic_3d_sweep(atts3, sides3, patch=a.patch, dim=a.analytic_dim,
                                             depth=a.analytic_depth, heads=8))
        _to_csv(ana, out / "bench_flops_3d.csv")
        files += [out / "bench_flops_3d.csv",
                  plot_scaling(ana, out / "bench_flops_3d.png", x="input_side", y="gflops",
                               ylabel="GFLOPs per sample (analytic)",
                               title=f"hot_volume_classifier, patch {a.patch}, depth {a.analytic_depth}, dim "
                                     f"{a.analytic_dim}: 3D input side")]
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.float_format", "{:.3g}".format):
        print("\nper-sample results:")
        print(df[["target", "attention", "sizes", "tokens", "gflops", "gflops_counted", "time_fwd_ms",
                  "time_fwdbwd_ms", "mem_fwdbwd_mb"]].to_string(index=False))
        print("\ngrowth exponents in the number of tokens (fitted on the larger half of each sweep):")
        print(summary.to_string(index=False))
        if ana is not None:
            big = ana[ana.input_side == ana.input_side.max()]
            print(f"\nanalytic GFLOPs per sample at {int(big.input_side.iloc[0])}^3 (patch {a.patch}):")
            print(big[["attention", "tokens", "gflops"]].to_string(index=False))
        else:
            print(f"\nanalytic 3D sweep skipped: no volume side in 28..{a.analytic_max} (steps of 28) is a multiple "
                  f"of --patch {a.patch}")
    print(f"\nwrote {len(files)} files to {out} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(bench_main())
