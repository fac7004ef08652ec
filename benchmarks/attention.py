"""Speed and memory of KroneckerAttention vs the paper-equation baseline, full and axial attention.

Run:  .venv/bin/python benchmarks/attention.py [--device cuda] [--batch 32] [--reps 3] [--quick]
                                               [--variants paper_product kron_linear kron_linear_sum ...]
      .venv/bin/python benchmarks/attention.py --against OTHER/src [--batch 32] [--reps 7] [--accelerator-chunks]
      .venv/bin/python benchmarks/attention.py --reps 5 --ledger     # also append the results to the ledger

``--ledger [FILE]``: append one line per shape and variant (and per functional-core measurement) to the results
ledger (default ``results/ledger.jsonl``), from which docs/benchmarks.md's tables are generated.

``--against``: before / after of the Kronecker layers' fwd+bwd time at the four shapes, hoformer from ``OTHER/src``
("before") against the importable one ("after"), each in its own worker process; the two are timed call by call in
alternation (the order flipping every round), so a shared machine's load hits both alike. Reported: the ratio of the
minima, of the medians, and the median of the per-round ratios ("paired"); then the peak memory of one fwd+bwd of
each side and its ratio to the paper-equation layer's (same shape, measured in the "after" worker).
``--accelerator-chunks``: both workers run the Kronecker products as they run on an accelerator (its chunks, one per
call at these shapes, instead of the CPU's cache-sized ones, and its product kernel), so that the CPU measures the
memory an accelerator would need.

Everything is measured side by side in one run and reported as ratios (machines are noisy). Peak memory is the
CUDA allocator's peak on GPU; on CPU it is the peak of live tensor bytes reconstructed from the profiler's
allocation events (``torch.profiler`` with ``profile_memory=True``), both measured above the inputs.
"Paper baseline" is a direct transcription of HOT eqs 5-9: per-mode query/key projections at full resolution,
sum-pooled afterwards, one einsum mode product per mode.
"forward+backward" is ``module(x).backward(g)`` with one fixed upstream gradient ``g`` shared by every variant, so no
loss computation is timed.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from unittest import mock

import torch
from torch import nn

from hoformer.analysis.bench import peak_memory
from hoformer.analysis.flops import count_executed_flops, count_flops
from hoformer.functional import kronecker as kronecker_module
from hoformer.functional import kronecker_attention
from hoformer.layers import AxialAttention, FullAttention, KroneckerAttention

try:
    import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path
except ImportError:  # the --worker of --against imports another tree's hoformer, which may predate hoformer.results
    if "--worker" not in sys.argv:
        raise
    ledger = None
import timing

SHAPES = [((21, 24), 128, 8), ((7, 7, 7), 128, 8), ((32, 32), 128, 8), ((16, 16, 16), 64, 4)]


class PaperKronecker(nn.Module):
    """Naive HOT eqs 5-9: full-resolution per-mode Q/K, sum pooling, per-mode einsum (product or sum)."""

    def __init__(self, dim, heads, num_modes, combine="product"):
        super().__init__()
        self.h, self.e, self.combine = heads, dim // heads, combine
        self.wq = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(num_modes))
        self.wk = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(num_modes))
        self.q_norm, self.k_norm = nn.LayerNorm(self.e), nn.LayerNorm(self.e)
        self.wv, self.wo = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, sizes, k = x.shape[0], x.shape[1:-1], x.ndim - 2
        v = self.wv(x).view(*x.shape[:-1], self.h, self.e)  # (b, n1..nk, h, e)
        letters = "pqrstuvw"[:k]  # mode indices; b, h, e, y, z are reserved
        out = v if self.combine == "product" else 0
        for i in range(k):
            others = [1 + j for j in range(k) if j != i]
            q = self.wq[i](x).sum(others).view(b, sizes[i], self.h, self.e).transpose(1, 2)
            kk = self.wk[i](x).sum(others).view(b, sizes[i], self.h, self.e).transpose(1, 2)
            s = torch.softmax(self.q_norm(q) @ self.k_norm(kk).transpose(-1, -2) / math.sqrt(self.e), -1)
            src = letters.replace(letters[i], "z")
            eq = f"bhyz,b{src}he->b{letters.replace(letters[i], 'y')}he"
            if self.combine == "product":
                out = torch.einsum(eq, s, out)
            else:
                out = out + torch.einsum(eq, s, v)
        if self.combine == "sum":
            out = out / k
        return self.wo(out.reshape(*x.shape))


class AssociativeLinear(nn.Module):
    """``kron_linear`` with every factor applied by associativity, ``phi(q_i) (phi(k_i)^T X)`` (the only route before
    the kernel learnt to form short modes' factors): what the routing buys, measured in the same run."""

    def __init__(self, dim, heads, num_modes, combine="product"):
        super().__init__()
        self.inner = KroneckerAttention(dim, heads, combine=combine, kernel="linear", num_modes=num_modes)

    def forward(self, x):
        with mock.patch.object(kronecker_module, "forms_linear_factor", lambda n, f, p: False):
            return self.inner(x)


def matmul_fn(device, dtype):
    """The matmul peak: one 2048^3 product on the CPU; on a GPU 10 back-to-back 4096^3 products (one 2048^3 bf16
    matmul is about as short as the synchronisation around it)."""
    n, reps = (4096, 10) if device.type == "cuda" else (2048, 1)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)

    def mm():
        for _ in range(reps):
            a @ b

    return mm, reps * 2 * n**3, f"{n}^3 x {reps}"


AB_VARIANTS = ("kron_product", "kron_sum", "kron_linear", "kron_linear_sum")
AB_KWARGS = {"kron_product": {}, "kron_sum": {"combine": "sum"}, "kron_linear": {"kernel": "linear"},
             "kron_linear_sum": {"combine": "sum", "kernel": "linear"}}


def _accelerator_chunks() -> None:
    """Make the Kronecker products of this process run as on an accelerator, on the CPU: its chunks (bounded by
    ``_ACCELERATOR_CHUNK_BYTES``, one chunk at the benchmark shapes) and its product kernel."""
    try:
        from hoformer.functional import products as kernels
    except ImportError:  # a tree whose kernels live in functional/kronecker.py
        kernels = kronecker_module

    def accelerator_pairs(v):
        per_pair = max(1, v[0, 0].numel() * v.element_size())
        return max(1, min(v.shape[0] * v.shape[1], kernels._ACCELERATOR_CHUNK_BYTES // per_pair))

    kernels._chunk_pairs = accelerator_pairs
    if hasattr(kernels, "_rotates"):  # the accelerators' product kernel
        kernels._rotates = lambda v: True


def _cpu_peak_bytes(fn) -> int:
    """Peak bytes of ``fn()`` from the profiler's memory timeline, as :func:`hoformer.analysis.bench.cpu_peak_memory`
    measures it, written here so that both trees of ``--against`` measure with the same code."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    peak = run = 0
    for _, action, _, nbytes in prof._memory_profile().timeline:
        run += nbytes if action == Action.CREATE else -nbytes if action == Action.DESTROY else 0
        peak = max(peak, run)
    return peak


def ab_worker(batch: int) -> None:
    """``--worker``: build the Kronecker layers (and the paper-equation ones) at every shape (fixed seeds), then
    answer each stdin line ``time|mem shape_index variant`` with the seconds, or the peak bytes, of one
    ``module(x).backward(gy)`` (CPU)."""
    if "--accelerator-chunks" in sys.argv:
        _accelerator_chunks()
    steps = {}
    for i, (sizes, dim, heads) in enumerate(SHAPES):
        torch.manual_seed(i)
        x = torch.randn(batch, *sizes, dim, requires_grad=True)
        gy = torch.randn(batch, *sizes, dim)
        for name in AB_VARIANTS + ("paper_product", "paper_sum"):
            torch.manual_seed(100 + i)
            if name.startswith("paper"):
                mod = PaperKronecker(dim, heads, len(sizes), name.split("_")[1])
            else:
                mod = KroneckerAttention(dim, heads, num_modes=len(sizes), **AB_KWARGS[name])

            def clear(mod=mod, x=x):
                x.grad = None
                mod.zero_grad(set_to_none=True)

            def step(mod=mod, x=x, gy=gy, clear=clear):
                clear()
                mod(x).backward(gy)

            steps[(i, name)] = step, clear
    print("ready", flush=True)
    for line in sys.stdin:
        what, i, name = line.split()
        step, clear = steps[(int(i), name)]
        if what == "mem":
            step()
            clear()  # else the last call's gradients are freed inside the measured call
            print(_cpu_peak_bytes(step), flush=True)
        else:
            print(timing.time_call(step, torch.device("cpu")), flush=True)


def ab_compare(against: str, batch: int, reps: int, variants=None, accelerator_chunks: bool = False) -> None:
    import hoformer

    here = os.path.dirname(os.path.dirname(hoformer.__file__))
    workers = {}
    extra = ["--accelerator-chunks"] if accelerator_chunks else []
    for side, src in (("before", against), ("after", here)):
        env = {**os.environ, "PYTHONPATH": src}
        workers[side] = subprocess.Popen([sys.executable, __file__, "--worker", "--batch", str(batch), *extra],
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for w in workers.values():
        assert w.stdout.readline().strip() == "ready"

    def call(side, key, what="time"):
        w = workers[side]
        w.stdin.write(f"{what} {key[0]} {key[1]}\n")
        w.stdin.flush()
        return float(w.stdout.readline())

    keys = [(i, name) for i in range(len(SHAPES)) for name in AB_VARIANTS if not variants or name in variants]
    times = {(side, key): [] for side in workers for key in keys}
    for r in range(reps + 1):  # round 0 warms up
        for key in keys:
            for side in (("before", "after") if r % 2 else ("after", "before")):
                t = call(side, key)
                if r:
                    times[(side, key)].append(t)
    mem = {(side, key): call(side, key, "mem") for side in workers for key in keys}
    paper = {(i, comb): call("after", (i, f"paper_{comb}"), "mem") for i in range(len(SHAPES))
             for comb in ("product", "sum")}
    for w in workers.values():
        w.stdin.close()
        w.wait()
    print(f"before: {against}\nafter:  {here}\nbatch={batch} reps={reps} threads={torch.get_num_threads()} (CPU; "
          f"min and median over rounds, calls alternated)\n")
    print(f"{'shape':>14} {'attention':>16} {'before ms':>10} {'after ms':>9} {'after/before: min':>18} "
          f"{'median':>7} {'paired':>7}")
    for i, name in keys:
        b, a = times[("before", (i, name))], times[("after", (i, name))]
        paired = statistics.median(x / y for x, y in zip(a, b))  # the two calls of one round ran back to back
        print(f"{str(SHAPES[i][0]):>14} {name:>16} {min(b) * 1e3:10.1f} {min(a) * 1e3:9.1f} {min(a) / min(b):18.3f} "
              f"{statistics.median(a) / statistics.median(b):7.3f} {paired:7.3f}")
    chunks = "accelerator chunks" if accelerator_chunks else "CPU chunks"
    print(f"\npeak memory of one fwd+bwd above the inputs (CPU profiler, {chunks}); paper = the paper-equation layer")
    print(f"{'shape':>14} {'attention':>16} {'before MiB':>11} {'after MiB':>10} {'paper MiB':>10} "
          f"{'before/paper':>13} {'after/paper':>12}")
    for i, name in keys:
        b, a = mem[("before", (i, name))], mem[("after", (i, name))]
        p = paper[(i, "sum" if name.endswith("_sum") else "product")]
        print(f"{str(SHAPES[i][0]):>14} {name:>16} {b / 2**20:11.1f} {a / 2**20:10.1f} {p / 2**20:10.1f} "
              f"{b / p:13.2f} {a / p:12.2f}")


def main():
    if "--worker" in sys.argv:
        ab_worker(int(sys.argv[sys.argv.index("--batch") + 1]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="batch 4, 2 reps, skip full attention at 4096 tokens")
    ap.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                    help="only these rows (the paper baselines the ratios need are always run); default: all")
    ap.add_argument("--no-core", action="store_true", help="skip the functional-core throughput at the largest shape")
    ap.add_argument("--against", default=None, metavar="SRC",
                    help="before/after of the Kronecker layers against the hoformer in SRC (e.g. OTHER/src), CPU")
    ap.add_argument("--accelerator-chunks", action="store_true",
                    help="with --against: the Kronecker products in an accelerator's chunks (its memory, on the CPU)")
    ledger.add_ledger_argument(ap)
    args = ap.parse_args()
    if args.against:
        unknown = set(args.variants or ()) - set(AB_VARIANTS)
        if unknown:
            ap.error(f"--variants with --against: unknown {sorted(unknown)}; choose from {list(AB_VARIANTS)}")
        ab_compare(args.against, args.batch, args.reps, args.variants, args.accelerator_chunks)
        return
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.quick:
        args.batch, args.reps = 4, 2
    torch.manual_seed(0)
    mm, mm_flops, mm_desc = matmul_fn(device, dtype)
    print(f"device={device} dtype={args.dtype} threads={torch.get_num_threads()} batch={args.batch} "
          f"reps={args.reps} (min over round-robin rounds)\n")
    hdr = f"{'shape':>14} {'attention':>18} {'fwd+bwd ms':>11} {'peak MiB':>9} {'GFLOP/s':>8} {'t/paper':>8} {'mem/paper':>9} {'flop/paper':>10}"
    print(hdr)
    print("-" * len(hdr))
    summary, lines = [], []  # lines: the ledger entries
    note = (f"minimum of {args.reps} round-robin rounds; peak memory above the inputs; t/paper, mem/paper, "
            "flop/paper: ratios to the paper-equation layer with the same combine at the same shape")
    split = f"fwd+bwd, B={args.batch}, {'fp32' if dtype == torch.float32 else 'bf16'}"
    for sizes, dim, heads in SHAPES:
        x = torch.randn(args.batch, *sizes, dim, device=device, dtype=dtype, requires_grad=True)
        gy = torch.randn(args.batch, *sizes, dim, device=device, dtype=dtype)  # the same upstream gradient for all
        k = len(sizes)
        variants = {
            "paper_product": PaperKronecker(dim, heads, k, "product"),
            "paper_sum": PaperKronecker(dim, heads, k, "sum"),
            "kron_product": KroneckerAttention(dim, heads, combine="product", num_modes=k),
            "kron_sum": KroneckerAttention(dim, heads, combine="sum", num_modes=k),
            "kron_linear": KroneckerAttention(dim, heads, kernel="linear", num_modes=k),
            "kron_linear_sum": KroneckerAttention(dim, heads, combine="sum", kernel="linear", num_modes=k),
            "kron_linear_assoc": AssociativeLinear(dim, heads, k),
            "full": FullAttention(dim, heads),
            "axial": AxialAttention(dim, heads),
        }
        if args.quick and math.prod(sizes) > 1024:
            variants.pop("full")
        if args.variants:
            unknown = set(args.variants) - set(variants) - ({"full"} if args.quick else set())
            if unknown:
                ap.error(f"--variants: unknown {sorted(unknown)}; choose from {sorted(variants)}")
            variants = {n: m for n, m in variants.items() if n in {"paper_product", "paper_sum", *args.variants}}
        steps, clears = {}, {}
        for name, mod in variants.items():
            mod = mod.to(device=device, dtype=dtype)

            def clear(mod=mod):
                x.grad = None
                mod.zero_grad(set_to_none=True)

            def step(clear=clear, mod=mod):
                clear()
                mod(x).backward(gy)

            steps[name], clears[name] = step, clear
        times = timing.interleaved_times(steps, device, args.reps)
        # FLOPs are linear in the batch: counted on one sample and scaled, since the counter runs SDPA through its
        # math decomposition, which would hold full attention's B x H x N x N scores (~25 GiB at 16^3, B=32)
        x1, gy1 = x[:1].detach().requires_grad_(), gy[:1]
        res = {}
        for name, fn in steps.items():
            clears[name]()  # the previous call's gradients would be freed inside the measured call (CUDA)
            one = (lambda mod=variants[name]: mod.to(device=device, dtype=dtype)(x1).backward(gy1))
            res[name] = (times[name], peak_memory(fn, device), count_executed_flops(one) * args.batch)
        for name, (t, mem, fl) in res.items():
            base = res["paper_sum" if name.endswith("_sum") else "paper_product"]
            print(f"{str(sizes):>14} {name:>18} {t * 1e3:11.1f} {mem / 2**20:9.1f} {fl / t / 1e9:8.1f} "
                  f"{t / base[0]:8.2f} {mem / max(base[1], 1):9.2f} {fl / base[2]:10.2f}")
            lines.append(dict(
                experiment=f"bench/attention/{'x'.join(map(str, sizes))}/{name}", model=name, split=split,
                metrics={"fwd_bwd_ms": round(t * 1e3, 2), "peak_mib": round(mem / 2**20, 2),
                         "gflops": round(fl / t / 1e9, 2), "t/paper": round(t / base[0], 3),
                         "mem/paper": round(mem / max(base[1], 1), 3), "flop/paper": round(fl / base[2], 3)},
                shape=list(sizes), note=note))
        if "full" in res and "kron_product" in res and "kron_sum" in res:
            summary.append((sizes, res["full"][0] / res["kron_product"][0], res["full"][0] / res["kron_sum"][0]))
        print()

    for sizes, rp, rs in summary:
        print(f"full / kronecker time at {sizes}: product {rp:.1f}x, sum {rs:.1f}x")
    if not args.no_core:
        lines += core_throughput(args, device, dtype, mm, mm_flops, mm_desc)
    if args.ledger:
        suffix = ledger.device_suffix(str(device), "fp32" if dtype == torch.float32 else "bf16")
        write_ledger(args, lines, device, suffix)


def write_ledger(args, entries: list[dict], device, suffix: str = "") -> None:
    """Append ``entries`` to the ledger ``args.ledger`` with their provenance; ``suffix``: the experiment-name suffix
    of a device or dtype other than CPU fp32 (:func:`ledger.device_suffix`), added to every entry's name."""
    entries = [{**e, "experiment": e["experiment"] + suffix} for e in entries]
    ledger.append_benchmarks(entries, args.ledger, "attention.py", sys.argv[1:], device=str(device),
                                threads=torch.get_num_threads())


def core_throughput(args, device, dtype, mm, mm_flops, mm_desc) -> list[dict]:
    """The functional core's forward + backward at the largest shape (pooled q / k given) against a matmul timed in
    the same rounds; the ledger entries of both combines."""
    out = []
    sizes, dim, heads = SHAPES[-1]
    e = dim // heads
    v = torch.randn(args.batch, heads, *sizes, e, device=device, dtype=dtype, requires_grad=True)
    qs = [torch.randn(args.batch, heads, n, e, device=device, dtype=dtype, requires_grad=True) for n in sizes]
    ks = [torch.randn(args.batch, heads, n, e, device=device, dtype=dtype, requires_grad=True) for n in sizes]
    gv = torch.randn_like(v)
    cores = {"matmul": mm}
    for combine in ("product", "sum"):
        def core(combine=combine):
            v.grad = None
            kronecker_attention(qs, ks, v, combine=combine).backward(gv)

        cores[combine] = core
    times = timing.interleaved_times(cores, device, args.reps)  # the peak is timed in the same rounds as the core
    peak = mm_flops / times["matmul"] / 1e9
    print(f"measured matmul peak: {peak:.1f} GFLOP/s ({mm_desc}, same rounds as the core)")
    for combine in ("product", "sum"):
        t, executed = times[combine], count_executed_flops(cores[combine])
        # useful work = forward + a backward of twice the forward; the product's backward also recomputes partial
        # mode products, which `executed` counts but which do not make the core faster
        useful = 3 * count_flops(lambda: kronecker_attention(qs, ks, v, combine=combine))
        print(f"functional core {combine:>7} at {sizes} (B={args.batch}, H={heads}, E={e}): {t * 1e3:.1f} ms, "
              f"useful {useful / t / 1e9:.1f} GFLOP/s = {useful / t / 1e9 / peak:.0%} of matmul peak "
              f"(executed incl. recompute: {executed / t / 1e9:.1f} GFLOP/s = {executed / t / 1e9 / peak:.0%})")
        out.append(dict(
            experiment=f"bench/attention/core/{combine}", model=f"kronecker_attention_{combine}",
            split=f"fwd+bwd, B={args.batch}, H={heads}, E={e}, pooled q/k given",
            metrics={"ms": round(t * 1e3, 2), "useful_gflops": round(useful / t / 1e9, 2),
                     "executed_gflops": round(executed / t / 1e9, 2), "matmul_gflops": round(peak, 2),
                     "useful/peak": round(useful / t / 1e9 / peak, 3)},
            shape=list(sizes), note=f"minimum of {args.reps} round-robin rounds; peak: {mm_desc}, same rounds"))
    return out


if __name__ == "__main__":
    main()
