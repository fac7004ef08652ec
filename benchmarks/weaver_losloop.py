"""Los-loop seed sweep: Weaver (T / NT, Tanimoto / SDPA / cosine) vs the traffic baselines, without the CLI.

Protocol: :class:`hoformer.data.TrafficDataModule` (12 -> 12, 70/10/20, masked scaler), Adam (``--lr``) with
exponential decay 0.9 per epoch (paper section 6.1), batch ``--batch-size``, ``--epochs`` epochs, the epoch with the best
validation MAE is tested (masked MAE / MAPE / RMSE at steps 3 / 6 / 12 and over all steps).
Every finished run is appended to ``--out`` (JSON lines), so an interrupted sweep keeps its results;
``--summary`` prints the mean +- std table (markdown). ``--ledger [FILE]`` also appends one results-ledger line per
run and seed (default ``results/ledger.jsonl``), from which the docs' Los-loop tables are generated.

    nice python benchmarks/weaver_losloop.py --epochs 4 --dim 32 --seeds 0 1 2 --out runs/losloop.jsonl
    python benchmarks/weaver_losloop.py --summary runs/losloop.jsonl
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hoformer.data.traffic import TrafficDataModule
from hoformer.models import create_model
from hoformer.train.metrics import forecasting_metrics, masked_mae
from hoformer.train.traffic import forecast, original_scale

import ledger  # benchmarks/ledger.py: a script's own folder is first on sys.path

VARIANTS = {
    "weaver_T": ("weaver", {"use_time": True}),
    "weaver_NT": ("weaver", {"use_time": False}),
    "weaver_T_sdpa": ("weaver", {"use_time": True, "kernel": "sdpa"}),
    "weaver_T_cosine": ("weaver", {"use_time": True, "kernel": "cosine"}),
    "weaver_NT_sdpa": ("weaver", {"use_time": False, "kernel": "sdpa"}),
    "weaver_NT_cosine": ("weaver", {"use_time": False, "kernel": "cosine"}),
    "full_attention": ("traffic_full_attention", {}),
    "alternating": ("traffic_alternating", {}),
    "hot": ("traffic_hot", {}),
    "last_value": ("last_value", {}),
    "historical_average": ("historical_average", {}),
}


@torch.no_grad()
def evaluate(model, loader) -> dict[str, float]:
    model.eval()
    metrics = forecasting_metrics((3, 6, 12))
    for b in loader:
        metrics.update(forecast(model, b), original_scale(b["y"], b), b["y_mask"])
    return {k: float(v) for k, v in metrics.compute().items()}


def run(variant: str, seed: int, epochs: int, dim: int, heads: int, baseline_heads: int, layers: int,
        dm: TrafficDataModule, lr: float = 1e-3) -> dict:
    name, kw = VARIANTS[variant]
    torch.manual_seed(seed)
    kw = dict(kw, num_nodes=dm.num_nodes)
    if name not in ("last_value", "historical_average"):
        kw.update(dim=dim, num_heads=heads if name == "weaver" else baseline_heads)
        if name != "weaver":
            kw.update(num_layers=layers)
    model = create_model(name, **kw)
    n_params = sum(p.numel() for p in model.parameters())
    t0, best, best_state, best_epoch, steps = time.time(), float("inf"), None, 0, 0
    if n_params:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        g = torch.Generator().manual_seed(seed)
        for epoch in range(1, epochs + 1):
            model.train()
            loader = torch.utils.data.DataLoader(dm.splits["train"], batch_size=dm.batch_size, shuffle=True,
                                                 generator=g)
            for b in loader:
                loss = masked_mae(forecast(model, b), original_scale(b["y"], b), b["y_mask"])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
            sched.step()
            val = evaluate(model, dm.val_dataloader())["mae"]
            print(f"  {variant} seed {seed} epoch {epoch}: val MAE {val:.4f} ({time.time() - t0:.0f}s)", flush=True)
            if val < best:
                best, best_epoch, best_state = val, epoch, copy.deepcopy(model.state_dict())
        model.load_state_dict(best_state)
    test = evaluate(model, dm.test_dataloader())
    return {"variant": variant, "model": name, "kwargs": kw, "seed": seed, "epochs": epochs, "lr": lr,
            "batch_size": dm.batch_size, "best_epoch": best_epoch,
            "val_mae": best if n_params else evaluate(model, dm.val_dataloader())["mae"], "params": n_params,
            "steps": steps, "train_seconds": round(time.time() - t0, 1), "test": test}


#: the ledger's metric names of a run's test metrics (steps 3 / 6 / 12 of 5 minutes, and over all steps)
LEDGER_METRICS = {"mae@3": "test/mae@15m", "mae@6": "test/mae@30m", "mae@12": "test/mae@60m", "mae": "test/mae",
                  "mape": "test/mape", "rmse": "test/rmse"}


def ledger_line(r: dict, command: str, threads: int) -> dict:
    """The results-ledger line of one finished run ``r`` (what :func:`run` returns)."""
    return {"experiment": f"weaver/los_loop_cpu/{r['variant']}", "task": "traffic", "dataset": "los_loop",
            "model": r["variant"], "scale": "cpu", "lookback": 12, "horizon": 12, "split": "test",
            "metrics": {LEDGER_METRICS[k]: round(v, 4) for k, v in r["test"].items() if k in LEDGER_METRICS},
            "best_val": {"val/mae": round(r["val_mae"], 4)}, "params": r["params"], "seed": r["seed"],
            "epochs": r["epochs"], "best_epoch": r["best_epoch"] - 1 if r["params"] else None,
            "stopping": {"max_epochs": r["epochs"]}, "wall_s": r["train_seconds"],
            **ledger.provenance("cpu", threads, command)}


def summary(path: str) -> str:
    rows: dict[str, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["variant"], []).append(r)
    keys = [("mae@3", "MAE 15m"), ("mae@6", "MAE 30m"), ("mae@12", "MAE 60m"), ("mae", "MAE all"),
            ("mape", "MAPE all %"), ("rmse", "RMSE all")]
    out = ["| variant | seeds | params | " + " | ".join(k[1] for k in keys) + " | s/run |",
           "|---" * (len(keys) + 4) + "|"]
    for v, rs in rows.items():
        cells = []
        for k, _ in keys:
            xs = [r["test"][k] for r in rs]
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{statistics.mean(xs):.3f} ± {sd:.3f}")
        secs = statistics.mean(r["train_seconds"] for r in rs)
        out.append(f"| {v} | {len(rs)} | {rs[0]['params']} | " + " | ".join(cells) + f" | {secs:.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8, help="Weaver heads")
    ap.add_argument("--baseline-heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="attention layers of the transformer baselines")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--root", default=None, help="traffic data dir (default $HOFORMER_DATA/traffic)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/weaver_losloop.jsonl")
    ap.add_argument("--summary", default=None, help="print the table of a results file and exit")
    ledger.add_ledger_argument(ap)
    a = ap.parse_args()
    if a.summary:
        print(summary(a.summary))
        return
    torch.set_num_threads(a.threads)
    dm = TrafficDataModule("los_loop", root=a.root, batch_size=a.batch_size, eval_batch_size=64)
    dm.setup()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:
        for v in a.variants:
            r = run(v, seed, a.epochs, a.dim, a.heads, a.baseline_heads, a.layers, dm, a.lr)
            print(json.dumps({k: r[k] for k in ("variant", "seed", "best_epoch", "train_seconds")}), r["test"]["mae"],
                  flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
            if a.ledger:
                command = ledger.benchmark_command("weaver_losloop.py", sys.argv[1:], a.ledger, local=("--out",))
                ledger.append_ledger(ledger_line(r, command, a.threads), Path(a.ledger))


if __name__ == "__main__":
    main()
