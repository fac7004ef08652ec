"""Triplet (HOBA) attention benchmark: fast chunked kernel vs the paper's naive per-block algorithm, and HOBA vs
full 2D attention as the sequence grows.

    python benchmarks/triplet.py                   # both parts, CPU: 1 thread
    python benchmarks/triplet.py --part target     # L=512, block 32, overlap 0.25, D=64, H=4, B=8
    python benchmarks/triplet.py --part scaling --batch 2 --lengths 128 256 512 1024 2048 4096
    python benchmarks/triplet.py --part target --ledger   # also append the results to results/ledger.jsonl

Time: forward + backward of ``out.sum()``, best of ``--repeats`` runs after one warm-up, the candidates interleaved
in the same process so that machine load hits them alike. On CPU the clock is the process CPU time by default
(``--clock cpu``; with one thread it equals the busy time of that thread and is not inflated by other jobs on a shared
machine; ``--clock wall`` for wall time); CUDA uses synchronised wall time. Ratios are computed from numbers
measured in this run.

Peak memory, every measurement in a fresh subprocess, after one untimed warm-up fwd+bwd of the same call (first-call
library state, e.g. cuBLAS workspaces or the CPU's ~80 MiB of mapped kernels, is not the candidate's memory):
  * CUDA: ``torch.cuda.max_memory_allocated`` minus the memory held before the call.
  * CPU: peak resident set size of the child: the kernel's high-water mark ``VmHWM`` is reset through
    ``/proc/self/clear_refs`` (value 5) after the inputs exist, then ``VmHWM - VmRSS_before`` is read after the
    backward. The child runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc serves every large tensor with
    ``mmap`` and returns it on free, i.e. the resident set follows the live tensors. Includes the input gradients.
  * Both: ``saved`` = bytes autograd keeps between forward and backward (``saved_tensors_hooks``, storages
    deduplicated), a device-independent view of the same quantity.

``--ledger [FILE]``: append the results to the results ledger (default ``results/ledger.jsonl``), named
``bench/triplet/target`` and ``bench/triplet/scaling/LLENGTH``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from hoformer.functional.triplet import (
    _DEFAULT_CHUNK, _tile_rows, triplet_attention, triplet_attention_naive, triplet_windows,
)

import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path
import timing


# --------------------------------------------------------------------------------------------- candidates
def _inputs(n: int, B, H, L, D, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g).to(device, dtype).requires_grad_() for _ in range(n)]


def _cross_block(o: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cross-block routing of eqs 5-7 on ``o (B, H, L, D)`` (block means, softmax over blocks)."""
    B, H, L, D = o.shape
    nb = -(-L // block_size)
    pad = nb * block_size - L
    r = F.pad(o, (0, 0, 0, pad)).view(B, H, nb, block_size, D).mean(3)
    r = F.scaled_dot_product_attention(r, r, r)
    return o + r.repeat_interleave(block_size, 2)[:, :, :L]


CANDIDATES = {
    "naive": (5, lambda x, a: triplet_attention_naive(*x, block_size=a.block, overlap=a.overlap)),
    "fast": (5, lambda x, a: triplet_attention(*x, block_size=a.block, overlap=a.overlap)),
    "hoba": (5, lambda x, a: _cross_block(triplet_attention(*x, block_size=a.block, overlap=a.overlap), a.block)),
    "full2d": (3, lambda x, a: F.scaled_dot_product_attention(*x)),
}


def _step(name, x, args):
    out = CANDIDATES[name][1](x, args)
    out.sum().backward()
    for t in x:
        t.grad = None


def time_candidates(names, B, H, L, D, args) -> dict[str, float]:
    """Best wall-clock seconds per candidate; on CPU the process CPU time (``time.process_time``, robust to other
    processes sharing the cores) is used instead of wall time when ``--clock cpu`` (default on CPU)."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    clock = time.process_time if (device.type == "cpu" and args.clock == "cpu") else None
    xs = {n: _inputs(CANDIDATES[n][0], B, H, L, D, device, dtype) for n in names}
    steps = {n: (lambda n=n: _step(n, xs[n], args)) for n in names}
    return timing.interleaved_times(steps, device, args.repeats, warmup=1, clock=clock)


def memory_child(name, B, H, L, D, args) -> dict[str, float]:
    """Runs inside the fresh subprocess: peak memory and saved-for-backward bytes of one fwd+bwd."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    x = _inputs(CANDIDATES[name][0], B, H, L, D, device, dtype)
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = max(saved.get(st.data_ptr(), 0), st.nbytes())
        return t

    # one untimed fwd+bwd first: one-time costs of the first call would otherwise count as the kernel's peak.
    # CUDA: cuBLAS allocates its workspaces (32 MiB per handle on sm90, one per autograd thread) from the caching
    # allocator; CPU: the first matmuls / autograd calls map ~80 MiB of library code and buffers into the resident set
    # (measured: fast kernel 128 MiB cold vs 48 MiB warm at the target configuration)
    CANDIDATES[name][1](x, args).sum().backward()
    for t in x:
        t.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = timing.reset_peak_rss()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = CANDIDATES[name][1](x, args)
    out.sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = timing.proc_status_bytes("VmHWM:") - base
    input_bytes = sum(t.numel() * t.element_size() for t in x)
    return {"peak_mib": peak / 2**20, "saved_mib": sum(saved.values()) / 2**20, "inputs_mib": input_bytes / 2**20}


def measure_memory(name, B, H, L, D, args) -> dict[str, float]:
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", name, "--batch", str(B), "--heads", str(H),
           "--dim", str(D), "--lengths", str(L), "--block", str(args.block), "--overlap", str(args.overlap),
           "--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return {"peak_mib": float("nan"), "saved_mib": float("nan"), "error": res.stderr.strip().splitlines()[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------- flops
def flops(name: str, L: int, D: int, block: int, overlap: float, device: str = "cpu") -> float:
    """FLOPs executed by the contractions of one (batch, head), forward + backward (recomputation included)."""
    if name == "full2d":  # flash attention: QK^T, AV forward; backward recomputes QK^T, then dV, dP, dQ, dK
        return 2 * (L * L * D) * 7
    s = min(block, L)
    w = len(triplet_windows(L, block, overlap))
    # s^3 d contractions: naive 2 fwd + 4 bwd; fast 2 fwd + 5 bwd (recompute) when a tile holds whole windows, else
    # 6 bwd (dv1 and dv2 separately, no (s, s, d) tensor)
    whole = _tile_rows(1, s, D, _DEFAULT_CHUNK.get(device, 1 << 24))[1] == s
    units = 6 if name == "naive" else 7 if whole else 8
    return 2 * units * w * s**3 * D


# ------------------------------------------------------------------------------------------------- ledger
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def _entry(args, name: str, model: str, B: int, L: int, metrics: dict, what: str, **fields) -> dict:
    clock = "process CPU time" if args.device == "cpu" and args.clock == "cpu" else "wall-clock time"
    suffix = ledger.device_suffix(args.device, _DTYPES.get(args.dtype, args.dtype))
    return dict(experiment=f"bench/triplet/{name}{suffix}", model=model,
                split=f"fwd+bwd, L={L}, block {args.block}, overlap {args.overlap}, D={args.dim}, H={args.heads}, B={B}",
                metrics={k: float(f"{v:.6g}") for k, v in metrics.items() if v == v},  # NaN: not measured
                note=f"best of {args.repeats} interleaved runs, {clock}; peak memory of each candidate in a fresh "
                     f"subprocess; {what}", **fields)


def target_entry(args, B: int, L: int, row: dict, gflop: dict) -> dict:
    """The ledger entry of the target comparison (``row``: candidate -> ``time_s`` and, unless ``--no-memory``,
    ``peak_mib`` / ``saved_mib``; ``gflop``: candidate -> GFLOP executed)."""
    m = {}
    for n in ("fast", "naive"):
        m[f"{n}_s"] = row[n]["time_s"]
        m |= {f"{n}_{k}": row[n][k] for k in ("peak_mib", "saved_mib") if k in row[n]}
        m[f"{n}_gflop"] = gflop[n]
    return _entry(args, "target", "triplet_attention", B, L, m, "saved: bytes autograd keeps for the backward; GFLOP: "
                  "contractions executed (fwd+bwd)")


def scaling_entry(args, B: int, L: int, t: dict, mh: dict, mf: dict, gh: float, gf: float) -> dict:
    """The ledger entry of one length of the scaling comparison, HOBA against 2D attention."""
    m = {"hoba_ms": t["hoba"] * 1e3, "full2d_ms": t["full2d"] * 1e3, "hoba_peak_mib": mh["peak_mib"],
         "full2d_peak_mib": mf["peak_mib"], "hoba_gflop": gh, "full2d_gflop": gf}
    return _entry(args, f"scaling/L{L}", "hoba", B, L, m, "full2d: "
                  "scaled_dot_product_attention; GFLOP: contractions executed (fwd+bwd, recomputation included)",
                  length=L)


# --------------------------------------------------------------------------------------------------- main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["target", "scaling", "all"], default="all")
    p.add_argument("--batch", type=int, default=None, help="default: 8 (target), 2 (scaling)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--overlap", type=float, default=0.25)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="CPU runs: process CPU time (default; immune to other jobs' load) or wall-clock time")
    p.add_argument("--no-memory", action="store_true")
    ledger.add_ledger_argument(p)
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args._child:
        print(json.dumps(memory_child(args._child, args.batch, args.heads, args.lengths[0], args.dim, args)))
        return
    H, D, dev = args.heads, args.dim, torch.device(args.device).type
    clock = "process CPU time" if args.device == "cpu" and args.clock == "cpu" else "wall-clock"
    print(f"device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"timing={clock}, best of {args.repeats}")
    entries = []

    if args.part in ("target", "all"):
        B, L = args.batch or 8, 512
        print(f"\n## fast vs naive: B={B} H={H} L={L} D={D} block={args.block} overlap={args.overlap}")
        t = time_candidates(["naive", "fast"], B, H, L, D, args)
        row = {n: {"time_s": t[n]} for n in t}
        if not args.no_memory:
            for n in row:
                row[n].update(measure_memory(n, B, H, L, D, args))
        for n, r in row.items():
            print(f"{n:6s} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        print(f"time ratio fast/naive = {t['fast'] / t['naive']:.3f}  (target <= 0.3)")
        if not args.no_memory:
            mem = row["fast"]["peak_mib"] / row["naive"]["peak_mib"]
            print(f"peak-memory ratio fast/naive = {mem:.3f}  (target <= 0.2)")
            print(f"saved-tensor ratio fast/naive = {row['fast']['saved_mib'] / row['naive']['saved_mib']:.3f}")
        gflop = {n: B * H * flops(n, L, D, args.block, args.overlap, dev) / 1e9 for n in ("naive", "fast")}
        print(f"GFLOP (fwd+bwd): naive {gflop['naive']:.1f}, fast {gflop['fast']:.1f}")
        entries.append(target_entry(args, B, L, row, gflop))

    if args.part in ("scaling", "all"):
        B = args.batch or 2
        print(f"\n## HOBA (triplet, block {args.block}, overlap {args.overlap}, + cross-block) vs full 2D attention "
              f"(scaled_dot_product_attention): B={B} H={H} D={D}")
        print("| L | HOBA ms | 2D ms | time HOBA/2D | HOBA peak MiB | 2D peak MiB | mem HOBA/2D | GFLOP HOBA | "
              "GFLOP 2D |")
        print("|---|---|---|---|---|---|---|---|---|")
        for L in args.lengths:
            t = time_candidates(["hoba", "full2d"], B, H, L, D, args)
            mh = mf = {"peak_mib": float("nan")}
            if not args.no_memory:
                mh, mf = (measure_memory(n, B, H, L, D, args) for n in ("hoba", "full2d"))
            fh = B * H * flops("fast", L, D, args.block, args.overlap, dev) / 1e9
            ff = B * H * flops("full2d", L, D, args.block, args.overlap, dev) / 1e9
            print(f"| {L} | {t['hoba'] * 1e3:.1f} | {t['full2d'] * 1e3:.1f} | {t['hoba'] / t['full2d']:.2f} | "
                  f"{mh['peak_mib']:.1f} | {mf['peak_mib']:.1f} | {mh['peak_mib'] / mf['peak_mib']:.2f} | "
                  f"{fh:.2f} | {ff:.2f} |", flush=True)
            entries.append(scaling_entry(args, B, L, t, mh, mf, fh, ff))
    if args.ledger:
        ledger.append_benchmarks(entries, args.ledger, "triplet.py", sys.argv[1:] if argv is None else argv,
                                    device=args.device, threads=args.threads)


if __name__ == "__main__":
    main()
