"""Weaver benchmarks (paper 003, section 3.1 / Table 4 / appendix F.3).

1. P^2-KMV message passing ``(Theta_T (x) Theta_S) vec(U)`` via :func:`hoformer.functional.p2_kmv` (= ``kron_apply``)
   vs a dense ``PN x PN`` Kronecker attention map (``kron_dense``) applied by one matmul, at N=207, P=12, E=128,
   H=8, B=32: time (forming + applying the dense map, and applying only) and peak memory, measured in the same run.
   Each measurement runs in a fresh subprocess; peak memory is the process's peak RSS growth on CPU
   (``VmHWM``, with ``MALLOC_MMAP_THRESHOLD_`` so freed tensors leave the RSS) or
   ``torch.cuda.max_memory_allocated`` on CUDA. To fit a shared machine the dense map can be
   built for ``--dense-chunk`` batch elements at a time (time is summed over the chunks; its memory is that of
   one chunk, i.e. a *lower* bound of the dense cost at batch B; the full size is printed too).
2. Forward+backward time of one training step (batch B, masked-MAE loss) of Weaver (Table 3 defaults) vs the
   full spatiotemporal attention baseline (one layer over the P*N tokens, same E and H).

    nice python benchmarks/weaver.py --threads 1

``--ledger [FILE]``: append the measurements to the results ledger (default ``results/ledger.jsonl``), named
``bench/weaver/p2_kmv/{kmv,dense}`` and ``bench/weaver/step/MODEL``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys

import torch

import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path
import timing


def _kmv_job(args) -> dict:
    method, b, p, n, e, h, chunk, reps, threads, device = args
    torch.set_num_threads(threads)
    from hoformer.functional import kron_dense
    from hoformer.functional.weaver import p2_kmv

    g = torch.Generator().manual_seed(0)
    d = e // h
    tt = torch.randn(b, h, p, p, generator=g).to(device)
    ts = torch.randn(b, h, n, n, generator=g).to(device)
    u = torch.randn(b, h, p, n, d, generator=g).to(device)
    cuda = device.startswith("cuda")

    def run():
        if method == "kmv":
            return p2_kmv(tt, ts, u), 0.0
        outs, t_apply = [], 0.0
        for s in range(0, b, chunk):
            big = [kron_dense([tt[s:s + chunk], ts[s:s + chunk]])]  # (c, h, PN, PN), freed after its chunk
            t_apply += timing.time_call(lambda: big.append(big[0] @ u[s:s + chunk].reshape(big[0].shape[0], h, p * n,
                                                                                            d)), device)
            outs.append(big.pop().view(-1, h, p, n, d))
        return torch.cat(outs), t_apply

    out, _ = run()  # warm-up
    ref = p2_kmv(tt[:1], ts[:1], u[:1])
    err = float((out[:1] - ref).abs().max())
    del out
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = timing.reset_peak_rss()
    times, applies = [], []
    for _ in range(reps):
        result = []
        times.append(timing.time_call(lambda: result.append(run()), device))
        applies.append(result.pop()[1])
    peak = (torch.cuda.max_memory_allocated() if cuda else timing.proc_status_bytes("VmHWM:")) - base
    return {"method": method, "seconds": min(times), "apply_seconds": min(applies), "peak_bytes": peak,
            "max_abs_err_vs_kmv": err}


def _step_job(args) -> dict:
    name, kw, b, reps, threads, device = args
    torch.set_num_threads(threads)
    from hoformer.models import create_model
    from hoformer.train.metrics import masked_mae

    model = create_model(name, **kw).to(device)
    (x,), kwargs = model.example_inputs(b)
    x, kwargs = x.to(device), {k: v.to(device) for k, v in kwargs.items()}
    y = torch.randn_like(x)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    def step():
        loss = masked_mae(model(x, **kwargs), y, kwargs["mask"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up
    times = [timing.time_call(step, device) for _ in range(reps)]
    return {"model": name, "kwargs": kw, "params": sum(p.numel() for p in model.parameters()),
            "step_seconds": min(times)}


def ledger_entries(a: argparse.Namespace, kmv: dict, dense: dict, steps: list[dict]) -> list[dict]:
    """The ledger entries of one run: P^2-KMV and the dense map (``_kmv_job``'s results), and the training steps
    (``_step_job``'s; none with ``--skip-steps``). Ratios are the tables' to compute."""
    suffix = ledger.device_suffix(a.device)
    split = f"B={a.batch}, H={a.heads}, P={a.window}, N={a.nodes}, E={a.dim}, fp32"
    note = f"best of {a.reps}, fresh subprocess; peak: resident-set growth (CPU) or the CUDA allocator's peak"
    out = [dict(experiment=f"bench/weaver/p2_kmv/kmv{suffix}", model="p2_kmv", split=split, note=note,
                metrics={"ms": round(kmv["seconds"] * 1e3, 2), "peak_mib": round(kmv["peak_bytes"] / 2**20, 1)}),
           dict(experiment=f"bench/weaver/p2_kmv/dense{suffix}", model="kron_dense", split=split,
                dense_chunk=a.dense_chunk, note=note + "; dense: formed for dense_chunk batch elements at a time (time "
                "summed over the chunks, peak memory of one chunk: a lower bound)",
                metrics={"ms": round(dense["seconds"] * 1e3, 2), "apply_ms": round(dense["apply_seconds"] * 1e3, 2),
                         "peak_mib": round(dense["peak_bytes"] / 2**20, 1),
                         "max_abs_err": dense["max_abs_err_vs_kmv"]})]
    for s in steps:
        out.append(dict(experiment=f"bench/weaver/step/{s['model']}{suffix}", model=s["model"], params=s["params"],
                        split=f"training step, B={a.step_batch or a.batch}, masked MAE, Adam, fp32",
                        metrics={"step_s": round(s["step_seconds"], 4)},
                        note=f"best of {a.reps} steps after a warm-up step, fresh subprocess"))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=207)
    ap.add_argument("--window", type=int, default=12)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dense-chunk", type=int, default=8, help="batch elements per dense PN x PN map")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--step-batch", type=int, default=None, help="batch of the training-step timing (default --batch)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip-steps", action="store_true")
    ledger.add_ledger_argument(ap)
    a = ap.parse_args(argv)
    b, p, n, e, h = a.batch, a.window, a.nodes, a.dim, a.heads
    # Large CPU allocations are then mmap-ed and returned to the OS on free, so the subprocess's peak RSS
    # growth tracks the peak of live tensors (glibc otherwise keeps freed blocks resident).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    ctx = mp.get_context("spawn")
    res = {}
    for method in ("kmv", "dense"):
        with ctx.Pool(1) as pool:
            res[method] = pool.apply(_kmv_job, ((method, b, p, n, e, h, a.dense_chunk, a.reps, a.threads, a.device),))
        print(json.dumps(res[method]), flush=True)
    full_dense = b * h * (p * n) ** 2 * 4
    kmv, dense = res["kmv"], res["dense"]
    print(f"\nP^2-KMV vs dense Theta_T (x) Theta_S at B={b} H={h} P={p} N={n} E={e} ({a.device}, {a.threads} thread(s))")
    print(f"  time  P^2-KMV {kmv['seconds'] * 1e3:.1f} ms | dense form+apply {dense['seconds'] * 1e3:.1f} ms "
          f"(x{dense['seconds'] / kmv['seconds']:.0f}) | dense apply only {dense['apply_seconds'] * 1e3:.1f} ms "
          f"(x{dense['apply_seconds'] / kmv['seconds']:.0f})")
    print(f"  peak memory  P^2-KMV {kmv['peak_bytes'] / 2**20:.1f} MiB | dense (chunk {a.dense_chunk}) "
          f"{dense['peak_bytes'] / 2**20:.1f} MiB (x{dense['peak_bytes'] / max(kmv['peak_bytes'], 1):.0f}); "
          f"a full-batch dense map alone is {full_dense / 2**30:.2f} GiB "
          f"(x{full_dense / max(kmv['peak_bytes'], 1):.0f})")
    print(f"  max |dense - KMV| = {dense['max_abs_err_vs_kmv']:.2e}")
    steps = []
    if not a.skip_steps:
        steps = _steps(a, ctx)
    if a.ledger:
        ledger.append_benchmarks(ledger_entries(a, kmv, dense, steps), a.ledger, "weaver.py",
                                    sys.argv[1:] if argv is None else argv, device=a.device, threads=a.threads)


def _steps(a: argparse.Namespace, ctx) -> list[dict]:
    """One training step of Weaver and of the full-attention baseline, each in a fresh subprocess."""
    b, p, n, e, h = a.batch, a.window, a.nodes, a.dim, a.heads
    sb = a.step_batch or b
    common = dict(num_nodes=n, window=p, horizon=p, dim=e, num_heads=h)
    steps = []
    for name, kw in (("weaver", common), ("traffic_full_attention", dict(common, num_layers=1))):
        with ctx.Pool(1) as pool:
            steps.append(pool.apply(_step_job, ((name, kw, sb, a.reps, a.threads, a.device),)))
        print(json.dumps(steps[-1]), flush=True)
    print(f"\nTraining step (forward+backward+Adam), batch {sb}: Weaver {steps[0]['step_seconds']:.2f} s "
          f"({steps[0]['params']} params) | full ST attention {steps[1]['step_seconds']:.2f} s "
          f"({steps[1]['params']} params) -> x{steps[1]['step_seconds'] / steps[0]['step_seconds']:.1f}")
    return steps


if __name__ == "__main__":
    main()
