"""The results ledger (``results/ledger.jsonl``) and the documentation tables generated from it.

One JSON line per finished run (written by ``benchmarks/campaign.py``): experiment, task, dataset, model, horizon or
split, test metrics, seed, epochs run and best epoch, stopping rule, wall time, hardware, torch version, commit,
scale (``paper``: the paper's model and optimiser; ``cpu``: a CPU-sized budget) and the exact command. Every
hoformer number in README.md and docs/*.md sits in a block

    <!-- ledger:NAME -->
    ...
    <!-- /ledger -->

whose body :data:`TABLES` ``[NAME]`` renders from the ledger; ``python benchmarks/campaign.py --tables`` rewrites
them and ``tests/test_campaign.py`` fails when a committed block differs from what the ledger gives.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "results" / "ledger.jsonl"


def read_ledger(path: Path = LEDGER) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON line ({e})") from None
    return rows


def append_ledger(row: dict, path: Path = LEDGER) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------------- tables
TABLE_RE = re.compile(r"(<!-- ledger:(?P<name>[\w./-]+) -->\n)(?P<body>.*?)(<!-- /ledger -->)", re.S)


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _mean_std(vals: list[float], digits: int) -> str:
    if not vals:
        return "-"
    m = sum(vals) / len(vals)
    if len(vals) == 1:
        return f"{m:.{digits}f}"
    s = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def table_forecast(rows: list[dict], **select) -> str:
    """Test MSE / MAE per model (rows) and horizon (columns) of the ledger lines matching ``select``; several seeds
    are averaged (mean ± std); the hardware, epochs and provenance of each line are in the ledger."""
    sel = [r for r in rows if all(r.get(k) == v for k, v in select.items())]
    horizons = sorted({r["horizon"] for r in sel})
    models = list(dict.fromkeys(r["model"] for r in sel))
    head = "| model | " + " | ".join(f"{h}: MSE / MAE" for h in horizons) + " | epochs (best) | seeds |"
    lines = [head, "|---|" + "---|" * (len(horizons) + 2)]
    for m in models:
        cells, epochs, seeds = [], [], set()
        for h in horizons:
            rs = [r for r in sel if r["model"] == m and r["horizon"] == h]
            seeds |= {r["seed"] for r in rs}
            epochs += [f"{r['epochs']} ({r['best_epoch']})" for r in rs]
            cells.append(f"{_mean_std([r['metrics']['test/mse'] for r in rs], 3)} / "
                         f"{_mean_std([r['metrics']['test/mae'] for r in rs], 3)}" if rs else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {', '.join(epochs)} | {len(seeds)} |")
    return "\n".join(lines)


def table_runs(rows: list[dict], **select) -> str:
    """One line per ledger run matching ``select``: experiment, metrics, epochs, wall time, hardware, commit."""
    sel = [r for r in rows if all(r.get(k) == v for k, v in select.items())]
    lines = ["| experiment | test metrics | epochs (best) | wall | hardware | commit |", "|---|---|---|---|---|---|"]
    for r in sel:
        metrics = ", ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in r["metrics"].items()
                            if not k.endswith("_orig"))
        lines.append(f"| `{r['experiment']}` | {metrics} | {r['epochs']} ({r['best_epoch']}) | "
                     f"{r['wall_s'] / 60:.0f} min | {r['hardware']} | {r['commit']} |")
    return "\n".join(lines)


TABLES = {  # the name in `<!-- ledger:NAME -->` -> how the ledger renders it
    "hot/etth1_paper": lambda rows: table_forecast(rows, dataset="ETTh1", scale="paper"),
    "hot/weather_paper": lambda rows: table_forecast(rows, dataset="weather", scale="paper"),
    "hot/paper_runs": lambda rows: table_runs(rows, scale="paper"),
}


def render_tables(files: list[Path], rows: list[dict], write: bool) -> list[Path]:
    """Replace the body of every ``<!-- ledger:NAME -->`` ... ``<!-- /ledger -->`` block of ``files`` by the table
    the ledger gives. Returns the files whose content differs (written when ``write``)."""
    changed = []
    for f in files:
        text = f.read_text()

        def sub(m: re.Match) -> str:
            name = m.group("name")
            if name not in TABLES:
                raise KeyError(f"{f}: unknown ledger table {name!r} (known: {sorted(TABLES)})")
            body = TABLES[name](rows).rstrip("\n") + "\n"
            return m.group(1) + body + m.group(4)

        new = TABLE_RE.sub(sub, text)
        if new != text:
            changed.append(f)
            if write:
                f.write_text(new)
    return changed


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
