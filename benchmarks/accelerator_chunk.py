"""Large inputs on an accelerator: KroneckerAttention forward + backward with the whole value in one chunk against
the bounded accelerator chunk of ``kron_apply`` / ``kron_sum_apply`` (``_ACCELERATOR_CHUNK_BYTES``), next to the
paper-equation layer of ``benchmarks/attention.py``: median time and peak memory (CUDA allocator), all in one run.

Run:  python benchmarks/accelerator_chunk.py [--device cuda] [--reps 10] [--ledger [FILE]]

``--ledger [FILE]``: append one line per shape and combine to the results ledger (default ``results/ledger.jsonl``),
named ``bench/accelerator_chunk/SHAPE-bBATCH/COMBINE+cuda``.
"""
from __future__ import annotations

import argparse
import sys

import torch

from hoformer.functional import products as products_module
from hoformer.layers import KroneckerAttention

import ledger  # benchmarks/: a script's own folder is first on sys.path
import timing
from attention import PaperKronecker

MiB = 2**20
#: (mode sizes, batch): a 512 MiB fp32 value at width 128
SHAPES = [((64, 64), 256), ((32, 32, 32), 32), ((128, 128), 64)]


def measure(fn, device: torch.device, reps: int) -> tuple[float, float]:
    """Median wall time (ms) of ``fn()`` and its peak memory above what was allocated before (MiB)."""
    fn()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    peak = (torch.cuda.max_memory_allocated(device) - base) / MiB
    times = sorted(timing.time_call(fn, device) for _ in range(reps))
    return times[reps // 2] * 1e3, peak


def ledger_entry(shape: tuple, batch: int, combine: str, res: dict, chunk_mib: int, device: str, reps: int) -> dict:
    """The ledger entry of one shape and combine (``res``: ``paper``, ``one chunk``, ``chunked`` -> (ms, MiB))."""
    keys = {"paper": "paper", "one chunk": "one_chunk", "chunked": "chunked"}
    metrics = {f"{keys[k]}_{u}": round(v, 2) for k, tm in res.items() for u, v in zip(("ms", "mib"), tm)}
    return dict(experiment=f"bench/accelerator_chunk/{'x'.join(map(str, shape))}-b{batch}/{combine}"
                           f"{ledger.device_suffix(device)}", model=f"kron_{combine}",
                split=f"fwd+bwd, B={batch}, width 128, 8 heads, fp32", metrics=metrics, shape=list(shape), batch=batch,
                chunk_mib=chunk_mib, note=f"median of {reps}; peak memory: CUDA allocator above what was allocated "
                "before; paper: the paper-equation layer; one chunk: the whole value in one chunk; chunked: the "
                "accelerator chunk (chunk_mib of value)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=10)
    ledger.add_ledger_argument(ap)
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        sys.exit("accelerator_chunk.py: needs a CUDA device (the CPU path chunks by cache size instead)")
    cap = products_module._ACCELERATOR_CHUNK_BYTES
    print(f"accelerator chunk: {cap // MiB} MiB of value; {torch.cuda.get_device_name(device)}")
    entries = []
    for shape, b in SHAPES:
        for combine in ("product", "sum"):
            torch.manual_seed(0)
            x = torch.randn(b, *shape, 128, device=device, requires_grad=True)
            g = torch.randn_like(x)
            kron = KroneckerAttention(128, 8, combine=combine, num_modes=len(shape)).to(device)
            paper = PaperKronecker(128, 8, len(shape), combine).to(device)
            res = {"paper": measure(lambda: paper(x).backward(g), device, a.reps)}
            try:
                products_module._ACCELERATOR_CHUNK_BYTES = 1 << 62
                res["one chunk"] = measure(lambda: kron(x).backward(g), device, a.reps)
            finally:
                products_module._ACCELERATOR_CHUNK_BYTES = cap
            res["chunked"] = measure(lambda: kron(x).backward(g), device, a.reps)
            print(f"{shape} batch {b}, value {x.numel() * x.element_size() / MiB:.0f} MiB, {combine}: "
                  + "; ".join(f"{k} {t:.1f} ms {m:.0f} MiB" for k, (t, m) in res.items())
                  + f" (chunked: {cap // MiB} MiB chunks)", flush=True)
            entries.append(ledger_entry(shape, b, combine, res, cap // MiB, str(device), a.reps))
            del x, g, kron, paper
            torch.cuda.empty_cache()
    if a.ledger:
        ledger.append_benchmarks(entries, a.ledger, "accelerator_chunk.py", sys.argv[1:] if argv is None else argv,
                                    device=str(device), threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
