"""Training-step time of the paper-size HOT models against the machine's matmul ceiling, and against the
paper-equation layer in the same model, each eager and compiled the same way, side by side in one process.

Run:  .venv/bin/python benchmarks/train_step.py [--device cuda] [--precision 32|bf16] [--reps 5]
                                                [--modes default ...] [--cases weather etth1 ...] [--no-paper]
                                                [--epochs 12] [--ledger [FILE]]

One training step = forward in train mode, MSE / cross-entropy loss, backward, optimiser step (the task's
``Optimization``: AdamW, fused on CUDA), at the sizes of the paper configs (``configs/hot/ltsf.yaml``: width 128,
2 blocks, 8 heads, patch 4, batch 32, on ETTh1's 7 and Weather's 21 variates, HOT product, HOT sum and the spatial
baseline (iTransformer: one token per variate); ``configs/hot/medmnist3d.yaml``: 6 blocks, 28^3 volumes, patch 4).

* **Ceiling** (every case, eager): the step's floating-point operations counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and attention products: what it counts), the
  step's GFLOP/s, the matmul ceiling measured in the same process right before (``benchmarks/attention.py``'s
  ``matmul_fn``: one 2048^3 fp32 product on the CPU; on a GPU 4096^3 products in fp32 and in bf16; with
  ``--precision bf16`` the bf16 product too, on a CPU as well, and the step is measured against it, and the float32
  step of the same model in the same rounds for the ``bf16/fp32`` step ratio) and their ratio;
  the step's counted operators alone (:func:`counted_ops_replay`: the same products at the same shapes, nothing
  else) and the **bound** they set: the fraction of the ceiling the step would reach if all its other work were
  free, i.e. what the model's own matmul shapes allow; the top operators' shares of self CPU time
  (``torch.profiler``, 3 steps: the first profiled pass without page faults, :func:`top_operators`); and the
  projected wall time of an early-stopped paper-size run (``--epochs`` epochs of the dataset's training steps at this
  step time; validation not included).
* **Paper layer** (``--no-paper`` skips it): "paper" is the same model with every attention replaced by
  ``PaperKronecker`` of ``benchmarks/attention.py`` (HOT eqs 5-9 as written: per-mode projections at full resolution,
  sum pooling, one einsum per mode). Compiled variants use the arguments of ``hoformer.train.CompileModel`` (one graph,
  Inductor) with each ``--modes`` entry. All variants are timed round-robin and the minimum over ``--reps`` rounds is
  kept, so a shared machine's load hits them alike; the table prints ms per step and the ratios hoformer / paper.
  Peak memory: the CUDA allocator's peak of one step on a GPU.
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
import timing


_LTSF = dict(seq_len=96, pred_len=96, dim=128, depth=2, num_heads=8, patch_size=4, dropout=0.1)
#: name -> (registered model, kwargs, batch size, training steps per epoch of the paper-size run: the training
#: windows of the dataset at 96 -> 96 (ETTh1 8449, Weather 36792) or the training volumes (AdrenalMNIST3D 1188) / 32)
CASES = {
    "weather": ("hot_forecaster", dict(_LTSF, num_variates=21), 32, 1150),
    "weather_sum": ("hot_forecaster", dict(_LTSF, num_variates=21, attention="kronecker_sum"), 32, 1150),
    "weather_spatial": ("hot_forecaster", dict(_LTSF, num_variates=21, attention="spatial", patch_size=96), 32, 1150),
    "etth1": ("hot_forecaster", dict(_LTSF, num_variates=7), 32, 265),
    "etth1_sum": ("hot_forecaster", dict(_LTSF, num_variates=7, attention="kronecker_sum"), 32, 265),
    "etth1_spatial": ("hot_forecaster", dict(_LTSF, num_variates=7, attention="spatial", patch_size=96), 32, 265),
    "adrenal": ("hot_volume_classifier", dict(in_channels=1, input_size=28, num_classes=2, dim=128, depth=6,
                                              num_heads=8, patch_size=4, dropout=0.1), 32, 38),
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


def count_flops(step) -> int:
    """Floating-point operations of one call of ``step`` (``FlopCounterMode``: what it counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


def counted_ops_replay(step):
    """The step's counted operators alone: ``(replay, flops)``, where ``replay()`` calls every operator that
    ``FlopCounterMode`` counts in one call of ``step`` (matmuls, convolutions, attention products) with the same
    arguments' sizes, strides and dtypes on fresh random tensors (one per distinct layout, reused), in the same order,
    and nothing else. Timed beside the step, it is what the step would take if all its other work (elementwise
    operators, copies, reductions, the optimiser, Python) were free: the bound that the matmul shapes of this model,
    not the 2048^3 product, put on the fraction of the ceiling."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import flop_registry

    calls, fresh = [], {}

    def like(t):
        if not isinstance(t, torch.Tensor):
            return t
        key = (tuple(t.shape), t.stride(), t.dtype, t.device)
        if key not in fresh:
            buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            fresh[key] = buf.normal_() if buf.is_floating_point() else buf.zero_()
        return fresh[key]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.overloadpacket in flop_registry:
                calls.append((func, tree_map(like, args), tree_map(like, kwargs)))
            return func(*args, **kwargs)

    with Record():
        step()

    def replay():
        with torch.no_grad():
            for func, args, kwargs in calls:
                func(*args, **kwargs)

    return replay, count_flops(replay)


def _minor_faults() -> int | None:
    """Minor page faults of this process so far (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # not Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def top_operators(step, n: int = 6, steps: int = 3, passes: int = 5) -> list[tuple[str, float]]:
    """The ``n`` operators with the largest share of self CPU time over ``steps`` calls (``torch.profiler``).

    The profiler's own event buffers take memory the steps had reused, so the first profiled passes page-fault on
    the step's large tensors (seen: 30,000 faults and twice the step time per step on a VM with slow faults, the cost
    landing on whichever operator touches a fresh block first); passes are repeated, up to ``passes``, until one runs
    with fewer than 10 page faults per step, and that one is reported."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(passes):
        before = _minor_faults()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        after = _minor_faults()
        if before is None or after - before < 10 * steps:
            break
    rows = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    rows.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, round(e.self_cpu_time_total / total, 4)) for e in rows[:n]]


def ceiling_case(case: str, step, device, a, batch: int, fp32_step=None) -> dict:
    """The ceiling measurement of one case (module doc): a ledger entry, and its table row printed. ``fp32_step``
    (bf16 runs): the float32 step of the same model, timed in the same rounds, for the ``bf16/fp32`` step ratio."""
    _, _, _, steps_per_epoch = CASES[case]
    flops = count_flops(step)
    ceilings = {"fp32": attention_bench.matmul_fn(device, torch.float32)}
    if device.type == "cuda" or a.precision == "bf16":  # a CPU's bf16 product: AMX where the CPU has it
        ceilings["bf16"] = attention_bench.matmul_fn(device, torch.bfloat16)
    replay, replay_flops = counted_ops_replay(step)
    fns = {"step": step, "counted ops": replay, **{f"mm {k}": v[0] for k, v in ceilings.items()},
           **({"fp32 step": fp32_step} if fp32_step is not None else {})}
    best = timing.interleaved_times(fns, device, a.reps, warmup=1)
    step_s, ops_s = best["step"], best["counted ops"]
    peak = {k: v[1] / best[f"mm {k}"] / 1e9 for k, v in ceilings.items()}
    ceiling = peak["bf16" if a.precision == "bf16" and "bf16" in peak else "fp32"]
    gflops = flops / step_s / 1e9
    ops = top_operators(step) if device.type == "cpu" else []
    run_h = step_s * steps_per_epoch * a.epochs / 3600
    bound = flops / ops_s / 1e9 / ceiling  # the fraction of the ceiling if everything but the counted ops were free
    print(f"| {case} | {step_s * 1e3:.1f} | {flops / 1e9:.2f} | {gflops:.1f} | {ceiling:.1f} | **{gflops / ceiling:.0%}** | "
          f"{ops_s * 1e3:.1f} | {bound:.0%} | {run_h:.2f} | " + ", ".join(f"{k} {v:.0%}" for k, v in ops) + " |",
          flush=True)
    m = {"step_ms": round(step_s * 1e3, 2), "gflop": round(flops / 1e9, 3), "gflops": round(gflops, 2),
         **{f"ceiling_gflops_{k}": round(v, 2) for k, v in peak.items()}, "fraction_of_ceiling": round(gflops / ceiling, 4),
         "counted_ops_ms": round(ops_s * 1e3, 2), "counted_ops_flop_ratio": round(replay_flops / flops, 4),
         "bound_fraction": round(bound, 4),
         "steps_per_epoch": steps_per_epoch, "projected_run_h": round(run_h, 3)}
    if fp32_step is not None:
        m |= {"fp32_step_ms": round(best["fp32 step"] * 1e3, 2), "bf16/fp32": round(step_s / best["fp32 step"], 3)}
        print(f"| {case} | bf16 step / fp32 step of the same model, same rounds: **{m['bf16/fp32']:.2f}** "
              f"({m['fp32_step_ms']:.1f} ms in fp32) |", flush=True)
    prec = "bf16" if a.precision == "bf16" else "fp32"
    return dict(experiment=f"bench/train_step/{case}/ceiling{ledger.device_suffix(str(device), prec)}",
                model=CASES[case][0], split=f"training step, B={batch}, {prec}", metrics=m, case=case,
                top_ops=[list(o) for o in ops], projected_epochs=a.epochs,
                note=f"minimum of {a.reps} round-robin rounds of the step and of the matmul ceiling "
                     f"({ceilings['fp32'][2]} fp32{' and bf16' if 'bf16' in peak else ''}), measured in the same "
                     "process; FLOPs counted by torch.utils.flop_counter.FlopCounterMode; counted_ops_ms: the step's "
                     "counted operators alone, replayed with the same layouts on fresh tensors (bound_fraction: the "
                     "step's fraction of the ceiling if all else were free); top_ops: shares of self "
                     "CPU time over 3 steps (torch.profiler; the first pass that runs without page faults, up to 5); "
                     f"projected run: {a.epochs} epochs x {steps_per_epoch} "
                     "steps, validation not included")


def paper_cases(case: str, ours, args, kwargs, device, a, batch: int) -> list[dict]:
    """hoformer against the paper-equation layer, eager and compiled (module doc): ledger entries, rows printed."""
    name = CASES[case][0]
    paper = paper_model(ours).to(device).train()
    variants = {("eager", "hoformer"): ours, ("eager", "paper"): paper}
    for mode in a.modes:
        for who, m in (("hoformer", ours), ("paper", paper)):
            c = copy.deepcopy(m)
            c.compile(**CompileModel.compile_kwargs(device, fullgraph=True, mode=None if mode == "default" else mode))
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
    best = timing.interleaved_times(steps, device, a.reps, warmup=0)
    entries = []
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
    return entries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=("32", "bf16"), default="32")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--modes", nargs="*", default=["default"],
                   help="torch.compile modes of the paper-layer comparison (e.g. default reduce-overhead "
                        "max-autotune-no-cudagraphs); none: eager only")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--batch", type=int, help="batch size (default: the paper's 32)")
    p.add_argument("--epochs", type=int, default=12,
                   help="epochs of the projected early-stopped run (default 12: patience 10 after a best epoch "
                        "of about 1, as the paper-size ETTh1 runs stopped)")
    p.add_argument("--no-paper", action="store_true", help="skip the comparison with the paper-equation layer")
    ledger.add_ledger_argument(p)
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    if a.epochs < 1:
        p.error(f"--epochs must be >= 1, got {a.epochs}")
    device = torch.device(a.device)
    from hoformer.train.allocator import keep_large_allocations

    heap = keep_large_allocations()  # what `hoformer fit` does (HOFORMER_SYSTEM_MALLOC=1: the allocator as it is)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"threads {torch.get_num_threads()}, precision {a.precision}, reps {a.reps}, torch {torch.__version__}, "
          f"large blocks {'kept on the heap' if heap else 'from the system allocator'}")
    print("\n| case | ms/step | GFLOP | GFLOP/s | matmul GFLOP/s | of the ceiling | counted ops alone (ms) | "
          "bound | projected run (h) | top operators |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    entries, models = [], {}
    for case in a.cases:
        name, kw, batch, _ = CASES[case]
        batch = a.batch or batch
        torch.manual_seed(0)
        ours = create_model(name, **kw).to(device).train()
        args, kwargs = ours.example_inputs(batch_size=batch)
        args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in args]
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        models[case] = (ours, args, kwargs, batch)
        fp32_step = (make_step(copy.deepcopy(ours), args, kwargs, device, "32") if a.precision == "bf16" else None)
        entries.append(ceiling_case(case, make_step(ours, args, kwargs, device, a.precision), device, a, batch,
                                    fp32_step))
    paper = [c for c in a.cases if not a.no_paper and CASES[c][1].get("attention", "kronecker_product")
             .startswith("kronecker")]
    if paper:
        print("\n| case | variant | hoformer ms/step | paper ms/step | hoformer / paper | hoformer MiB | paper MiB |")
        print("|---|---|---:|---:|---:|---:|---:|")
    for case in paper:
        ours, args, kwargs, batch = models[case]
        entries += paper_cases(case, ours, args, kwargs, device, a, batch)
    if a.ledger:
        ledger.append_benchmarks(entries, a.ledger, "train_step.py", sys.argv[1:] if argv is None else argv,
                                 device=str(device), threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
