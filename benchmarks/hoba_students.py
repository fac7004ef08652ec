"""Collect the CPU-budget HOBA student runs of docs/results_text.md into one table: per dataset and attention, the
test and validation accuracy (mean +- sample std over the seeds found) and each seed's test accuracy.

Layout read (what the commands in docs/results_text.md write): ``runs/hoba/cpu_<ds>_<variant>/s<seed>/logs/
version_*/metrics.csv``; validation accuracy = the last ``val/acc`` of the fit, test = the last ``test/acc``.

Run:  .venv/bin/python benchmarks/hoba_students.py [--root runs/hoba] [--datasets trec sst2]
"""
from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

VARIANTS = ("hoba", "hoba_nocb", "block2d", "full2d", "triplet_full", "teacher")


def _last(run: Path, key: str) -> float | None:
    val = None
    for path in sorted((run / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        for row in csv.DictReader(path.open()):
            if row.get(key):
                val = float(row[key])
    return val


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    m = 100 * statistics.mean(xs)
    return f"{m:.1f} ± {100 * statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{m:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("runs/hoba"))
    ap.add_argument("--datasets", nargs="+", default=["trec", "sst2"])
    args = ap.parse_args()
    print("| dataset | attention | seeds | test acc (%) | val acc (%) | test acc per seed |")
    print("|---|---|---|---|---|---|")
    for ds in args.datasets:
        for v in VARIANTS:
            base = args.root / f"cpu_{ds}_{v}"
            runs = [base] if v == "teacher" else sorted(base.glob("s*"), key=lambda p: p.name)
            rows = [(r.name, _last(r, "test/acc"), _last(r, "val/acc")) for r in runs if (r / "logs").is_dir()]
            rows = [r for r in rows if r[1] is not None]
            if not rows:
                continue
            test, val = [r[1] for r in rows], [r[2] for r in rows if r[2] is not None]
            per = " / ".join(f"{100 * t:.1f}" for _, t, _ in rows)
            vfmt = _fmt(val) + ("" if len(val) == len(test) else f" ({len(val)} seeds)")
            print(f"| {ds} | {v} | {len(rows)} | {_fmt(test)} | {vfmt} | {per} |")


if __name__ == "__main__":
    main()
