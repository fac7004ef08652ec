"""The CPU-budget HOBA runs of docs/results_text.md (teachers and distilled students) as results-ledger lines.

Layout read (what the commands of docs/results_text.md write): the teacher ``<root>/cpu_<ds>_teacher`` and the
students ``<root>/cpu_<ds>_<variant>/s<seed>``, each with the ``logs/version_*/`` of its ``hoformer fit`` and
``hoformer test`` (``metrics.csv``, ``config.yaml``). One line per run that has a test accuracy: the experiment of
``benchmarks/paper_configs.py`` (``hoba/cpu_<ds>_<variant>``), the seed and stopping rule of its saved config, its
last validation accuracy, the test accuracy of its last epoch (``tested: last checkpoint``, as the paper's fixed
schedule does) and the commands that produced it. ``commit`` is the checkout's: write the lines from the checkout
that made the runs. Without ``--ledger`` the lines are printed, not written.

    python benchmarks/hoba_students.py --datasets trec sst2 --ledger      # append to results/ledger.jsonl
"""
from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
from pathlib import Path

import campaign  # benchmarks/: a script's own folder is first on sys.path
import paper_configs
from hoformer import results

VARIANTS = ("hoba", "hoba_nocb", "block2d", "full2d", "triplet_full", "teacher")


def _last(run: Path, key: str) -> float | None:
    val = None
    for path in sorted((run / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        for row in csv.DictReader(path.open()):
            if row.get(key):
                val = float(row[key])
    return val


def ledger_line(run: Path, ds: str, variant: str, root_arg: str) -> dict | None:
    """The ledger line of one run folder (None without a test accuracy)."""
    test = _last(run, "test/acc")
    if test is None:
        return None
    name = f"hoba/cpu_{ds}_{variant}"
    seed = campaign._resolved(run, "seed_everything")
    folder = f"{root_arg}/cpu_{ds}_{variant}" + ("" if variant == "teacher" else f"/s{seed}")
    args = [a for a in paper_configs.experiments()[name] if not a.startswith("--trainer.default_root_dir=")]
    args += [*([f"--seed_everything={seed}"] if variant != "teacher" else []), f"--trainer.default_root_dir={folder}"]
    fit = "hoformer fit " + " ".join(map(shlex.quote, args))
    val = _last(run, "val/acc")
    return {"experiment": name, "task": "text", "dataset": ds, "model": "full2d" if variant == "teacher" else variant,
            "scale": "cpu", "split": "dev" if ds == "sst2" else "test", "metrics": {"test/acc": test},
            "best_val": {"val/acc": val} if val is not None else {},
            "role": "teacher" if variant == "teacher" else "student", "tested": "last checkpoint",
            "seed": None if seed is None else int(seed), "epochs": campaign._ckpt_epochs(run) or None,
            "best_epoch": None, "stopping": campaign.stopping_rule(run), "wall_s": None,
            **results.provenance("cpu", 1, fit, "run"),
            "test_command": fit.replace("hoformer fit", "hoformer test", 1) + f" --ckpt_path {folder}/checkpoints/last.ckpt"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--root", type=Path, default=Path("runs/hoba"), help="the runs' folder (default runs/hoba)")
    ap.add_argument("--datasets", nargs="+", default=["trec", "sst2"], choices=["trec", "sst2"])
    results.add_ledger_argument(ap)
    a = ap.parse_args(argv)
    if not a.root.is_dir():
        ap.error(f"--root {a.root}: no such folder (the runs of docs/results_text.md are written under runs/hoba)")
    lines = []
    for ds in a.datasets:
        for v in VARIANTS:
            base = a.root / f"cpu_{ds}_{v}"
            runs = [base] if v == "teacher" else sorted(base.glob("s*"), key=lambda p: p.name)
            lines += [ln for r in runs if (r / "logs").is_dir() and (ln := ledger_line(r, ds, v, a.root.as_posix()))]
    if not lines:
        ap.error(f"no finished run (a test/acc in logs/version_*/metrics.csv) under {a.root}")
    for ln in lines:
        if a.ledger:
            results.append_ledger(ln, a.ledger)
        else:
            print(json.dumps(ln))
    print(f"{len(lines)} lines" + (f" appended to {a.ledger}" if a.ledger else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
