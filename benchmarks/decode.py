"""Incremental decoding along the causal mode: time per generated step against recomputing the full causal forward.

Run:  .venv/bin/python benchmarks/decode.py [--past 32 256 1024] [--other 21] [--dim 64] [--heads 4] [--depth 2]
                                             [--steps 16] [--reps 3] [--variants product sum ... divided]
                                             [--device cpu] [--threads 1] [--ledger [FILE]]

An ``Encoder`` of causal blocks of one attention type over ``(B, T, N, D)`` (``T`` the causal mode, e.g. time patches;
``N`` the other mode, e.g. variates), RoPE on ``T``: Kronecker product / sum / linear, full (flattened), axial (sum and
sequential) and divided attention. For each number of past steps ``p`` the cache is filled by stepping (untimed), then
``--steps`` further steps are timed one by one, and so is one full causal forward over ``p + 1`` steps (what generating
the next step costs without a cache, ``--reps`` times); the minimum of each is reported (the median step too), as
the least disturbed measurement on a shared machine. Every variant runs in one process, side by side: their steps
and forwards are timed round-robin (one variant's after the other's), after one untimed warm-up forward each; the
ratio is the speed-up of the cache. Eval mode, no gradients. A markdown table of every row is printed at the end.
``--ledger [FILE]``: append one line per row to the results ledger (default ``results/ledger.jsonl``), named
``bench/decode/pastP/ATTENTION``.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from hoformer.layers import Encoder

import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path
import timing

VARIANTS = {"product": "kronecker_product", "sum": "kronecker_sum", "linear": "kronecker_linear", "full": "full",
            "axial": "axial", "axial_sequential": "axial_sequential", "divided": "divided"}


def run(args) -> list[dict]:
    encoders, caches = {}, {}
    for variant in args.variants:
        torch.manual_seed(0)
        encoders[variant] = Encoder(args.dim, depth=args.depth, num_heads=args.heads, attention=VARIANTS[variant],
                                    num_modes=2, causal_mode=0, rope_modes=(0,)).to(args.device).eval()
        caches[variant] = encoders[variant].init_cache()
    total = max(args.past) + args.steps + 1
    x = torch.randn(args.batch, total, args.other, args.dim, device=args.device)
    rows, done = [], 0
    with torch.no_grad():
        for enc in encoders.values():  # warm-up (first-call allocations), untimed
            enc(x[:, :8])
        for p in sorted(args.past):
            while done < p:  # fill every cache up to p past steps (untimed)
                for variant, enc in encoders.items():
                    enc.step(x[:, done : done + 1], caches[variant])
                done += 1
            per_step = {v: [] for v in encoders}
            for _ in range(args.steps):  # round-robin: each variant's i-th step right after the others'
                for variant, enc in encoders.items():
                    per_step[variant].append(
                        timing.time_call(lambda: enc.step(x[:, done : done + 1], caches[variant]), args.device))
                done += 1
            full = {v: [] for v in encoders}
            for _ in range(args.reps):
                for variant, enc in encoders.items():
                    full[variant].append(timing.time_call(lambda: enc(x[:, : p + 1]), args.device))
            for variant in encoders:
                step, med, fwd = min(per_step[variant]), statistics.median(per_step[variant]), min(full[variant])
                rows.append({"variant": variant, "past": p, "step_ms": 1e3 * step, "step_median_ms": 1e3 * med,
                             "full_ms": 1e3 * fwd, "speedup": fwd / step})
                print(f"{variant:16s} past={p:5d}  step {1e3 * step:8.2f} ms (median {1e3 * med:8.2f})   full forward "
                      f"{1e3 * fwd:9.2f} ms   speed-up {fwd / step:7.1f}x", flush=True)
    return rows


def ledger_entries(args: argparse.Namespace, rows: list[dict]) -> list[dict]:
    """One ledger entry per row of :func:`run` (the speed-up is the tables' to compute)."""
    suffix = ledger.device_suffix(args.device)
    split = (f"decode step, B={args.batch}, width {args.dim}, {args.heads} heads, {args.depth} blocks, "
             f"{args.other} variates")
    return [dict(experiment=f"bench/decode/past{r['past']}/{VARIANTS[r['variant']]}{suffix}",
                 model=VARIANTS[r["variant"]], split=split, past=r["past"],
                 metrics={k: round(r[k], 3) for k in ("step_ms", "step_median_ms", "full_ms")},
                 note=f"cached step: minimum (and median) of {args.steps} round-robin steps; full causal forward over "
                      f"past + 1 steps: minimum of {args.reps}") for r in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--past", type=int, nargs="+", default=[32, 256, 1024])
    ap.add_argument("--other", type=int, default=21, help="size of the non-causal mode")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16, help="timed steps per point")
    ap.add_argument("--reps", type=int, default=3, help="full forwards per point")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ledger.add_ledger_argument(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"Encoder depth {args.depth}, dim {args.dim}, {args.heads} heads, other mode {args.other}, batch "
          f"{args.batch}, device {args.device}, {torch.get_num_threads()} threads")
    rows = run(args)
    print("\n| attention | past steps | ms / step (median) | full causal forward ms | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {VARIANTS[r['variant']]} | {r['past']} | {r['step_ms']:.2f} ({r['step_median_ms']:.2f}) | "
              f"{r['full_ms']:.1f} | {r['speedup']:.0f}x |")
    if args.ledger:
        ledger.append_benchmarks(ledger_entries(args, rows), args.ledger, "decode.py",
                                    sys.argv[1:] if argv is None else argv, device=args.device,
                                    threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
