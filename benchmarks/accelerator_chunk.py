"""Large inputs on an accelerator: KroneckerAttention forward + backward with the whole value in one chunk against
the bounded accelerator chunk of ``kron_apply`` / ``kron_sum_apply`` (``_ACCELERATOR_CHUNK_BYTES``), next to the
paper-equation layer of ``benchmarks/attention.py``: median time and peak memory (CUDA allocator), all in one run.

Run:  python benchmarks/accelerator_chunk.py [--device cuda] [--reps 10]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import PaperKronecker  # noqa: E402

from hoformer.functional import products as products_module  # noqa: E402
from hoformer.layers import KroneckerAttention  # noqa: E402

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
    times = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2] * 1e3, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        sys.exit("accelerator_chunk.py: needs a CUDA device (the CPU path chunks by cache size instead)")
    cap = products_module._ACCELERATOR_CHUNK_BYTES
    print(f"accelerator chunk: {cap // MiB} MiB of value; {torch.cuda.get_device_name(device)}")
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
            res[f"{cap // MiB} MiB chunks"] = measure(lambda: kron(x).backward(g), device, a.reps)
            print(f"{shape} batch {b}, value {x.numel() * x.element_size() / MiB:.0f} MiB, {combine}: "
                  + "; ".join(f"{k} {t:.1f} ms {m:.0f} MiB" for k, (t, m) in res.items()), flush=True)
            del x, g, kron, paper
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
