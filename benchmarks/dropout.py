"""Dropout masks on the CPU, side by side: what one dropout costs with each way of drawing its mask, on the largest
dropout tensor of the paper-size Weather HOT training step (the MLP's hidden activations, 32 x 21 x 24 x 512 =
8.3 M values, p = 0.1; ``benchmarks/train_step.py`` times the whole step).

Run:  .venv/bin/python benchmarks/dropout.py [--shape 32 21 24 512] [--p 0.1] [--reps 15] [--compiled]
                                             [--ledger [FILE]]

Each variant is timed as autograd runs it in a training step: the masked, scaled output (forward) and the gradient
through it (backward); all variants round-robin, the minimum over ``--reps`` rounds kept (``timing.py``):

* ``bernoulli``: ``torch.nn.functional.dropout`` (a float mask filled by ``bernoulli_``);
* ``hoformer``: :func:`hoformer.functional.dropout`, the library's (32-bit random words, two per 64-bit draw);
* ``16bit_exact``: a candidate: 16-bit words (four per 64-bit draw) compared with the threshold's high 16 bits,
  the ties (one value in 65,536) decided by 16 more bits, so that an element is kept with probability ``1 - p``
  rounded to ``2^-32``, as with 32-bit words;
* ``words_32bit`` / ``words_16bit``: as many random 64-bit words as a 32-bit / 16-bit mask needs, alone, no mask
  (the generator's cost: the floor of any mask built from such words; drawn over the full 64-bit range, which costs
  what hoformer's ``randint`` over ``[-2^63, 2^63 - 1)`` does to within the noise of this machine);
* ``--compiled``: ``torch.compile`` (Inductor, whose generated code draws its own random numbers) of GELU and
  dropout, against the eager GELU and hoformer's dropout (the same two operations; the compile time not counted).

The table prints each variant's time and its ratio to ``bernoulli``, and the fraction of elements the mask kept (a
check of the distribution: within 4 standard errors of ``1 - p``).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from hoformer.functional import dropout as hoformer_dropout

import ledger  # benchmarks/: a script's own folder is first on sys.path
import timing


def _words(count: int) -> torch.Tensor:
    """``count`` uniform 64-bit words of the global generator (its full range)."""
    return torch.empty(count, dtype=torch.int64).random_(-2**63, None)


def mask_16bit_exact(shape, p: float) -> torch.Tensor:
    """The scaled keep mask of ``shape`` from 16-bit random values: kept iff the 32-bit number ``hi * 2^16 + lo``
    is at least ``round(p * 2^32)``, where ``lo`` is drawn only for the elements whose ``hi`` equals the
    threshold's high half."""
    n = math.prod(shape)
    hi_t, lo_t = divmod(round(p * 2**32), 2**16)
    hi = _words((n + 3) // 4).view(torch.int16)[:n]  # uniform in [-2^15, 2^15): hi - 2^15
    mask = hi.to(torch.float32)
    ties = (hi == hi_t - 2**15).nonzero().squeeze(1)
    mask.ge_(hi_t - 2**15 + 1)
    if ties.numel():
        lo = _words((ties.numel() + 3) // 4).view(torch.int16)[:ties.numel()]
        mask[ties] = (lo >= lo_t - 2**15).to(torch.float32)
    return mask.mul_(1.0 / (1.0 - p)).view(shape)


def variants(shape, p: float, compiled: bool) -> dict:
    """name -> a function of the input (requiring grad) that returns the dropout output."""
    n = math.prod(shape)
    out = {
        "bernoulli": lambda x: F.dropout(x, p),
        "hoformer": lambda x: hoformer_dropout(x, p),
        "16bit_exact": lambda x: x * mask_16bit_exact(shape, p),
        "words_32bit": lambda x: _words((n + 1) // 2),  # no output: timed without a backward pass
        "words_16bit": lambda x: _words((n + 3) // 4),
    }
    if compiled:
        fused = torch.compile(lambda x: F.dropout(F.gelu(x), p), dynamic=False)
        out["gelu_hoformer"] = lambda x: hoformer_dropout(F.gelu(x), p)
        out["gelu_compiled"] = fused
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=int, nargs="+", default=[32, 21, 24, 512])
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--compiled", action="store_true", help="also Inductor-compiled GELU + dropout (compiles first)")
    ledger.add_ledger_argument(ap)
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error(f"--reps must be >= 1, got {a.reps}")
    if not 0 < a.p < 1:
        ap.error(f"--p must be in (0, 1), got {a.p}")
    if any(s < 1 for s in a.shape):
        ap.error(f"--shape sizes must be >= 1, got {a.shape}")
    shape = tuple(a.shape)
    torch.manual_seed(0)
    x0, grad = torch.randn(shape), torch.randn(shape)
    fns = variants(shape, a.p, a.compiled)

    def step(name, fn):
        def run():
            x = x0.detach().requires_grad_()
            y = fn(x)
            if not name.startswith("words"):
                y.backward(grad)
        return run

    best = timing.interleaved_times({k: step(k, f) for k, f in fns.items()}, reps=a.reps)
    ones = torch.ones(shape)
    n = math.prod(shape)
    se = math.sqrt(a.p * (1 - a.p) / n)
    print(f"CPU, threads {torch.get_num_threads()}, shape {list(shape)} ({n / 1e6:.1f} M values), p {a.p}, "
          f"reps {a.reps}, torch {torch.__version__}")
    print("\n| variant | fwd+bwd ms | / bernoulli | kept | kept - (1 - p), in standard errors |")
    print("|---|---:|---:|---:|---:|")
    entries = []
    for name, fn in fns.items():
        ms, ratio = best[name] * 1e3, best[name] / best["bernoulli"]
        metrics = {"ms": round(ms, 3), "vs_bernoulli": round(ratio, 4)}
        kept = z = None
        if not name.startswith("words"):
            with torch.no_grad():
                kept = float((fn(ones) != 0).double().mean())
            z = (kept - (1 - a.p)) / se
            metrics.update(kept=round(kept, 6), kept_z=round(z, 2))
        print(f"| {name} | {ms:.1f} | {ratio:.2f} | {'-' if kept is None else f'{kept:.5f}'} | "
              f"{'-' if z is None else f'{z:+.1f}'} |", flush=True)
        entries.append({"experiment": f"bench/dropout/{name}", "model": name, "split": "cpu", "metrics": metrics,
                        "shape": list(shape), "p": a.p,
                        "note": "one dropout's forward and backward on the CPU (min over round-robin reps)"})
    if a.ledger:
        ledger.append_benchmarks(entries, a.ledger, "dropout.py", sys.argv[1:] if argv is None else argv,
                                 device="cpu", threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
