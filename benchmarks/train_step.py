"""Training-step time and peak memory of the paper-size HOT models: hoformer's Kronecker layer against the paper-equation
layer in the same model, each eager and compiled the same way, side by side in one process.

Run:  .venv/bin/python benchmarks/train_step.py [--device cuda] [--precision 32|bf16] [--reps 10]
                                                [--modes default reduce-overhead ...] [--cases etth1 weather adrenal]
                                                [--ledger [FILE]]

One training step = forward in train mode, MSE / cross-entropy loss, backward, optimiser step (the task's
``Optimization``: AdamW, fused on CUDA), at the sizes of the paper configs (``configs/hot/ltsf.yaml``: width 128,
2 blocks, 8 heads, patch 4, batch 32; ``configs/hot/medmnist3d.yaml``: 6 blocks, 28^3 volumes, patch 4). "paper" is
the same model with every attention replaced by ``PaperKronecker`` of ``benchmarks/attention.py`` (HOT eqs 5-9 as
written: per-mode projections at full resolution, sum pooling, one einsum per mode). Compiled variants use the
arguments of ``hoformer.train.CompileModel`` (one graph, Inductor) with each ``--modes`` entry (on CUDA,
``reduce-overhead`` replays CUDA graphs: no per-kernel launch cost). All variants are timed round-robin and the
minimum over ``--reps`` rounds is kept, so a shared machine's load hits them alike; the table prints ms per step and
the ratios hoformer / paper. Peak memory: the CUDA allocator's peak of one step on a GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import sys

import torch
import torch.nn.functional as F

from hoformer.models import create_model
from hoformer.train import CompileModel, Optimization
from hoformer.train.optim import configure_optimization

import attention as attention_bench  # benchmarks/: a script's own folder is first on sys.path
import ledger


CASES = {  # name -> (registered model, kwargs, batch size): the paper configs' sizes
    "etth1": ("hot_forecaster", dict(seq_len=96, pred_len=96, num_variates=7, dim=128, depth=2, num_heads=8,
                                     patch_size=4, dropout=0.1, head="flatten"), 32),
    "weather": ("hot_forecaster", dict(seq_len=96, pred_len=96, num_variates=21, dim=128, depth=2, num_heads=8,
                                       patch_size=4, dropout=0.1, head="flatten"), 32),
    "adrenal": ("hot_volume_classifier", dict(in_channels=1, input_size=28, num_classes=2, dim=128, depth=6,
                                              num_heads=8, patch_size=4, dropout=0.1), 32),
}


class PaperAttention(torch.nn.Module):
    """The paper-equation layer with the block's calling convention (``attn(x, masks=None)``)."""

    def __init__(self, dim: int, heads: int, num_modes: int, combine: str) -> None:
        super().__init__()
        self.inner = attention_bench.PaperKronecker(dim, heads, num_modes, combine)

    def _entry(self, x, masks):
        """What :class:`~hoformer.layers.Encoder` asks its first block's attention for: the checked masks (this
        layer takes none)."""
        return None

    def forward(self, x, masks=None):
        return self.inner(x)


def paper_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose Kronecker attention layers are the paper-equation layer."""
    from hoformer.layers import KroneckerAttention

    model = copy.deepcopy(model)
    swapped = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, KroneckerAttention):
                setattr(mod, name, PaperAttention(child.dim, child.heads, child.num_modes, child.combine))
                swapped += 1
    if not swapped:
        raise ValueError("paper_model: the model has no KroneckerAttention layer to replace")
    return model


def _loss(out: torch.Tensor) -> torch.Tensor:
    if out.ndim == 2:  # classifier logits
        return F.cross_entropy(out.float(), torch.zeros(out.shape[0], dtype=torch.long, device=out.device))
    return out.float().pow(2).mean()


def make_step(model, args, kwargs, device, precision):
    opt = configure_optimization(Optimization(lr=2e-4, weight_decay=0.1, schedule="constant"), model, 1)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = _loss(model(*args, **kwargs))
        loss.backward()
        opt.step()

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=("32", "bf16"), default="32")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--modes", nargs="*", default=["default"],
                   help="torch.compile modes to time (e.g. default reduce-overhead max-autotune-no-cudagraphs); "
                        "none: eager only")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--batch", type=int, help="batch size (default: the paper's 32)")
    ledger.add_ledger_argument(p)
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    device = torch.device(a.device)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"threads {torch.get_num_threads()}, precision {a.precision}, reps {a.reps}, torch {torch.__version__}")
    print("| case | variant | hoformer ms/step | paper ms/step | hoformer / paper | hoformer MiB | paper MiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    entries = []
    for case in a.cases:
        name, kw, batch = CASES[case]
        batch = a.batch or batch
        torch.manual_seed(0)
        ours = create_model(name, **kw).to(device).train()
        paper = paper_model(ours).to(device).train()
        args, kwargs = ours.example_inputs(batch_size=batch)
        args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in args]
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        variants = {("eager", "hoformer"): ours, ("eager", "paper"): paper}
        for mode in a.modes:
            for who, m in (("hoformer", ours), ("paper", paper)):
                c = copy.deepcopy(m)
                c.compile(**CompileModel.compile_kwargs(device, fullgraph=True,
                                                        mode=None if mode == "default" else mode))
                variants[(f"compiled {mode}", who)] = c
        steps = {key: make_step(m, args, kwargs, device, a.precision) for key, m in variants.items()}
        peak = {}
        for key, step in steps.items():  # warm-up (compiles), then one step's peak memory
            for _ in range(3):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
                step()
                torch.cuda.synchronize()
                peak[key] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        best = attention_bench.interleaved_times(steps, device, a.reps, warmup=0)
        for variant in dict.fromkeys(k[0] for k in steps):
            o, q = best[(variant, "hoformer")], best[(variant, "paper")]
            mem = (f"{peak[(variant, 'hoformer')]:.0f} | {peak[(variant, 'paper')]:.0f}" if peak else "- | -")
            print(f"| {case} | {variant} | {o * 1e3:.1f} | {q * 1e3:.1f} | **{o / q:.2f}** | {mem} |", flush=True)
            m = {"hoformer_ms": round(o * 1e3, 2), "paper_ms": round(q * 1e3, 2), "hoformer/paper": round(o / q, 3),
                 "compiled/eager": round(o / best[("eager", "hoformer")], 3)}
            if peak:
                m |= {"hoformer_mib": round(peak[(variant, "hoformer")], 1), "paper_mib": round(peak[(variant, "paper")], 1)}
            prec = "bf16" if a.precision == "bf16" else "fp32"
            entries.append(dict(experiment=f"bench/train_step/{case}/{variant.replace(' ', '-')}"
                                           f"{ledger.device_suffix(str(device), prec)}", model=name,
                                split=f"training step, B={batch}, {prec}", metrics=m, case=case, variant=variant,
                                note=f"minimum of {a.reps} round-robin rounds; paper: the same model with the "
                                     "paper-equation attention layer, compiled the same way; peak memory of one step "
                                     "(CUDA only)"))
        eager = best[("eager", "hoformer")]
        for mode in a.modes:
            print(f"| {case} | compiled {mode} / eager (hoformer) | | | {best[(f'compiled {mode}', 'hoformer')] / eager:.2f} "
                  "| | |", flush=True)
    if a.ledger:
        ledger.append_benchmarks(entries, a.ledger, "train_step.py", sys.argv[1:] if argv is None else argv,
                                 device=str(device), threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
