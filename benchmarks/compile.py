"""Training-step time of registered models, eager vs ``torch.compile`` (what ``hoformer.train.CompileModel`` does).

Run:  .venv/bin/python benchmarks/compile.py [--device cuda] [--backend inductor] [--mode default] [--reps 5]
                                             [--models hot_forecaster hot_volume_classifier ...]
                                             [--fallback-random auto|on|off] [--ledger [FILE]]

One training step = forward, cross-entropy / MSE loss, backward, AdamW step, at the paper-config sizes below
(``--small`` shrinks them for a quick look). Eager and compiled copies of the same model (same weights, same batch)
are timed round-robin and the minimum over ``--reps`` rounds is kept, so load changes on a shared machine hit both;
the table prints the ratio compiled / eager and the one-off compile time (first compiled step minus one eager step).
The models are compiled with the arguments ``hoformer.train.CompileModel`` would use (``--fallback-random auto``:
Inductor's dropout masks from ATen's random ops on CPU, its own generated ones elsewhere).
The softmax Kronecker and the triplet kernels stay opaque eager calls under compile (``torch.compiler.disable``):
the compiler fuses the projections, norms, MLPs and softmaxes around them.
``--ledger [FILE]``: append one line per model to the results ledger (default ``results/ledger.jsonl``), named
``bench/compile/MODEL/VARIANT`` (``compiled``: CompileModel's arguments; ``compiled-plain``: ``--fallback-random off``).
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F

from hoformer.models import create_model
from hoformer.train import CompileModel

import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path
import timing

# name -> (model kwargs, batch size), the sizes of the committed paper configs
CASES = {
    "hot_forecaster": (dict(seq_len=96, pred_len=96, num_variates=21, dim=128, depth=2, num_heads=8, patch_size=8,
                            dropout=0.1), 32),
    "hot_volume_classifier": (dict(in_channels=1, input_size=28, num_classes=2, dim=128, depth=6, num_heads=8,
                                   patch_size=4, dropout=0.1), 32),
    "hoba_classifier": (dict(vocab_size=8000, num_classes=6, max_len=64, dim=256, depth=3, num_heads=4,
                             attention="hoba", block_size=16), 32),
}


def _batch(model, batch: int, device):
    args, kwargs = model.example_inputs(batch_size=batch)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return args, kwargs


def _loss(out: torch.Tensor) -> torch.Tensor:
    if out.ndim == 2:  # classifier logits (B, K); forecasts are (B, pred_len, C)
        return F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long, device=out.device))
    return out.float().pow(2).mean()


def variant(a: argparse.Namespace) -> str:
    """The ledger name of what is compiled: ``compiled`` (CompileModel's arguments), ``compiled-plain``
    (``--fallback-random off``), ``compiled-fallback-random`` (``on``), then the mode and a non-default backend."""
    name = "compiled" + {"auto": "", "on": "-fallback-random", "off": "-plain"}[a.fallback_random]
    return name + (f"-{a.mode}" if a.mode else "") + (f"-{a.backend}" if a.backend != "inductor" else "")


def ledger_entries(a: argparse.Namespace, results: list[dict]) -> list[dict]:
    """One ledger entry per measured model (``results``: ``model``, ``batch``, ``eager_ms``, ``compiled_ms``,
    ``compile_s``); the ratio is the tables' to compute."""
    suffix = ledger.device_suffix(a.device)
    out = []
    for r in results:
        case = r["model"] + ("-small" if a.small else "")
        out.append(dict(experiment=f"bench/compile/{case}/{variant(a)}{suffix}", model=r["model"],
                        split=f"training step, B={r['batch']}, fp32",
                        metrics={k: round(r[k], 2) for k in ("eager_ms", "compiled_ms", "compile_s")},
                        case=case, variant=variant(a),
                        note=f"minimum of {a.reps} round-robin rounds, eager and compiled; {a.backend}, "
                             f"fallback_random {a.fallback_random}; compile_s: first compiled steps minus eager steps"))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--mode", default=None, help="torch.compile mode (default, reduce-overhead, max-autotune)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--small", action="store_true", help="half the batch and depth (a quick look)")
    p.add_argument("--fallback-random", choices=("auto", "on", "off"), default="auto",
                   help="Inductor's fallback_random as CompileModel sets it (auto: on for CPU, off elsewhere)")
    ledger.add_ledger_argument(p)
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    device = torch.device(a.device)
    fallback = {"auto": None, "on": True, "off": False}[a.fallback_random]
    compile_kwargs = CompileModel.compile_kwargs(device, backend=a.backend, mode=a.mode, fallback_random=fallback)
    print(f"device {device}, threads {torch.get_num_threads()}, reps {a.reps}, torch.compile({compile_kwargs})")
    print("| model | eager ms/step | compiled ms/step | compiled / eager | compile s |")
    print("|---|---:|---:|---:|---:|")
    results = []
    for name in a.models:
        kw, batch = CASES[name]
        if a.small:
            kw, batch = {**kw, "depth": max(1, kw["depth"] // 2)}, max(2, batch // 2)
        torch.manual_seed(0)
        eager = create_model(name, **kw).to(device).train()
        compiled = copy.deepcopy(eager)
        compiled.compile(**compile_kwargs)
        args, kwargs = _batch(eager, batch, device)
        opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (eager, compiled)}

        def step(m):
            opts[m].zero_grad(set_to_none=True)
            _loss(m(*args, **kwargs)).backward()
            opts[m].step()

        step(eager)
        t_eager_one = timing.time_call(lambda: step(eager), device)
        # compiles forward and backward, and recompiles for the second call's guards, if any
        t_compile = timing.time_call(lambda: (step(compiled), step(compiled)), device) - 2 * t_eager_one
        best = timing.interleaved_times({"eager": lambda: step(eager), "compiled": lambda: step(compiled)}, device,
                                        a.reps, warmup=0)
        print(f"| {name} | {best['eager'] * 1e3:.1f} | {best['compiled'] * 1e3:.1f} | "
              f"**{best['compiled'] / best['eager']:.2f}** | {max(t_compile, 0.0):.0f} |", flush=True)
        results.append({"model": name, "batch": batch, "eager_ms": best["eager"] * 1e3,
                        "compiled_ms": best["compiled"] * 1e3, "compile_s": max(t_compile, 0.0)})
    if a.ledger:
        ledger.append_benchmarks(ledger_entries(a, results), a.ledger, "compile.py",
                                    sys.argv[1:] if argv is None else argv, device=a.device,
                                    threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
