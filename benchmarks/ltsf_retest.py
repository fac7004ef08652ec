"""Re-run only the ``test`` stage of finished forecasting runs from their saved best checkpoints and compare the test
metrics with those recorded by ``benchmarks/ltsf_sweep.py`` (a provenance check: same checkpoint + clean code must give
the recorded numbers bit for bit).

Run:  python benchmarks/ltsf_retest.py --records 'runs/weather_cpu*.jsonl' 'hot/ltsf_cpu/weather_96_*'

The runs are named as in ``benchmarks/paper_configs.py`` (patterns allowed) or by their config files.

Prints one JSON line per config: the recorded and the re-tested test MSE / MAE and whether they are identical.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="paper_configs.py experiment names / patterns, or config files")
    ap.add_argument("--records", default="runs/*.jsonl", help="glob of ltsf_sweep.py JSONL files")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    recorded = {}
    for f in sorted(glob.glob(args.records)):
        for line in Path(f).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                recorded[r["config"]] = r
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    import fnmatch

    sys.path.insert(0, str(Path(__file__).parent))
    from paper_configs import experiments

    exps = experiments()
    names = [c for c in args.configs if c.endswith(".yaml")]
    names += [n for n in exps if any(fnmatch.fnmatch(n, p) for p in args.configs)]
    for c in names:
        if c not in recorded:
            print(json.dumps({"config": c, "error": "no recorded run"}), flush=True)
            continue
        cfg_args = ["--config", c] if c.endswith(".yaml") else exps[c]
        root = Path(yaml.safe_load(Path(c).read_text())["trainer"]["default_root_dir"]) if c.endswith(".yaml") \
            else Path("runs") / c
        before = set(glob.glob(str(root / "logs" / "version_*")))
        r = subprocess.run([sys.executable, "-m", "hoformer.cli", "test", *cfg_args,
                            "--trainer.enable_progress_bar=false", "--ckpt_path", "best"],
                           env=env, capture_output=True, text=True)
        new = sorted(set(glob.glob(str(root / "logs" / "version_*"))) - before)
        if r.returncode or not new:
            print(json.dumps({"config": c, "error": f"test failed (exit {r.returncode})"}), flush=True)
            continue
        with open(Path(new[-1]) / "metrics.csv") as f:
            m = {k: float(v) for k, v in next(csv.DictReader(f)).items() if k.startswith("test/") and v}
        old = recorded[c]
        same = all(old[k] == m[k] for k in ("test/mse", "test/mae"))
        print(json.dumps({"config": c, "identical": same, "recorded_mse": old["test/mse"], "mse": m["test/mse"],
                          "recorded_mae": old["test/mae"], "mae": m["test/mae"]}), flush=True)


if __name__ == "__main__":
    main()
