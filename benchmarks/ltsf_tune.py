"""Validation-selected hyper-parameter variants of a CPU-budget forecasting config (docs/results_hot.md,
"ETTh1: seed spread and validation-selected tuning of HOT product").

Writes one config per variant x horizon under ``runs/tune/<dataset>_<model>/<variant>/`` (derived from the committed
experiment ``hot/ltsf_cpu/<dataset>_96_<h>_<model>`` of ``benchmarks/paper_configs.py``: only the keys named by the
variant change, the run directory
moves under the variant) and runs them with ``benchmarks/ltsf_sweep.py`` (one JSONL per variant). ``--summary``
prints, per variant, the average over the four horizons of the *validation* MSE / MAE of the tested checkpoint (what
the variant is selected on) next to the test metrics.

Run:  .venv/bin/python benchmarks/ltsf_tune.py --variants reg patch16 --dataset etth1 --model hot_product
      .venv/bin/python benchmarks/ltsf_tune.py --import-grid runs/ltsf_cpu.jsonl --summary --dataset etth1
      .venv/bin/python benchmarks/ltsf_tune.py --same-windows ema ema_joint --dataset etth1   # one set of windows

``--same-windows`` scores the finished runs of the named variants (their exported best weights) on the test windows
of the longest horizon only, which every horizon's test set begins with (the same forecast origins): a direct model
of horizon ``h`` on its ``h`` steps, a joint-horizon model on each prefix.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
HORIZONS = (96, 192, 336, 720)
# seed -> variant suffix ("grid" runs seed 2024); 2027 / 2028 complete the HOT paper's five seeds (Tables 9 / 10)
SEEDS = {2024: "", 2025: "_seed2025", 2026: "_seed2026", 2027: "_seed2027", 2028: "_seed2028"}
MODEL, TASK = "--model.model.init_args", "--model.init_args"


def _set(key: str, value) -> str:
    """A ``--key=value`` override (non-strings as JSON, which the CLI reads as YAML)."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def _seed(seed: int | None) -> list[str]:
    return [_set("--seed_everything", seed)] if seed else []


def _ema(decay: float) -> list[str]:
    """Lightning's EMAWeightAveraging added to the config's callbacks."""
    return ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", _set("--trainer.callbacks.decay", decay)]


def _official() -> list[str]:
    """The model arguments of the ``hot_forecaster_official`` preset, as model overrides."""
    from hoformer.models.registry import model_entry

    return [_set(f"{MODEL}.{k}", v) for k, v in model_entry("hot_forecaster_official").preset.items()]


REG = [_set(f"{MODEL}.dropout", 0.3), _set(f"{TASK}.optim.weight_decay", 0.5)]
JOINT = [_set(f"{TASK}.horizons", list(HORIZONS))]
# variant -> hoformer fit overrides applied on top of the committed experiment (its own overrides first)
VARIANTS = {
    "grid": [],  # the committed CPU-budget config (dropout 0.2, weight decay 0.1, width 64, patch 8, lr 1e-3)
    "reg": REG,  # the paper grid's strongest regularisation
    "patch16": [*REG, _set(f"{MODEL}.patch_size", 16)],
    "small": [*REG, _set(f"{MODEL}.dim", 32)],
    "lr3e-4": [*REG, _set(f"{TASK}.optim.lr", 3e-4)],
    "depth1": [*REG, _set(f"{MODEL}.depth", 1)],
    "rerun": [],  # the committed config run again (same seed), in its own directory
    # the committed config run to its own end (10 epochs or early stopping) instead of a wall-time cap: pass a
    # --max-time the run cannot reach; the cosine schedule then decays fully (Weather, docs/results_hot.md)
    "uncapped": [],
    # seed-to-seed spread of the committed config (seed 2024 = "grid")
    "seed2025": _seed(2025),
    "seed2026": _seed(2026),
    # exponential moving average of the weights (Lightning's EMAWeightAveraging: validation, the best checkpoint and
    # the test use the averaged weights); decay 0.99 = a horizon of ~100 steps, under half an ETTh1 epoch (267 steps)
    # since the best epoch there is 0-2
    **{f"ema{dtag}{sfx}": [*_ema(decay), *_seed(seed if sfx else None)]
       for decay, dtag in ((0.99, ""), (0.998, "998"))
       for seed, sfx in SEEDS.items()},
    # q/k biases added before the sum-pooling, as the reference HOT implementation does (ETTh1 96 -> 96: --horizons 96)
    **{f"ema_qkbias{sfx}": [*_ema(0.99), _set(f"{MODEL}.qk_bias", True), *_seed(seed if sfx else None)]
       for seed, sfx in SEEDS.items()},
    # joint-horizon training (the reference HOT protocol): one 720-step model on the average of the 96 / 192 / 336 /
    # 720 prefix losses, tested on each prefix (test/mse@96, ...); run with --horizons 720
    "ema_joint": [*_ema(0.99), *JOINT],
    # the same with the reference implementation's forecaster (the hot_forecaster_official preset)
    "ema_official": [*_ema(0.99), *JOINT, *_official()],
}


def variant_runs(dataset: str, model: str, variant: str) -> list[tuple[str, list[str]]]:
    """``(run directory, hoformer fit arguments)`` per horizon: the paper_configs.py experiment
    ``hot/ltsf_cpu/<dataset>_96_<h>_<model>`` with the variant's overrides on top and its run directory under
    ``runs/tune/``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from paper_configs import experiments

    out = []
    for h in HORIZONS:
        run = f"runs/tune/{dataset}_{model}/{variant}/{dataset}_96_{h}"
        args = [a for a in experiments()[f"hot/ltsf_cpu/{dataset}_96_{h}_{model}"]
                if not a.startswith("--trainer.default_root_dir")]
        out.append((run, [*args, *VARIANTS[variant], f"--trainer.default_root_dir={run}"]))
    return out


def import_grid(dataset: str, model: str, records: Path) -> Path:
    """The ``grid`` variant = the committed configs' own runs: copy their lines of ``records`` (the grid sweep's
    JSONL) with the validation metrics of the tested epoch read back from their CSV logs."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ltsf_sweep import _best_val

    rows = []
    for line in records.read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if r and r["config"] in {f"hot/ltsf_cpu/{dataset}_96_{h}_{model}" for h in HORIZONS}:
            rows.append({**r, **_best_val(ROOT / "runs" / r["config"])})
    out = ROOT / f"runs/tune/{dataset}_{model}/grid.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


METRICS = ("val/mse", "val/mae", "test/mse", "test/mae")


def _averages(dataset: str, model: str, variant: str) -> tuple[dict | None, dict]:
    """Four-horizon averages of METRICS for a finished variant (``None`` if not all horizons ran) and its rows."""
    path = ROOT / f"runs/tune/{dataset}_{model}/{variant}.jsonl"
    if not path.exists():
        return None, {}
    rows = {r["pred_len"]: r for r in map(json.loads, filter(str.strip, path.read_text().splitlines()))}
    if sorted(rows) != list(HORIZONS):
        return None, rows
    return {k: sum(rows[h][k] for h in HORIZONS) / 4 for k in METRICS}, rows


def summary(dataset: str, model: str) -> str:
    lines = ["| variant | overrides | val MSE / MAE (avg) | test MSE / MAE (avg) | test MSE per horizon |",
             "|---|---|---|---|---|"]
    for variant in VARIANTS:
        avg, rows = _averages(dataset, model, variant)
        if avg is None:
            if rows:
                lines.append(f"| {variant} | {' '.join(VARIANTS[variant])} | (horizons done: {sorted(rows)}) | | |")
            continue
        per = " ".join(f"{rows[h]['test/mse']:.3f}" for h in HORIZONS)
        lines.append(f"| {variant} | {' '.join(VARIANTS[variant]) or '(committed config)'} | {avg['val/mse']:.4f} / "
                     f"{avg['val/mae']:.4f} | {avg['test/mse']:.3f} / {avg['test/mae']:.3f} | {per} |")
    # variants run with several seeds: mean +- std over seeds of the four-horizon averages, over the first three
    # seeds (2024-2026, the earlier tables) and over all five where they ran
    seeded = []
    for base in [v for v in VARIANTS if v + "_seed2025" in VARIANTS or v == "grid"]:
        names = ["grid", "seed2025", "seed2026"] if base == "grid" else [base + sfx for sfx in SEEDS.values()]
        avgs = [_averages(dataset, model, n)[0] for n in names]
        for n in (3, 5):
            if len(avgs) < n or not all(avgs[:n]):
                continue
            sel = avgs[:n]
            ms = {k: (statistics.mean(a[k] for a in sel), statistics.stdev(a[k] for a in sel)) for k in METRICS}
            per_seed = " / ".join(f"{a['test/mse']:.3f}" for a in sel)
            seeded.append(f"| {base} | {n} | {per_seed} | {ms['val/mse'][0]:.4f} | "
                          f"**{ms['test/mse'][0]:.4f} ± {ms['test/mse'][1]:.4f}** / "
                          f"{ms['test/mae'][0]:.4f} ± {ms['test/mae'][1]:.4f} |")
    if seeded:
        lines += ["", "| variant | seeds (from 2024) | avg test MSE per seed | val MSE (mean) | "
                      "test MSE / MAE (mean ± std) |", "|---|---|---|---|---|", *seeded]
    return "\n".join(lines)


def same_windows(dataset: str, model: str, variants: list[str]) -> str:
    """Test MSE / MAE of every finished run of ``variants`` on the test windows of horizon ``max(HORIZONS)`` (the
    first windows of each horizon's test set), per horizon: a markdown table."""
    import torch

    from hoformer.data import LTSFDataModule
    from hoformer.models import from_pretrained

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from paper_configs import LTSF

    name, lookback, _ = LTSF[dataset]
    windows = len(LTSFDataModule(name=name, seq_len=lookback, pred_len=max(HORIZONS)).dataset("test"))
    lines = [f"| variant | horizon | test MSE / MAE on the first {windows} test windows |", "|---|---|---|"]
    for variant in variants:
        path = ROOT / f"runs/tune/{dataset}_{model}/{variant}.jsonl"
        for r in map(json.loads, filter(str.strip, path.read_text().splitlines())):
            run = Path(r["config"])  # the run directory (earlier records: its config.yaml)
            net = from_pretrained(ROOT / (run.parent if run.suffix == ".yaml" else run) / "pretrained").eval()
            ds = LTSFDataModule(name=name, seq_len=lookback, pred_len=r["pred_len"]).dataset("test")
            with torch.no_grad():
                err = torch.cat([net(torch.stack([ds[i]["x"] for i in range(a, min(a + 256, windows))]))
                                 - torch.stack([ds[i]["y"] for i in range(a, min(a + 256, windows))])
                                 for a in range(0, windows, 256)]).double()
            for h in [h for h in HORIZONS if h <= r["pred_len"]] if r.get("test/mse@96") else [r["pred_len"]]:
                lines.append(f"| {variant} | {h} | {err[:, :h].square().mean():.4f} / {err[:, :h].abs().mean():.4f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="etth1")
    ap.add_argument("--model", default="hot_product")
    ap.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS))
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--import-grid", type=Path, metavar="JSONL",
                    help="record the committed configs' runs from this ltsf_sweep JSONL as variant 'grid'")
    ap.add_argument("--max-time", default="00:00:30:00")
    ap.add_argument("--horizons", nargs="*", type=int, default=list(HORIZONS), choices=HORIZONS,
                    help="run only these horizons (e.g. two processes on disjoint horizons share the variant's JSONL)")
    ap.add_argument("--same-windows", nargs="+", metavar="VARIANT", choices=sorted(VARIANTS),
                    help="score these variants' finished runs on the longest horizon's test windows and exit")
    args = ap.parse_args()
    if args.same_windows:
        print(same_windows(args.dataset, args.model, args.same_windows))
        return
    if args.import_grid:
        print(f"wrote {import_grid(args.dataset, args.model, args.import_grid)}")
    if args.summary:
        print(summary(args.dataset, args.model))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ltsf_sweep import run_one

    sweep = argparse.Namespace(threads=1, max_time=args.max_time, max_epochs=0)
    for variant in args.variants:  # runs already in the variant's JSONL are skipped: delete it to re-run
        out = ROOT / f"runs/tune/{args.dataset}_{args.model}/{variant}.jsonl"
        done = {json.loads(line)["config"] for line in out.read_text().splitlines() if line.strip()} \
            if out.exists() else set()
        for (run, exp), h in zip(variant_runs(args.dataset, args.model, variant), HORIZONS):
            if h not in args.horizons or run in done or f"{run}/config.yaml" in done:
                continue
            print("$ hoformer fit", " ".join(exp), flush=True)
            r = run_one(run, sweep, exp=exp, root=ROOT / run)
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
