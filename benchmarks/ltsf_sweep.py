"""Run ``hoformer fit`` + ``hoformer test --ckpt_path best`` for a list of forecasting experiments of
``benchmarks/paper_configs.py`` (names or shell-style patterns) and collect the test metrics into one JSONL file (one
line per run; runs already in the file are skipped, so the sweep can be resumed).

Run:  .venv/bin/python benchmarks/ltsf_sweep.py --out runs/ltsf_cpu.jsonl 'hot/ltsf_cpu/etth1_96_*'
      .venv/bin/python benchmarks/ltsf_sweep.py --out runs/ltsf_cpu.jsonl --table   # print the markdown table

Each run uses ``OMP_NUM_THREADS=--threads`` and ``--trainer.max_time`` as given; the wall time of ``fit`` and the
epoch of the tested checkpoint are recorded with the metrics.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
import fnmatch

import paper_configs  # benchmarks/paper_configs.py: a script's own folder is first on sys.path


def _arg(args: list[str], key: str, default=None):
    """The value of the last ``key=value`` override in ``args``."""
    vals = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
    return vals[-1] if vals else default


def _run(cmd: list[str], env: dict, log) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def _test_metrics(root: Path) -> dict:
    """The last ``test/*`` row of the newest CSV logger version under ``root/logs``."""
    versions = sorted((root / "logs").glob("version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    for path in reversed(versions):
        rows = [r for r in csv.DictReader(path.open()) if any(k.startswith("test/") and r[k] for k in r)]
        if rows:
            return {k: float(v) for k, v in rows[-1].items() if k.startswith("test/") and v}
    raise RuntimeError(f"no test metrics under {root}/logs")


def _best_val(root: Path) -> dict:
    """``val/*`` metrics of the epoch with the lowest ``val/mae`` (the checkpoint ``--ckpt_path best`` tests) over the
    CSV logs of this run directory; empty if the fit logged no validation."""
    rows = []
    for path in (root / "logs").glob("version_*/metrics.csv"):
        rows += [r for r in csv.DictReader(path.open()) if r.get("val/mae")]
    if not rows:
        return {}
    best = min(rows, key=lambda r: float(r["val/mae"]))
    return {k: float(v) for k, v in best.items() if k.startswith("val/") and v}


def run_one(name: str, args, exp: list[str] | None = None, root: Path | None = None) -> dict:
    """``name``: an experiment of paper_configs.py, or a config file (resolved as ``hoformer fit`` resolves it, the
    configs it extends included); or, with ``exp`` (``hoformer fit`` arguments) and ``root`` (its run directory), any
    run recorded under ``name``."""
    if exp is not None:
        root = Path(root)
    elif name.endswith(".yaml"):
        from hoformer.config import resolve_config

        cfg = resolve_config(name)
        root = Path(cfg["trainer"]["default_root_dir"])
        data = cfg["data"]["init_args"]
        model = cfg["model"]["init_args"]["model"]["init_args"]
        exp = ["--config", name, f"--data.init_args.name={data['name']}", f"--data.init_args.pred_len={data['pred_len']}"]
        exp += [f"--model.model.init_args.attention={model['attention']}"] if "attention" in model else []
    else:
        exp = paper_configs.experiments()[name]
        root = Path(f"runs/{name}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    common = ["--trainer.enable_progress_bar=false", f"--trainer.max_time={args.max_time}"]
    if args.max_epochs:
        common.append(f"--trainer.max_epochs={args.max_epochs}")
    hoformer = [sys.executable, "-m", "hoformer.cli"]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "sweep.log", "a") as log:
        t0 = time.time()
        if _run(hoformer + ["fit", *exp, *common], env, log):  # hoformer.cli reads `# extends:` bases
            raise RuntimeError(f"fit failed, see {root / 'sweep.log'}")
        fit_s = time.time() - t0
        if _run(hoformer + ["test", *exp, *common, "--ckpt_path", "best"], env, log):
            raise RuntimeError(f"test failed, see {root / 'sweep.log'}")
    best = sorted((root / "checkpoints").glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)[-1].name
    return {"config": name, "dataset": _arg(exp, "--data.init_args.name", "ETTh1"),
            "pred_len": int(_arg(exp, "--data.init_args.pred_len", 96)),
            "attention": _arg(exp, "--model.model.init_args.attention", "kronecker_product"), "fit_s": round(fit_s, 1),
            "best_epoch": int(re.search(r"epoch=?(\d+)", best).group(1)), **_best_val(root), **_test_metrics(root)}


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by = defaultdict(dict)
    for r in rows:
        by[(r["dataset"], r["attention"])][r["pred_len"]] = r
    lines = ["| dataset | attention | " + " | ".join(f"MSE/MAE {h}" for h in (96, 192, 336, 720))
             + " | avg MSE/MAE |", "|---|---|---|---|---|---|---|"]
    for (ds, attn), hs in sorted(by.items()):
        cells, mse, mae = [], [], []
        for h in (96, 192, 336, 720):
            r = hs.get(h)
            if r is None:
                cells.append("-")
                continue
            cells.append(f"{r['test/mse']:.3f} / {r['test/mae']:.3f}")
            mse.append(r["test/mse"])
            mae.append(r["test/mae"])
        avg = f"{sum(mse) / 4:.3f} / {sum(mae) / 4:.3f}" if len(mse) == 4 else "-"
        lines.append(f"| {ds} | `{attn}` | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiments", nargs="*",
                    help="paper_configs.py names or patterns (e.g. 'hot/ltsf_cpu/etth1_96_*') or config files")
    ap.add_argument("--out", type=Path, required=True, help="JSONL results file (appended; done runs skipped)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-time", default="00:00:30:00", help="Lightning max_time per fit (DD:HH:MM:SS)")
    ap.add_argument("--max-epochs", type=int, default=0, help="override trainer.max_epochs (0: the config's)")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    args = ap.parse_args()
    if args.table:
        print(table(args.out))
        return
    done = set()
    if args.out.exists():
        done = {json.loads(line)["config"] for line in args.out.read_text().splitlines() if line.strip()}
    names = [p for p in args.experiments if p.endswith(".yaml")]
    names += [n for n in paper_configs.experiments() if any(fnmatch.fnmatch(n, p) for p in args.experiments)]
    for name in names:
        if name in done:
            print(f"skip {name} (in {args.out})")
            continue
        r = run_one(name, args)
        print(json.dumps(r), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
