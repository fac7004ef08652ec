"""Dropout masks on the CPU, side by side: what one dropout costs with each way of drawing its mask, on the largest
dropout tensor of the paper-size Weather HOT training step (the MLP's hidden activations, 32 x 21 x 24 x 512 =
8.3 M values, p = 0.1; ``benchmarks/train_step.py`` times the whole step).

Run:  .venv/bin/python benchmarks/dropout.py [--shape 32 21 24 512] [--p 0.1] [--reps 15] [--compiled]
                                             [--ledger [FILE]]

Each variant is timed as autograd runs it in a training step: the masked, scaled output (forward) and the gradient
through it (backward); all variants round-robin, the minimum over ``--reps`` rounds kept (``timing.py``):

* ``bernoulli``: ``torch.nn.functional.dropout`` (a float mask filled by ``bernoulli_``, kept for the backward);
* ``hoformer``: :func:`hoformer.functional.dropout`, the library's: one fused pass of the C kernel (a counter-based
  SplitMix64 mask), the backward pass recomputing the mask from its seed;
* ``hoformer_torch``: the same masks from torch integer operations (``keep_mask_reference``: the path of a machine
  without a C compiler, ``HOFORMER_DROPOUT_KERNEL=0``), multiplied in;
* ``mask_32bit_words``: a mask from the generator's 32-bit random words (64-bit ``randint`` words read as two 32-bit
  integers, compared in float32 with ``-2^31 + p 2^32``, scaled), multiplied in forward and backward;
* ``words_32bit``: as many random 64-bit words as that mask needs, alone (the generator's cost: the floor of any mask
  drawn from its words);
* ``bias_gelu_torch``: the MLP's hidden activation as three operations, ``dropout(gelu(h + b))`` (torch's bias add
  and GELU, hoformer's dropout): what a training ``Mlp`` ran before the fused pass, and what it runs off the CPU;
* ``bias_gelu_fused``: :func:`hoformer.functional.bias_gelu_dropout`, the same activation in one pass of the C
  kernel forward and one backward (the masked GELU derivative kept instead of the GELU's input);
* ``--compiled``: ``torch.compile`` (Inductor, whose generated code draws its own random numbers) of GELU and
  dropout, against the eager GELU and hoformer's dropout (the same two operations; the compile time not counted);
* ``*_bf16``: ``bernoulli``, ``hoformer``, ``hoformer_torch`` and ``bias_gelu_fused`` on a bfloat16 input (what CPU
  bf16 autocast gives a dropout: the kernel's bf16 path, against the torch-op masks of a machine without the
  kernel).

The table prints each variant's time and its ratio to ``bernoulli``, and the fraction of elements the mask kept (a
check of the distribution: within 4 standard errors of ``1 - p``).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from hoformer.functional import bias_gelu_dropout
from hoformer.functional import dropout as hoformer_dropout
from hoformer.functional import keep_mask_reference

import ledger  # benchmarks/: a script's own folder is first on sys.path
import timing


def _words(count: int) -> torch.Tensor:
    """``count`` uniform 64-bit words of the global generator (its full range)."""
    return torch.empty(count, dtype=torch.int64).random_(-2**63, None)


def mask_words_32bit(shape, p: float) -> torch.Tensor:
    """The scaled keep mask of ``shape`` from 32-bit random words: kept iff the word, a signed 32-bit integer, is at
    least ``-2^31 + p 2^32`` (compared in float32)."""
    n = math.prod(shape)
    words = _words((n + 1) // 2).view(torch.int32)[:n].view(shape)
    return words.to(torch.float32).ge_(-2.0**31 + p * 2.0**32).mul_(1.0 / (1.0 - p))


#: the variants that take a bfloat16 input (the others float32)
BF16 = ("bernoulli_bf16", "hoformer_bf16", "hoformer_torch_bf16", "bias_gelu_fused_bf16")


def variants(shape, p: float, compiled: bool) -> dict:
    """name -> a function of the input (requiring grad; bfloat16 for :data:`BF16`) that returns the dropout output."""
    n = math.prod(shape)
    bias = torch.zeros(shape[-1], requires_grad=True)
    out = {
        "bernoulli": lambda x: F.dropout(x, p),
        "hoformer": lambda x: hoformer_dropout(x, p),
        "hoformer_torch": lambda x: x * keep_mask_reference(shape, p, torch.randint(-2**63, 2**63 - 1, ())),
        "mask_32bit_words": lambda x: x * mask_words_32bit(shape, p),
        "words_32bit": lambda x: _words((n + 1) // 2),  # no output: timed without a backward pass
        "bias_gelu_torch": lambda x: hoformer_dropout(F.gelu(x + bias), p),
        "bias_gelu_fused": lambda x: bias_gelu_dropout(x, bias, p),
        "bernoulli_bf16": lambda x: F.dropout(x, p),
        "hoformer_bf16": lambda x: hoformer_dropout(x, p),
        "hoformer_torch_bf16": lambda x: x * keep_mask_reference(shape, p, torch.randint(-2**63, 2**63 - 1, ()),
                                                                 dtype=torch.bfloat16),
        # under bf16 autocast, where a training MLP's bf16 hidden activation meets the fused pass
        "bias_gelu_fused_bf16": lambda x: _autocast(bias_gelu_dropout, x, bias, p),
    }
    if compiled:
        fused = torch.compile(lambda x: F.dropout(F.gelu(x), p), dynamic=False)
        out["gelu_hoformer"] = lambda x: hoformer_dropout(F.gelu(x), p)
        out["gelu_compiled"] = fused
    return out


def _autocast(fn, *args):
    """``fn(*args)`` under CPU bf16 autocast (where a training MLP's bf16 hidden activation meets the fused pass)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return fn(*args)


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

    def dtype(name):
        return torch.bfloat16 if name in BF16 else torch.float32

    inputs = {d: (x0.to(d), grad.to(d)) for d in (torch.float32, torch.bfloat16)}

    def step(name, fn):
        x1, g = inputs[dtype(name)]

        def run():
            x = x1.detach().requires_grad_()
            y = fn(x)
            if not name.startswith("words"):
                y.backward(g)
        return run

    best = timing.interleaved_times({k: step(k, f) for k, f in fns.items()}, reps=a.reps)
    ones = {d: torch.ones(shape, dtype=d) for d in inputs}
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
                kept = float((fn(ones[dtype(name)]) != 0).double().mean())
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
