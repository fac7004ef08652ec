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

import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "results" / "ledger.jsonl"


def _results():
    """:mod:`hoformer.results`, imported when a line is read or written (a benchmark run against another tree's
    hoformer, ``attention.py --against``, imports this module without it)."""
    from hoformer import results

    return results


def read_ledger(path: Path = LEDGER) -> list[dict]:
    return _results().read_ledger(path)


def append_ledger(row: dict, path: Path = LEDGER) -> None:
    _results().append_ledger(row, path)


def hardware(device: str, threads: int) -> str:
    return _results().hardware(device, threads)


def commit() -> str:
    """The checked-out commit of this repository, ``+dirty`` when ``src/``, ``configs/`` or ``benchmarks/`` differ."""
    return _results().commit(ROOT)


def provenance(device: str, threads: int, command: str) -> dict:
    """The provenance fields of a line a benchmark script writes: hardware, torch, commit, date, command, record."""
    return _results().provenance(device, threads, command, "benchmark", machine=hardware(device, threads), at=commit())


def benchmark_line(experiment: str, model: str, split: str, metrics: dict, *, device: str, threads: int,
                   command: str, note: str, **fields) -> dict:
    """A ledger line of a benchmark measurement (``task: benchmark``, synthetic inputs) with its provenance."""
    return {"experiment": experiment, "task": "benchmark", "dataset": "synthetic", "model": model,
            "scale": "gpu" if str(device).startswith("cuda") else "cpu", "split": split, "metrics": metrics, **fields,
            "metrics_note": note, "seed": 0, "epochs": None, "best_epoch": None, "stopping": None, "wall_s": None,
            **provenance(device, threads, command)}


def add_ledger_argument(parser) -> None:
    """A benchmark script's ``--ledger [FILE]`` option: append its results to the results ledger (``FILE``, default
    ``results/ledger.jsonl``; absent: nothing is written)."""
    parser.add_argument("--ledger", nargs="?", const="results/ledger.jsonl", default=None, metavar="FILE",
                        help="append the results to the results ledger (default file: results/ledger.jsonl)")


def benchmark_command(script: str, argv: list[str], ledger_file: str | None, local: tuple[str, ...] = ()) -> str:
    """``python benchmarks/SCRIPT ARGS`` without ``--ledger [FILE]`` and the ``local`` options with their values
    (files of the machine that ran it, such as a side output ``--out``)."""
    out, rest = [], list(argv)
    while rest:
        a = rest.pop(0)
        if a == "--ledger" and rest and rest[0] == ledger_file:
            rest.pop(0)
        if a in local and rest:
            rest.pop(0)
            continue
        if not (a == "--ledger" or a.startswith("--ledger=") or a.split("=", 1)[0] in local):
            out.append(a)
    return " ".join([f"python benchmarks/{script}", *out])


def append_benchmarks(entries: list[dict], path: str | Path, script: str, argv: list[str], *, device: str,
                      threads: int) -> None:
    """Append one :func:`benchmark_line` per entry (``experiment``, ``model``, ``split``, ``metrics``, ``note`` and
    optional fields such as ``shape``) to the ledger ``path``; the command is ``script`` with ``argv``."""
    command = benchmark_command(script, argv, str(path))
    for e in entries:
        extra = {k: v for k, v in e.items() if k not in ("experiment", "model", "split", "metrics", "note")}
        append_ledger(benchmark_line(e["experiment"], e["model"], e["split"], e["metrics"], device=str(device),
                                     threads=threads, command=command, note=e["note"], **extra), Path(path))
    print(f"\n{len(entries)} lines appended to {path}")


def device_suffix(device: str, dtype: str = "fp32") -> str:
    """The experiment-name suffix of a benchmark measured off the default setting (CPU, fp32): ``+cuda``,
    ``+bf16``, ``+cuda-bf16``, so that a GPU or bf16 line never stands for a CPU fp32 one."""
    parts = [p for p in (str(device).split(":")[0] if not str(device).startswith("cpu") else "",
                         dtype if dtype != "fp32" else "") if p]
    return "+" + "-".join(parts) if parts else ""


def latest(rows: list[dict]) -> list[dict]:
    """The last line of each experiment (a re-measurement supersedes the earlier lines), in ledger order."""
    last = {r["experiment"]: i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if last[r["experiment"]] == i]


def _on(experiment: str, prefix: str, suffix: str) -> bool:
    """Whether ``experiment`` is ``prefix...`` measured as ``suffix`` says (:func:`device_suffix`; ``""``: CPU,
    fp32)."""
    return (experiment.startswith(prefix) and experiment.endswith(suffix)
            and "+" not in experiment[:len(experiment) - len(suffix)])


def bench_lines(rows: list[dict], prefix: str, suffix: str = "") -> list[dict]:
    """The newest line of each benchmark experiment named ``prefix...`` measured as ``suffix`` says (``+cuda``,
    ``+cuda-bf16``; ``""``: CPU, fp32): a GPU line never stands in a CPU table, nor a CPU line in a GPU one."""
    return [r for r in latest(pick(rows, task="benchmark")) if _on(r["experiment"], prefix, suffix)]


# ---------------------------------------------------------------------------------------------------- tables
TABLE_RE = re.compile(r"(<!-- ledger:(?P<name>[\w./-]+) -->\n)(?P<body>.*?)(<!-- /ledger -->)", re.S)
HORIZONS = (96, 192, 336, 720)
NO_RUNS = "no runs yet"

# The papers' own numbers, printed next to hoformer's. They are not hoformer runs, so they are not ledger lines.
PAPER = {
    "ETTh1/avg": {"mse": 0.454, "mae": 0.447, "source": "iTransformer paper (the HOT paper does not report ETTh1)"},
    # iTransformer's own ETTh1 results, lookback 96, per horizon (their mean is ETTh1/avg)
    "ETTh1/itransformer": {96: (0.386, 0.405), 192: (0.441, 0.436), 336: (0.487, 0.458), 720: (0.503, 0.491),
                           "avg": (0.454, 0.447), "source": "iTransformer paper, full results, ETTh1"},
    "weather/hot/avg": {"mse": 0.245, "mae": 0.275, "source": "HOT Table 1"},
    "weather/spatial/avg": {"mse": 0.258, "mae": 0.278, "source": "HOT Table 1, Transformer (spatial)"},
    "weather/temporal/avg": {"mse": 0.258, "mae": 0.283, "source": "HOT Table 1, Transformer (temporal)"},
    "adrenal/hot_product": {"auc": 88.6, "acc": 83.8, "source": "HOT Table 2"},
    "metr_la/weaver": {"mae": 3.00, "source": "Weaver paper, MAE over all 12 steps"},
    "pems_bay/weaver": {"mae": 1.54, "source": "Weaver paper, MAE over all 12 steps"},
}

LABELS = {"hot_product": "HOT (product)", "hot_sum": "HOT (sum)", "full": "Transformer (non-factorized)",
          "spatial": "Transformer (spatial)", "temporal": "Transformer (temporal)"}


def pick(rows: list[dict], **select) -> list[dict]:
    """The ledger lines whose fields equal ``select`` (a callable value is a predicate on the field's value)."""
    return [r for r in rows if all(v(r.get(k)) if callable(v) else r.get(k) == v for k, v in select.items())]


def metric(r: dict, names: str | tuple[str, ...], horizon: int | None = None) -> float | None:
    """The first of ``names`` a line has; with ``horizon``: ``NAME@horizon`` (a line scoring several horizons) or
    ``NAME`` of a line of that horizon."""
    m = r["metrics"]
    for name in (names,) if isinstance(names, str) else names:
        if horizon is None:
            if name in m:
                return m[name]
        elif f"{name}@{horizon}" in m:
            return m[f"{name}@{horizon}"]
        elif r.get("horizon") == horizon and name in m:
            return m[name]
    return None


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals)


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _mean_std(vals: list[float], digits: int = 3) -> str:
    if not vals:
        return "-"
    m = _mean(vals)
    if len(vals) == 1:
        return f"{m:.{digits}f}"
    s = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
    sd = digits if round(s, digits) else digits + 1  # a spread below the last digit keeps one more
    return f"{m:.{digits}f} ± {s:.{sd}f}"


def _md(head: list[str], body: list[list[str]]) -> str:
    """A markdown table; without rows, one row saying so."""
    body = body or [[NO_RUNS] + [""] * (len(head) - 1)]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(str(c) for c in row) + " |" for row in body)])


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 3600:
        return f"{s:.0f} s"
    h, m = divmod(round(s / 60), 60)
    return f"{h} h {m} min" if h else f"{m} min"


def hardware_short(rows: list[dict]) -> str:
    """``2 CPU cores`` / the GPU's name, for the lines of one table cell."""
    out = []
    for r in rows:
        hw = r["hardware"]
        cores = re.search(r"(\d+) cores", hw)
        out.append(f"{cores.group(1)} CPU cores" if cores else hw.split(" (CUDA")[0])
    return ", ".join(dict.fromkeys(out)) or "-"


def seeds_of(rows: list[dict]) -> list:
    """The seeds of ``rows`` (a line recording a summary over seeds lists them)."""
    out = []
    for r in rows:
        out += r["seed"] if isinstance(r["seed"], list) else [r["seed"]]
    return sorted(set(out), key=str)


def _epochs(r: dict) -> str:
    if r.get("epochs") is None:
        return "-"
    best = "" if r.get("best_epoch") is None else f" ({r['best_epoch']})"
    hand = ", stopped by hand" if r.get("stopping", {}).get("stopped_by_hand") else ""
    return f"{r['epochs']}{best}{hand}"


# -------------------------------------------------------------------------------------------- forecasting
def table_forecast(rows: list[dict], reference: tuple[str, dict] | None = None, **select) -> str:
    """Test MSE / MAE per model (rows) and horizon (columns) of the ledger lines matching ``select``; several seeds
    are averaged (mean ± std); with all four horizons, their average; epochs run (best epoch) per line, the seeds and
    the hardware. ``reference``: (label, {horizon: (mse, mae)}), a paper's row (not a ledger line)."""
    sel = pick(rows, **select)
    horizons = sorted({r["horizon"] for r in sel if isinstance(r.get("horizon"), int)}) or [96, 720]
    average = tuple(horizons) == HORIZONS
    body = []
    for m in dict.fromkeys(r["model"] for r in sel):
        rs = pick(sel, model=m)
        cells, means = [], []
        for h in horizons:
            hs = [r for r in rs if r.get("horizon") == h]
            if hs:
                means.append((_mean([r["metrics"]["test/mse"] for r in hs]), _mean([r["metrics"]["test/mae"] for r in hs])))
            cells.append(f"{_mean_std([r['metrics']['test/mse'] for r in hs])} / "
                         f"{_mean_std([r['metrics']['test/mae'] for r in hs])}" if hs else "-")
        if average:
            cells.append(f"**{_mean([a for a, _ in means]):.3f} / {_mean([b for _, b in means]):.3f}**"
                         if len(means) == len(HORIZONS) else "-")
        epochs = ", ".join(_epochs(r) for h in horizons for r in rs if r.get("horizon") == h)
        body.append([LABELS.get(m, m), *cells, epochs, str(len(seeds_of(rs))), hardware_short(rs)])
    if reference and body:
        label, ref = reference
        cells = [f"{ref[h][0]:.3f} / {ref[h][1]:.3f}" if h in ref else "-" for h in horizons]
        if average:  # the paper's own average where it gives one (its rounding), else the mean of its rows
            avg = ref.get("avg") or (_mean([ref[h][0] for h in HORIZONS]), _mean([ref[h][1] for h in HORIZONS]))
            cells.append(f"{avg[0]:.3f} / {avg[1]:.3f}")
        body.append([label, *cells, "-", "-", "-"])
    return _md(["model", *(f"{h}: MSE / MAE" for h in horizons), *(["average"] if average else []),
                "epochs (best)", "seeds", "hardware"], body)


def table_horizons(rows: list[dict], groups: list[tuple[str, dict]], metrics=("test/mse", "test/mae"),
                   horizons=HORIZONS, avg: bool = True, extra=(), first: str = "model") -> str:
    """One row per group (``(label, select)``), one column per horizon: test MSE / MAE (``metrics``: names, or
    tuples of alternative names, tried in order), mean ± std over the group's lines when it has several (seeds);
    ``avg``: the mean over the horizons, for the metrics every horizon has; ``extra``: ``(header, lines -> cell)``."""
    body = []
    for label, select in groups:
        rs = pick(rows, **select)
        if not rs:
            continue
        cells, means = [], {i: [] for i in range(len(metrics))}
        for h in horizons:
            parts = []
            for i, name in enumerate(metrics):
                vals = [v for r in rs if (v := metric(r, name, h)) is not None]
                if vals:
                    parts.append(_mean_std(vals))
                    means[i].append(_mean(vals))
            cells.append(" / ".join(parts) or "-")
        if avg:
            cells.append(" / ".join(f"{_mean(v):.3f}" for v in means.values() if len(v) == len(horizons)) or "-")
        body.append([label, *cells, *(fn(rs) for _, fn in extra)])
    return _md([first, *map(str, horizons), *(["avg"] if avg else []), *(h for h, _ in extra)], body)


def horizon_average(rows: list[dict], seed, name: str = "test/mse", horizons=HORIZONS) -> float | None:
    """The mean over ``horizons`` of one seed's test metric: from its per-horizon lines, or from a line that records
    only that average (``horizon``: the list of horizons)."""
    per = [pick(rows, seed=seed, horizon=h) for h in horizons]
    if all(len(p) == 1 and metric(p[0], name) is not None for p in per):
        return _mean([metric(p[0], name) for p in per])
    whole = [r for r in pick(rows, seed=seed, horizon=list(horizons)) if metric(r, name) is not None]
    return metric(whole[0], name) if len(whole) == 1 else None


def table_seeds(rows: list[dict], groups: list[tuple[str, dict]], seeds: list[int], paper: dict | None = None) -> str:
    """Four-horizon average test MSE per seed and its mean ± std over the seeds, one row per group."""
    body = []
    for label, select in groups:
        rs = pick(rows, **select)
        vals = [horizon_average(rs, s) for s in seeds]
        if not rs or any(v is None for v in vals):
            continue
        body.append([label, " / ".join(_fmt(v) for v in vals), _mean_std(vals), *([paper.get(label, "-")] if paper else [])])
    head = ["model", f"per seed ({' / '.join(map(str, seeds))})", f"mean ± std, {len(seeds)} seeds"]
    return _md(head + (["paper"] if paper else []), body)


def table_per_seed(rows: list[dict], groups: list[tuple[str, dict]], seeds: list[int], first: str) -> str:
    """Test MSE / MAE of one line per seed, their mean ± std and each fit's wall-clock time, one row per group."""
    body = []
    for label, select in groups:
        rs = [pick(rows, seed=s, **select) for s in seeds]
        if not all(len(r) == 1 for r in rs):
            continue
        rs = [r[0] for r in rs]
        cells = [f"{_fmt(metric(r, 'test/mse'))} / {_fmt(metric(r, 'test/mae'))}" for r in rs]
        body.append([label, *cells, _mean_std([metric(r, "test/mse") for r in rs]),
                     _mean_std([metric(r, "test/mae") for r in rs]), " / ".join(_duration(r["wall_s"]) for r in rs)])
    return _md([first, *(f"seed {s}" for s in seeds), f"MSE, {len(seeds)} seeds", f"MAE, {len(seeds)} seeds",
                "fit wall-clock per seed"], body)


def fits(rs: list[dict]) -> str:
    return f"{len(rs)}: " + " / ".join(_duration(r["wall_s"]) for r in rs)


def epochs_best(rs: list[dict]) -> str:
    cells = [_epochs(r) for r in rs]
    return "-" if set(cells) == {"-"} else " / ".join(cells)


# ----------------------------------------------------------------------------------------- classification
def table_classification(rows: list[dict], groups: list[tuple[str, dict]], mean_of: tuple[str, dict] | None = None,
                         paper: tuple[str, str] | None = None) -> str:
    """One row per line of each group: epochs, best validation AUC (its epoch), test AUC / ACC (%), fit time and
    threads; ``mean_of``: a row with the mean over a group's lines; ``paper``: (label, PAPER key)."""
    head = ["model, training", "seed", "epochs", "best val AUC (epoch)", "test AUC", "test ACC", "fit"]
    body = []
    for label, select in groups:
        for r in pick(rows, **select):
            val = r.get("best_val", {}).get("val/auc")
            threads = re.search(r"(\d+) thread", r["hardware"])
            body.append([label, r["seed"], r["epochs"], f"{_fmt(val and 100 * val, 1)} ({r['best_epoch']})",
                         _fmt(100 * r["metrics"]["test/auc"], 1), _fmt(100 * r["metrics"]["test/acc"], 1),
                         _duration(r["wall_s"]) + (f", {threads.group(1)} thread" + "s" * (threads.group(1) != "1")
                                                    if threads else "")])
    if mean_of:
        label, select = mean_of
        rs = pick(rows, **select)
        if rs:
            body.append([f"**{label}**", ", ".join(map(str, seeds_of(rs))), rs[0]["epochs"], "",
                         f"**{_mean([100 * r['metrics']['test/auc'] for r in rs]):.1f}**",
                         f"**{_mean([100 * r['metrics']['test/acc'] for r in rs]):.1f}**", ""])
    if paper:
        p = PAPER[paper[1]]
        body.append([paper[0], "", "", "", f"{p['auc']:.1f}", f"{p['acc']:.1f}", ""])
    return _md(head, body)


# ------------------------------------------------------------------------------------------------ traffic
TRAFFIC_METRICS = [("MAE 15m", "test/mae@15m"), ("MAE 30m", "test/mae@30m"), ("MAE 60m", "test/mae@60m"),
                   ("MAE all", "test/mae"), ("MAPE all %", "test/mape"), ("RMSE all", "test/rmse")]


def _summary_cell(r: dict, name: str) -> str:
    """A line's metric with its standard deviation over seeds when the line records a summary over seeds."""
    v, s = r["metrics"].get(name), r.get("metrics_std", {}).get(name)
    return "-" if v is None else f"{v:.3f}" + ("" if s is None else f" ± {s:.3f}")


def traffic_runs(rows: list[dict], dataset: str = "los_loop") -> list[dict]:
    """One summary per traffic model: from its per-seed lines when it has any (the newest line of each seed; mean and
    sample std over the seeds, mean wall time per run), else its line that records a summary over seeds. Each has the
    fields of a line (``metrics``, ``metrics_std``, ``seed`` list, ``wall_s``, ``params``, ``epochs``) and ``lines``."""
    out = []
    for model in dict.fromkeys(r["model"] for r in pick(rows, task="traffic", dataset=dataset)):
        mine = pick(rows, task="traffic", dataset=dataset, model=model)
        per = {r["seed"]: r for r in mine if isinstance(r["seed"], int)}  # the newest line of each seed
        if not per:
            out.extend(dict(r, lines=[r]) for r in mine)
            continue
        lines = [per[k] for k in sorted(per)]
        names = [k for k in lines[0]["metrics"] if all(k in r["metrics"] for r in lines)]
        vals = {k: [r["metrics"][k] for r in lines] for k in names}
        out.append(dict(lines[-1], metrics={k: _mean(v) for k, v in vals.items()},
                        metrics_std={k: statistics.stdev(v) for k, v in vals.items()} if len(lines) > 1 else {},
                        seed=sorted(per), wall_s=_mean([r["wall_s"] for r in lines]), lines=lines))
    return out


def table_traffic(rows: list[dict], dataset: str = "los_loop") -> str:
    """Los-loop test metrics (mph; MAPE in %), mean ± sample std over the seeds, one row per model."""
    body = []
    for r in traffic_runs(rows, dataset):
        body.append([f"`{r['model']}`", r.get("params", "-"), *(_summary_cell(r, k) for _, k in TRAFFIC_METRICS),
                     _fmt(r["wall_s"], 0), ", ".join(map(str, seeds_of([r])))])
    return _md(["model", "params", *(h for h, _ in TRAFFIC_METRICS), "s/run", "seeds"], body)


# --------------------------------------------------------------------------------------------------- text
TEXT_STUDENTS = [("HOBA (triplet, block 16, overlap 0.25, cross-block)", "hoba"), ("HOBA without cross-block", "hoba_nocb"),
                 ("2D block-local (same windows, overlap, cross-block)", "block2d"), ("2D full attention", "full2d")]


def table_text(rows: list[dict], datasets=(("TREC test", "trec"), ("SST-2 dev", "sst2"))) -> str:
    """Test accuracy (%) of the distilled students: mean ± std over seeds and per seed; the teacher's single run."""
    head = ["student"]
    for name, _ in datasets:
        head += [f"{name} acc (%)", f"{name} per seed"]
    body = []
    for label, model in TEXT_STUDENTS:
        row = [label]
        for _, ds in datasets:
            rs = sorted(pick(rows, task="text", dataset=ds, model=model, role="student"), key=lambda r: r["seed"])
            accs = [100 * r["metrics"]["test/acc"] for r in rs]
            row += [_mean_std(accs, 1), " / ".join(f"{a:.1f}" for a in accs) + f" (seeds {', '.join(str(r['seed']) for r in rs)})"]
        body.append(row)
    row = ["*teacher (2D, 4 layers)*"]
    for _, ds in datasets:
        rs = pick(rows, task="text", dataset=ds, role="teacher")
        row += [", ".join(f"*{100 * r['metrics']['test/acc']:.1f}*" for r in rs) or "-", ""]
    body.append(row)
    return _md(head, body)


# ---------------------------------------------------------------------------------------------------- runs
def table_runs(rows: list[dict], **select) -> str:
    """One line per ledger run matching ``select``: experiment, metrics, epochs, wall time, hardware, commit."""
    body = []
    for r in pick(rows, **select):
        metrics = ", ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in r["metrics"].items()
                            if not k.endswith(("_orig", "/loss")))
        body.append([f"`{r['experiment']}`", r["seed"], metrics, _epochs(r), _duration(r["wall_s"]), r["hardware"],
                     r["commit"]])
    return _md(["experiment", "seed", "test metrics", "epochs (best)", "wall", "hardware", "commit"], body)


# ------------------------------------------------------------------------------------------- summary rows
ETTH1_EMA = dict(dataset="ETTh1", experiment=lambda e: e.endswith("+ema"),
                 model=lambda m: m in ("hot_product", "hot_sum", "spatial"))
SEEDS5 = [2024, 2025, 2026, 2027, 2028]


def _seed_mean(rows: list[dict], seeds: list[int], **select) -> float | None:
    vals = [horizon_average(pick(rows, **select), s) for s in seeds]
    return None if any(v is None for v in vals) else _mean(vals)


def _etth1(rows: list[dict]) -> str:
    p, s, sp = (_seed_mean(rows, SEEDS5, **ETTH1_EMA | {"model": m}) for m in ("hot_product", "hot_sum", "spatial"))
    return f"HOT product {_fmt(p)}, sum {_fmt(s)}; spatial (iTransformer) {_fmt(sp)}"


def _etth1_paper(rows: list[dict]) -> str:
    """Paper-size ETTh1: each model's four-horizon average MSE (its horizons, when not all four have run)."""
    rs = pick(rows, dataset="ETTh1", scale="paper", task="forecasting")
    if not rs:
        return NO_RUNS
    parts = []
    for m in dict.fromkeys(r["model"] for r in rs):
        mine = pick(rs, model=m)
        per = {h: _mean([r["metrics"]["test/mse"] for r in pick(mine, horizon=h)])
               for h in sorted({r["horizon"] for r in mine})}
        if tuple(per) == HORIZONS:
            parts.append(f"{LABELS.get(m, m)} {_mean(list(per.values())):.3f}")
        else:
            parts.append(f"{LABELS.get(m, m)} " + ", ".join(f"{h}: {v:.3f}" for h, v in per.items()))
    return "; ".join(parts)


def _horizon_avg(rows: list[dict], name: str, **select) -> float | None:
    rs = pick(rows, **select)
    vals = [metric(r, name, h) for h in HORIZONS for r in rs if metric(r, name, h) is not None]
    return _mean(vals) if len(vals) == len(HORIZONS) else None


WEATHER_SUM = dict(dataset="weather", model="hot_sum", variant="ema")
ADRENAL = dict(dataset="AdrenalMNIST3D", model="hot_product", augment="flips+shift2")


def _adrenal(rows: list[dict]) -> str:
    rs = pick(rows, **ADRENAL)
    return f"HOT product {_mean([100 * r['metrics']['test/auc'] for r in rs]):.1f} / " \
           f"{_mean([100 * r['metrics']['test/acc'] for r in rs]):.1f}" if rs else NO_RUNS


def _traffic(rows: list[dict], model: str) -> tuple[float, float]:
    (r,) = [t for t in traffic_runs(rows) if t["model"] == model]
    return r["metrics"]["test/mae@30m"], r["metrics"]["test/mae@60m"]


def _best_traffic_baseline(rows: list[dict]) -> str:
    base = [r for r in traffic_runs(rows) if not r["model"].startswith("weaver")]
    best = min(base, key=lambda r: r["metrics"]["test/mae@30m"])
    return f"{best['metrics']['test/mae@30m']:.2f} / {best['metrics']['test/mae@60m']:.2f}"


def _text_mean(rows: list[dict], ds: str, model: str) -> float:
    return _mean([100 * r["metrics"]["test/acc"] for r in pick(rows, task="text", dataset=ds, model=model,
                                                                 role="student")])


def _text(rows: list[dict], ds: str) -> str:
    best2d = max(_text_mean(rows, ds, m) for m in ("block2d", "full2d"))
    return f"HOBA {_text_mean(rows, ds, 'hoba'):.1f} (best 2D student {best2d:.1f})"


def _bench(rows: list[dict]) -> list[dict]:
    return pick(rows, task="benchmark")


#: the variants of ``benchmarks/attention.py``, in its order
ATTN_VARIANTS = ("paper_product", "paper_sum", "kron_product", "kron_sum", "kron_linear", "kron_linear_sum",
                 "kron_linear_assoc", "full", "axial")


def attention_lines(rows: list[dict], suffix: str = "") -> list[dict]:
    """The newest ``benchmarks/attention.py`` line of each shape and variant (layer rows, not the core) measured as
    ``suffix`` says (:func:`bench_lines`; ``""``: CPU, fp32)."""
    return [r for r in bench_lines(rows, "bench/attention/", suffix)
            if not r["experiment"].startswith("bench/attention/core/")]


def _shapes(rs: list[dict]) -> list[tuple]:
    return list(dict.fromkeys(tuple(r["shape"]) for r in rs))


def _by_shape(rs: list[dict]) -> dict[tuple, dict[str, dict]]:
    out: dict[tuple, dict[str, dict]] = {s: {} for s in _shapes(rs)}
    for r in rs:
        out[tuple(r["shape"])][r["model"]] = r["metrics"]
    return out


def _shape_label(shape) -> str:
    return "(" + ",".join(map(str, shape)) + ")"


def _provenance(rs: list[dict], *names: str) -> str:
    """Where a table's lines come from: command(s), commit(s), hardware, torch, date(s) and the ledger ``names``."""
    if not rs:
        return ""
    pieces = [f"`{c}`" for c in dict.fromkeys(r["command"] for r in rs)]
    return (f"Measured with {', '.join(pieces)} at commit {', '.join(dict.fromkeys(r['commit'] for r in rs))} on "
            f"{', '.join(dict.fromkeys(r['hardware'] for r in rs))}, torch {', '.join(dict.fromkeys(str(r['torch']) for r in rs))} "
            f"({', '.join(dict.fromkeys(r['date'] for r in rs))}; ledger lines {', '.join(f'`{n}`' for n in names)}).")


def _range(vals: list[float], digits: int = 2) -> str:
    return f"{min(vals):.{digits}f}-{max(vals):.{digits}f}" if vals else "-"


def table_attention(rows: list[dict], suffix: str = "") -> str:
    """docs/benchmarks.md's layer table: one row per shape and variant, then the ratios it shows (``suffix``: the
    device / dtype, :func:`device_suffix`)."""
    rs = attention_lines(rows, suffix)
    body = []
    for shape, by in _by_shape(rs).items():
        for name in [v for v in ATTN_VARIANTS if v in by] + [v for v in by if v not in ATTN_VARIANTS]:
            if name in ("kron_linear_sum", "kron_linear_assoc"):
                continue  # the linear kernel's own table
            m = by[name]
            t = f"{m['t/paper']:.2f}"
            body.append([_shape_label(shape), name, f"{m['fwd_bwd_ms']:.1f}", f"{m['peak_mib']:.1f}",
                         f"**{t}**" if name in ("kron_product", "kron_sum") else t, f"{m['mem/paper']:.2f}",
                         _fmt(m.get("flop/paper"), 2)])
    table = _md(["shape", "attention", "fwd+bwd ms", "peak MiB", "t/paper", "mem/paper", "flop/paper"], body)
    kron = [r for r in rs if r["model"] in ("kron_product", "kron_sum")]
    if not kron:
        return table
    full = [f"{_shape_label(shape)} {by['full']['fwd_bwd_ms'] / by['kron_product']['fwd_bwd_ms']:.1f}x / "
            f"{by['full']['fwd_bwd_ms'] / by['kron_sum']['fwd_bwd_ms']:.1f}x"
            for shape, by in _by_shape(rs).items() if {"full", "kron_product", "kron_sum"} <= set(by)]
    flops = [r["metrics"]["flop/paper"] for r in kron if "flop/paper" in r["metrics"]]
    return "\n".join([
        table, "",
        f"* **Kronecker product and sum against the paper's equations**: {_range([r['metrics']['t/paper'] for r in kron])}x "
        f"the time, {_range([r['metrics']['mem/paper'] for r in kron])}x the peak memory"
        + (f", {_range(flops)}x the FLOPs." if flops else "."),
        f"* **Full / Kronecker time** (product / sum): {'; '.join(full)}." if full else "",
        f"* {_provenance(rs, f'bench/attention/*{suffix}')}"]).rstrip("\n")


def table_attention_linear(rows: list[dict]) -> str:
    """docs/benchmarks.md's linear-kernel table: the FAVOR+ variants against the paper baseline, per shape."""
    rs = attention_lines(rows)
    body, lin = [], []
    for shape, by in _by_shape(rs).items():
        if not {"paper_product", "kron_product", "kron_linear", "kron_linear_assoc"} <= set(by):
            continue
        cells = [_shape_label(shape), f"{by['paper_product']['fwd_bwd_ms']:.1f}"]
        for name in ("kron_product", "kron_linear", "kron_linear_sum", "kron_linear_assoc"):
            m = by.get(name)
            cells.append(f"{m['t/paper']:.2f}x t, {m['mem/paper']:.2f}x mem" if m else "-")
        cells.append(f"{by['kron_linear_assoc']['fwd_bwd_ms'] / by['kron_linear']['fwd_bwd_ms']:.2f}x")
        lin.append(by["kron_linear"]["fwd_bwd_ms"] / by["kron_product"]["fwd_bwd_ms"])
        body.append(cells)
    table = _md(["shape", "paper_product ms", "kron_product", "kron_linear", "kron_linear_sum", "kron_linear_assoc",
                 "linear: assoc / formed time"], body)
    if not lin:
        return table
    used = [r for r in rs if r["model"] in ("kron_linear", "kron_linear_sum")]
    return "\n".join([table, "", f"The linear kernel takes {_range(lin)}x the softmax kernel's time at these shapes "
                       f"and {_range([r['metrics']['t/paper'] for r in used])}x the paper baseline's "
                       f"({_range([r['metrics']['mem/paper'] for r in used])}x its peak memory; the extra memory is "
                       "the random-feature maps).", "", _provenance(rs, "bench/attention/*")])


def table_attention_core(rows: list[dict]) -> str:
    """The functional core's throughput (forward + backward, pooled q / k given) against a matmul timed in the same
    rounds, counting useful work (the product's recomputation in the backward pass not counted)."""
    rs = bench_lines(rows, "bench/attention/core/")
    table = _md(["combine", "shape", "ms", "useful GFLOP/s", "of the matmul's", "executed GFLOP/s", "matmul GFLOP/s"],
                [[r["model"].rsplit("_", 1)[-1], f"{_shape_label(r['shape'])}, {r['split'].split(', pooled')[0]}",
                  f"{r['metrics']['ms']:.1f}", f"{r['metrics']['useful_gflops']:.1f}",
                  f"{100 * r['metrics']['useful/peak']:.0f}%", f"{r['metrics']['executed_gflops']:.1f}",
                  f"{r['metrics']['matmul_gflops']:.1f}"] for r in rs])
    return "\n".join([table, "", _provenance(rs, "bench/attention/core/*")]).rstrip()


def _kron_lines(rows: list[dict]) -> list[dict]:
    return [r for r in attention_lines(rows) if r["model"] in ("kron_product", "kron_sum")]


def _kron_time(rows: list[dict]) -> str:
    return f"{_range([r['metrics']['t/paper'] for r in _kron_lines(rows)])}x"


def _kron_memory(rows: list[dict]) -> str:
    return f"{_range([r['metrics']['mem/paper'] for r in _kron_lines(rows)])}x"


def _full_speedup(rows: list[dict]) -> str:
    ms = {r["model"]: r["metrics"]["fwd_bwd_ms"] for r in attention_lines(rows) if r["shape"] == [16, 16, 16]}
    return f"{ms['full'] / ms['kron_product']:.0f}x"


def table_kernels(rows: list[dict]) -> str:
    """docs/reproducing.md's kernel-efficiency claims."""
    return _md(["claim", "command", "hoformer"], [
        ["Kronecker attention is cheaper than the paper's equations", "`python benchmarks/attention.py --reps 5`",
         f"{_kron_time(rows)} the time, {_kron_memory(rows)} the peak memory ({hardware_short(_kron_lines(rows))})"],
        ["Kronecker against full attention at 16^3 tokens", "same",
         f"{_full_speedup(rows)} faster (forward + backward)"],
        ["the triplet kernel against Algorithm 1 (L=512, block 32)", "`python benchmarks/triplet.py --part target`",
         "{} the time, {} the peak memory".format(*_triplet(rows).split(" / "))],
        ["cost growth in the number of tokens", "`hoformer bench --models hot_volume_classifier`",
         "growth exponents: [Analysis](analysis.md#flops-time-and-memory-hot-figs-6-7-hoformer-bench)"],
    ])


def _triplet(rows: list[dict]) -> str:
    r = latest(pick(rows, experiment="bench/triplet/target"))[-1]
    m = r["metrics"]
    return f"{m['fast_s'] / m['naive_s']:.2f}x / {m['fast_peak_mib'] / m['naive_peak_mib']:.2f}x"


# ------------------------------------------------------------------------------------------- analysis.md
# docs/analysis.md: stable ranks and head counts of short training runs (``task: analysis``) and ``hoformer bench``'s
# growth exponents and analytic FLOPs (``task: benchmark``, experiments ``bench/growth/*``, ``bench/flops/*``).
PAPER["hot/flops_224"] = {"kronecker": 371.6, "full": 775.3, "divided": 1210,
                          "source": "HOT Fig 6, GFLOPs per 224^3 volume, configuration not stated"}

ANALYSIS_LABELS = {"hot_product": "HOT product", "hot_sum": "HOT sum", "full": "full attention",
                   "kronecker_product": "Kronecker product", "kronecker_sum": "Kronecker sum",
                   "kronecker_linear": "Kronecker linear (FAVOR+)", "axial": "axial", "divided": "divided"}
#: the attention types of ``hoformer bench``, in its order
BENCH_ATTENTIONS = ("kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial", "divided")
GROWTH = (("exp_flops", "analytic FLOPs"), ("exp_fwd", "forward time"), ("exp_fwdbwd", "forward+backward time"),
          ("exp_mem", "peak memory"))


def _lines_under(rows: list[dict], prefix: str) -> list[dict]:
    """The newest line of each experiment whose name starts with ``prefix``."""
    return latest([r for r in rows if r["experiment"].startswith(prefix)])


def _sr(v: float | None) -> str:
    """A logged stable rank as recorded (4 significant digits at most)."""
    return "" if v is None else f"{v:.4g}"


def _span(vals: list[float], fmt=_sr) -> str:
    lo, hi = min(vals), max(vals)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def _transcribed(rs: list[dict], names: str) -> str:
    """Where a block's lines come from: their ledger names, record, hardware, torch and dates."""
    sources: dict[str, list[str]] = {}
    for r in rs:
        m = re.fullmatch(r"transcribed: (\S+) at (\w+); run log not kept", r.get("record", "campaign"))
        file, sha = (f"transcribed from {m.group(1)}", m.group(2)) if m else (r.get("record", "campaign"), r["commit"])
        sources.setdefault(file, [])
        if sha not in sources[file]:
            sources[file].append(sha)
    how = "; ".join(f"{k} at {', '.join(v)}" for k, v in sources.items())
    how += ", run logs not kept" if any(k.startswith("transcribed") for k in sources) else ""
    torch_ = ", ".join(dict.fromkeys("not recorded" if r["torch"] is None else r["torch"] for r in rs))
    return (f"Ledger lines `{names}` ({how}): {', '.join(dict.fromkeys(r['hardware'] for r in rs))}; "
            f"torch {torch_}; {', '.join(dict.fromkeys(r['date'] for r in rs))}.")


def table_stable_ranks(rows: list[dict], dataset: str, modes: list[str], val: tuple[str, str]) -> str:
    """Validation metric and stable ranks (per mode, product, sum, full) of the runs ``analysis/stable_rank/DATASET/*``;
    then eq 11 checked from the lines (the product of the mode-wise stable ranks against the logged product's) and the
    Kronecker sum's stable rank against the product's."""
    rs = _lines_under(rows, f"analysis/stable_rank/{dataset}/")
    name, header = val
    cols = [f"val/sr/mode{i}" for i in range(len(modes))] + ["val/sr/product", "val/sr/sum", "val/sr/full"]
    cols = [c for c in cols if any(c in r["metrics"] for r in rs)] or cols
    heads = {f"val/sr/mode{i}": f"sr {m}" for i, m in enumerate(modes)}
    body = [[ANALYSIS_LABELS.get(r["model"], r["model"]), _fmt(r["metrics"].get(name)),
             *(_sr(r["metrics"].get(c)) for c in cols)] for r in rs]
    table = _md(["run", header, *(heads.get(c, "sr " + c.rsplit("/", 1)[1]) for c in cols)], body)
    kron = [r for r in rs if {*heads, "val/sr/product"} <= set(r["metrics"])]
    if not rs:
        return table
    out = [table, ""]
    if kron:
        checks = []
        for r in kron:
            factors = [r["metrics"][c] for c in heads]
            prod = 1.0
            for f in factors:
                prod *= f
            checks.append(f"{ANALYSIS_LABELS.get(r['model'], r['model'])} {' x '.join(map(_sr, factors))} = "
                          f"{prod:.3f} (logged {_sr(r['metrics']['val/sr/product'])})")
        out.append(f"* **Product of the mode-wise stable ranks** (eq 11): {'; '.join(checks)}. The logged values are "
                   "means over batch, heads and layers, so the two agree up to that averaging.")
        both = [r for r in kron if "val/sr/sum" in r["metrics"]]
        if both:
            ratio = [r["metrics"]["val/sr/sum"] / r["metrics"]["val/sr/product"] for r in both]
            full = [r["metrics"]["val/sr/full"] for r in rs if "val/sr/full" in r["metrics"]]
            out.append(f"* **Kronecker sum against product** (same factors): sum {_span([r['metrics']['val/sr/sum'] for r in both])}, "
                       f"product {_span([r['metrics']['val/sr/product'] for r in both])}, i.e. "
                       f"{_span(ratio, lambda v: f'{v:.1f}')}x" + (f"; full attention {_span(full)}." if full else "."))
    out.append(f"* {_transcribed(rs, f'analysis/stable_rank/{dataset}/*')}")
    return "\n".join(out)


def table_heads(rows: list[dict]) -> str:
    """Validation MSE per number of heads (columns) and attention (rows) of ``analysis/heads/etth1/*``, the range of
    each row and of all runs."""
    rs = _lines_under(rows, "analysis/heads/etth1/")
    counts = sorted({r["heads"] for r in rs})
    body = []
    for model in dict.fromkeys(r["model"] for r in rs):
        by = {r["heads"]: r["metrics"]["val/mse"] for r in pick(rs, model=model)}
        body.append([LABELS.get(model, model), *(_fmt(by.get(h), 4) for h in counts),
                     _span(list(by.values()), lambda v: f"{v:.4f}")])
    table = _md(["attention", *(f"{h} head{'s' * (h != 1)}" for h in counts), "range"], body)
    if not rs:
        return table
    mses = [r["metrics"]["val/mse"] for r in rs]
    return "\n".join([table, "", f"* All {len(rs)} runs: validation MSE {_span(mses, lambda v: f'{v:.4f}')}, a spread of "
                      f"{max(mses) - min(mses):.4f} ({100 * (max(mses) - min(mses)) / _mean(mses):.1f}% of their mean).",
                      f"* {_transcribed(rs, 'analysis/heads/etth1/*')}"])


def _runs(lines: list[dict]) -> list[dict[str, dict]]:
    """The lines of one ``hoformer bench`` call each (same commit and date), in ledger order: {attention: metrics}."""
    runs: dict[tuple, dict[str, dict]] = {}
    for r in lines:
        runs.setdefault((r["commit"], r["date"]), {})[r["model"]] = r["metrics"]
    return list(runs.values())


def table_bench_growth(rows: list[dict]) -> str:
    """``hoformer bench``'s growth exponents (``bench/growth/*``): per attention type the newest line holding all four
    exponents; then the change between runs of the same command (largest difference, whether the order of the types
    changed) and the time per sample at the sizes the lines record (``time_fwdbwd_ms@TOKENS``)."""
    lines = [r for r in pick(rows, task="benchmark") if r["experiment"].startswith("bench/growth/")]
    full_lines = {}
    for r in lines:
        if all(k in r["metrics"] for k, _ in GROWTH):
            full_lines[r["model"]] = r  # the newest complete line wins
    order = [a for a in BENCH_ATTENTIONS if a in full_lines] + [a for a in full_lines if a not in BENCH_ATTENTIONS]
    body = []
    for a in order:
        r = full_lines[a]
        label = ANALYSIS_LABELS.get(a, a)
        if "every factor by associativity" in r.get("metrics_note", ""):
            label += ", every factor by associativity (see below)"
        body.append([label, *(f"{r['metrics'][k]:.2f}" for k, _ in GROWTH)])
    table = _md(["attention", *(h for _, h in GROWTH)], body)
    if not lines:
        return table
    out = [table, ""]
    runs = _runs(lines)
    if len(runs) > 1:
        keys = ("exp_fwd", "exp_fwdbwd")
        common = [a for a in BENCH_ATTENTIONS if all(a in run and all(k in run[a] for k in keys) for run in runs)]
        diffs = [(max(v) - min(v), ANALYSIS_LABELS.get(a, a), k) for a in common for k in keys
                 for v in [[run[a][k] for run in runs]]]
        same = all(len({tuple(sorted(common, key=lambda a: run[a][k])) for run in runs}) == 1 for k in keys)
        per_run = "; ".join(
            f"run {i + 1}: " + ", ".join(f"{run[a]['exp_fwd']:.2f} / {run[a]['exp_fwdbwd']:.2f} ({ANALYSIS_LABELS.get(a, a)})"
                                         for a in common) for i, run in enumerate(runs))
        d, who, k = max(diffs)
        out.append(f"* **Run to run** ({len(runs)} runs of the same command), forward / forward+backward exponents: "
                   f"{per_run}. The largest change between runs is {d:.2f} ({who}, "
                   f"{'forward' if k == 'exp_fwd' else 'forward+backward'}); the order of the types by exponent "
                   f"{'is the same in every run' if same else 'changes between runs'}.")
    timed: dict[int, dict[str, float]] = {}
    for r in lines:  # the newest line holding a timing gives it
        for k, v in r["metrics"].items():
            if k.startswith("time_fwdbwd_ms@"):
                timed.setdefault(int(k.split("@")[1]), {})[r["model"]] = v
    for tokens, by in sorted(timed.items()):
        cells = [f"{by[a]:.0f} ms ({ANALYSIS_LABELS.get(a, a)})" for a in BENCH_ATTENTIONS if a in by]
        ratio = (f": full attention takes {by['full'] / by['kronecker_product']:.0f}x the Kronecker product's time"
                 if {"full", "kronecker_product"} <= set(by) else "")
        out.append(f"* **At {tokens:,} tokens**, forward+backward per sample: {' vs '.join(cells)}{ratio}.")
    out.append(f"* {_transcribed(lines, 'bench/growth/*')} Command: `{lines[0]['command']}`.")
    return "\n".join(out)


def table_bench_flops(rows: list[dict]) -> str:
    """Analytic GFLOPs per sample of ``hot_volume_classifier`` on one volume size (``bench/flops/*``), one column per
    patch size, with the paper's; then the lower bound of full attention's matmuls, ``4 h e N^2 depth``
    (``h e`` = width), from the lines' sizes."""
    lines = latest([r for r in pick(rows, task="benchmark") if r["experiment"].startswith("bench/flops/")])
    patches = sorted({r["patch"] for r in lines})
    side = lambda r: r["shape"][0] // r["patch"]
    tokens = {p: next(side(r) ** len(r["shape"]) for r in lines if r["patch"] == p) for p in patches}
    paper = PAPER["hot/flops_224"]
    pcell = {"kronecker_product": f"{paper['kronecker']} (Kronecker)", "kronecker_sum": f"{paper['kronecker']} (Kronecker)",
             "full": str(paper["full"]), "divided": str(paper["divided"])}
    models = [a for a in BENCH_ATTENTIONS if any(r["model"] == a for r in lines)]
    body = []
    for a in models:
        by = {r["patch"]: r["metrics"]["gflops"] for r in lines if r["model"] == a}
        body.append([ANALYSIS_LABELS.get(a, a), *(f"{by[p]:,g}" if p in by else "-" for p in patches), pcell.get(a, "-")])
    head = [f"patch {p} ({round(tokens[p] ** (1 / 3))}^3 = {tokens[p]:,} tokens)" for p in patches]
    table = _md(["attention, GFLOPs per sample", *head, "paper (configuration not stated)"], body)
    full = [r for r in lines if r["model"] == "full" and r["patch"] == min(patches)] if lines else []
    if not lines:
        return table
    out = [table, ""]
    if full:
        r = full[0]
        n = tokens[r["patch"]]
        bound = 4 * r["dim"] * n ** 2 * r["depth"]
        out.append(f"* **Full attention's lower bound** at {n:,} tokens: its attention matmuls alone cost "
                   f"`4 h e N^2 depth` = 4 x {r['dim']} x {n:,}^2 x {r['depth']} = "
                   f"{bound / 10 ** (e := len(str(int(bound))) - 1):.1f}e{e} FLOPs "
                   f"({bound / 1e9:,.0f} GFLOPs); counted: {r['metrics']['gflops']:,g}.")
    kron = [r for r in lines if r["model"] == "kronecker_product" and r["patch"] == min(patches)]
    if kron:
        g = kron[0]["metrics"]["gflops"]
        out.append(f"* **Kronecker against the paper**: {g:,g} GFLOPs, {g / paper['kronecker']:.2f}x the paper's "
                   f"{paper['kronecker']} ({paper['source']}).")
    out.append(f"* {_transcribed(lines, 'bench/flops/*')} Commands: "
               f"{', '.join(f'`{c}`' for c in dict.fromkeys(r['command'] for r in lines))}.")
    return "\n".join(out)


# each: task, dataset, metric, paper, hoformer (rows -> str), the lines behind it (rows -> lines), docs page#anchor
SUMMARY = [
    ("forecasting (HOT)", "ETTh1, 4 horizons, CPU budget", "MSE", "0.454 (iTransformer)", _etth1,
     lambda rows: [r for r in pick(rows, **ETTH1_EMA) if r["seed"] in SEEDS5], "results_hot.md#forecasting-etth1-four-horizons"),
    ("forecasting (HOT)", "ETTh1, 4 horizons, paper size, early-stopped", "MSE", "0.454 (iTransformer)", _etth1_paper,
     lambda rows: pick(rows, dataset="ETTh1", scale="paper"), "results_hot.md#paper-scale"),
    ("forecasting (HOT)", "Weather, 4 horizons, CPU budget", "MSE / MAE", "0.245 / 0.275",
     lambda rows: f"HOT sum {_fmt(_horizon_avg(rows, 'test/mse', **WEATHER_SUM))} / "
                  f"{_fmt(_horizon_avg(rows, 'test/mae', **WEATHER_SUM))}",
     lambda rows: pick(rows, **WEATHER_SUM), "results_hot.md#forecasting-weather-four-horizons"),
    ("3D classification (HOT)", "AdrenalMNIST3D, paper recipe", "AUC / ACC", "88.6 / 83.8", _adrenal,
     lambda rows: pick(rows, **ADRENAL), "results_hot.md#3d-classification-adrenalmnist3d-283"),
    ("traffic (Weaver)", "Los-loop, 30 / 60 min", "MAE", "-",
     lambda rows: "Weaver {:.2f} / {:.2f}".format(*_traffic(rows, "weaver_NT")) +
                  f" (best baseline {_best_traffic_baseline(rows)})",
     lambda rows: [ln for r in traffic_runs(rows) if r["model"] == "weaver_NT" for ln in r["lines"]],
     "results_traffic.md#current-results"),
    ("traffic (Weaver)", "METR-LA / PEMS-BAY", "MAE",
     f"{PAPER['metr_la/weaver']['mae']:.2f} / {PAPER['pems_bay/weaver']['mae']:.2f}", lambda rows: "not run (no data here)",
     lambda rows: [], "reproducing.md#weaver-traffic-forecasting"),
    ("text (HOBA)", "TREC test", "accuracy %", "-", lambda rows: _text(rows, "trec"),
     lambda rows: pick(rows, task="text", dataset="trec", model="hoba"), "results_text.md#results"),
    ("text (HOBA)", "SST-2 dev", "accuracy %", "-", lambda rows: _text(rows, "sst2"),
     lambda rows: pick(rows, task="text", dataset="sst2", model="hoba"), "results_text.md#results"),
    ("kernel (HOT)", "one layer, 4 shapes", "fwd+bwd time vs the paper's equations", "-", _kron_time,
     _kron_lines, "benchmarks.md#kronecker-attention-benchmarksattentionpy"),
    ("kernel (HOT)", "one layer, 16^3 tokens", "fwd+bwd speed-up vs full attention", "-", _full_speedup,
     lambda rows: [r for r in attention_lines(rows) if r["shape"] == [16, 16, 16] and r["model"] in ("full", "kron_product")],
     "benchmarks.md#kronecker-attention-benchmarksattentionpy"),
    ("kernel (HOBA)", "L=512, block 32", "time / memory vs Algorithm 1", "-", _triplet,
     lambda rows: pick(rows, experiment="bench/triplet/target"), "benchmarks.md#hoba-triplet-attention-kernel"),
]


def table_summary(rows: list[dict], prefix: str = "") -> str:
    """One row per task and dataset: the paper's number, hoformer's from the ledger, seeds, hardware, where the
    command is (``prefix``: the docs folder as seen from the page)."""
    body = []
    for task, dataset, name, paper, value, lines, link in SUMMARY:
        rs = lines(rows)
        seeds = [s for s in seeds_of(rs) if s is not None]
        body.append([task, dataset, name, paper, value(rows), str(len(seeds)) if seeds else "-",
                     hardware_short(rs) if rs else "-", f"[command]({prefix}{link})"])
    return _md(["task", "dataset", "metric", "paper", "hoformer", "seeds", "hardware", "how"], body)


def table_hot_summary(rows: list[dict]) -> str:
    """The HOT page's summary: the rows of :data:`SUMMARY` for HOT, plus the joint-horizon ETTh1 model."""
    joint = pick(rows, dataset="ETTh1", variant="ema_joint")
    direct = pick(rows, dataset="ETTh1", variant="ema", model="hot_product", seed=2024)
    same = lambda rs: _mean([metric(r, ("test_2161/mse", "test/mse"), h) for h in HORIZONS for r in rs
                              if metric(r, ("test_2161/mse", "test/mse"), h) is not None])
    body = []
    for task, dataset, name, paper, value, lines, link in SUMMARY[:4]:
        rs = lines(rows)
        body.append([f"{task}, {dataset}", name, paper, value(rows), str(len(seeds_of(rs))) if rs else "-",
                     hardware_short(rs) if rs else "-", f"[details]({link.split('.md', 1)[1]})"])
    if joint and len(direct) == len(HORIZONS):
        body.insert(1, ["forecasting (HOT), ETTh1, one 720-step model for all 4 horizons, CPU budget",
                        "MSE on the 2161 test windows all horizons share", "-",
                        f"joint model {same(joint):.3f}; 4 direct models {same(direct):.3f}", "1",
                        hardware_short(joint), "[details](#forecasting-one-model-for-every-horizon)"])
    return _md(["task, dataset", "metric", "paper", "hoformer", "seeds", "hardware", "how"], body)


# ---------------------------------------------------------------------------------------------- page tables
def _paper_avg(key: str) -> str:
    return f"{PAPER[key]['mse']:.3f} / {PAPER[key]['mae']:.3f}"


def _etth1(model: str, **more) -> dict:
    return dict(dataset="ETTh1", model=model, **more)


EMA_GROUPS = [(LABELS[m], ETTH1_EMA | {"model": m}) for m in ("hot_product", "hot_sum", "spatial")]
GRID = lambda m: _etth1(m, variant="grid")
NO_EMA = lambda m: _etth1(m, experiment=lambda e: not e.endswith(("+ema", "+ema998")) and "+" not in e.rsplit("/", 1)[-1])
DIRECT = _etth1("hot_product", variant="ema", seed=2024)
CAUSAL = lambda v: _etth1("hot_causal", variant=v)
SAME = ("test_2161/mse", "test/mse"), ("test_2161/mae", "test/mae")
WEATHER = [("HOT (product), 12-min cap", dict(dataset="weather", model="hot_product", variant="rerun")),
           ("HOT (product), run to its end", dict(dataset="weather", model="hot_product", variant="uncapped")),
           ("HOT (sum), 12-min cap", dict(dataset="weather", model="hot_sum", variant="rerun")),
           ("HOT (sum), EMA 0.99", WEATHER_SUM),
           ("Transformer (spatial) = iTransformer, 12-min cap", dict(dataset="weather", model="spatial", variant="rerun")),
           ("Transformer (temporal), 12-min cap", dict(dataset="weather", model="temporal", variant="rerun"))]


def _ltsf_cell(rows: list[dict], seeds: list | None, **select) -> tuple[str, list]:
    """``MSE / MAE`` averaged over the four horizons (and over ``seeds``; None: the lines' single seed), ``-`` for a
    metric the lines do not hold for every seed and horizon; and the seeds."""
    rs = pick(rows, **select)
    seeds = seeds if seeds is not None else seeds_of(rs)
    out = []
    for name in ("test/mse", "test/mae"):
        vals = [horizon_average(rs, s, name) for s in seeds]
        out.append("-" if not vals or any(v is None for v in vals) else f"{_mean(vals):.3f}")
    return " / ".join(out), seeds


def table_reproducing_ltsf(rows: list[dict]) -> str:
    """docs/reproducing.md's forecasting table: four-horizon averages of the CPU-budget runs against the papers."""
    itr = _paper_avg("ETTh1/avg") + " (iTransformer paper)"
    groups = [
        ("ETTh1", "HOT product", f"not in the paper (iTransformer {_paper_avg('ETTh1/avg')})", "CPU configs + EMA 0.99",
         SEEDS5, ETTH1_EMA | {"model": "hot_product"}),
        ("ETTh1", "HOT sum", "not in the paper", "CPU configs + EMA 0.99", SEEDS5, ETTH1_EMA | {"model": "hot_sum"}),
        ("ETTh1", "spatial (= iTransformer)", itr, "CPU configs + EMA 0.99", SEEDS5, ETTH1_EMA | {"model": "spatial"}),
        ("Weather", "HOT sum", _paper_avg("weather/hot/avg"), "CPU config + EMA 0.99, early stopping", None, WEATHER_SUM),
        ("Weather", "HOT product", _paper_avg("weather/hot/avg"), "CPU config, early stopping", None,
         dict(dataset="weather", model="hot_product", variant="uncapped")),
        ("Weather", "spatial (= iTransformer)", _paper_avg("weather/spatial/avg"), "CPU config, 12-minute cap", None,
         dict(dataset="weather", model="spatial", variant="rerun")),
    ]
    body = []
    for ds, model, paper, budget, seeds, select in groups:
        cell, used = _ltsf_cell(rows, seeds, **select)
        body.append([ds, model, paper, cell, budget, ", ".join(map(str, used)) or "-"])
    return _md(["dataset, average of 4 horizons", "model", "paper MSE / MAE", "hoformer MSE / MAE", "budget", "seeds"],
               body)


def table_reproducing_traffic(rows: list[dict]) -> str:
    """docs/reproducing.md's Los-loop rows: Weaver NT and the best baseline, MAE at 30 / 60 minutes."""
    body = []
    runs = traffic_runs(rows)
    weaver = [r for r in runs if r["model"] == "weaver_NT"]
    base = [r for r in runs if not r["model"].startswith("weaver")]
    best = [min(base, key=lambda r: r["metrics"]["test/mae@30m"])] if base else []
    for label, rs in (("Weaver NT (Tanimoto)", weaver), (f"best baseline (`{best[0]['model']}`)" if best else "", best)):
        for r in rs:
            body.append(["Los-loop", label, "-", f"{r['metrics']['test/mae@30m']:.2f} / {r['metrics']['test/mae@60m']:.2f}",
                         f"{r['epochs']} epochs", ", ".join(map(str, seeds_of([r])))])
    return _md(["dataset", "model", "paper MAE", "hoformer MAE 30 / 60 min", "budget", "seeds"], body)


def _weather_paper(rs: list[dict]) -> str:
    return _paper_avg({"spatial": "weather/spatial/avg", "temporal": "weather/temporal/avg"}
                      .get(rs[0]["model"], "weather/hot/avg"))


TABLES = {  # the name in `<!-- ledger:NAME -->` -> how the ledger renders it
    "hot/precision": lambda rows: table_runs(rows, experiment=lambda e: e.endswith(("+fp32", "+bf16"))),
    "results/overview": lambda rows: table_summary(rows),
    "results/readme": lambda rows: table_summary(rows, prefix="docs/"),
    "hot/summary": table_hot_summary,
    "analysis/etth1_stable_ranks": lambda rows: table_stable_ranks(rows, "etth1", ["variates (7)", "time (24)"],
                                                                   ("val/mse", "val MSE")),
    "analysis/weather_stable_ranks": lambda rows: table_stable_ranks(rows, "weather", ["variates (21)", "time"],
                                                                     ("val/mse", "val MSE")),
    "analysis/adrenal_stable_ranks": lambda rows: table_stable_ranks(rows, "adrenal", ["depth", "height", "width"],
                                                                     ("val/auc", "val AUC")),
    "analysis/heads": table_heads,
    "analysis/bench_growth": table_bench_growth,
    "analysis/bench_flops": table_bench_flops,
    "reproducing/ltsf": table_reproducing_ltsf,
    "reproducing/traffic": table_reproducing_traffic,
    "hot/etth1_seeds": lambda rows: table_seeds(rows, EMA_GROUPS, SEEDS5,
                                                paper={LABELS["spatial"]: _paper_avg("ETTh1/avg") + " (iTransformer)"}),
    "hot/etth1_seed2024": lambda rows: table_horizons(rows, [(l, s | {"seed": 2024}) for l, s in EMA_GROUPS],
                                                      metrics=("test/mse",)),
    "hot/etth1_grid": lambda rows: table_horizons(rows, [(LABELS[m], GRID(m)) for m in LABELS]),
    "hot/etth1_seed_spread": lambda rows: table_seeds(rows, [
        ("HOT (product), no EMA", NO_EMA("hot_product")), ("Transformer (spatial), no EMA", NO_EMA("spatial")),
        ("HOT (product), EMA 0.99", ETTH1_EMA | {"model": "hot_product"}),
        ("HOT (product), EMA 0.998", _etth1("hot_product", experiment=lambda e: e.endswith("+ema998")))],
        [2024, 2025, 2026]),
    "hot/etth1_one_model": lambda rows: table_horizons(rows, [
        ("direct, 4 models", DIRECT), ("joint, 1 model (`etth1_96_720_joint.yaml`)", _etth1("hot_product", variant="ema_joint")),
        ("joint, official preset (`etth1_96_720_official.yaml`)", _etth1("hot_product", variant="ema_official")),
        ("causal, 1 model (`etth1_96_causal.yaml`)", CAUSAL("causal"))],
        extra=[("fits, wall-clock per fit", fits), ("epochs run (best)", epochs_best)]),
    "hot/etth1_same_windows": lambda rows: table_horizons(rows, [
        ("direct, 4 models", DIRECT), ("joint", _etth1("hot_product", variant="ema_joint")),
        ("joint, official preset", _etth1("hot_product", variant="ema_official")),
        ("causal", CAUSAL("causal"))], metrics=SAME),
    "hot/etth1_qk_bias": lambda rows: table_per_seed(rows, [
        ("False (default)", _etth1("hot_product", horizon=96, experiment=lambda e: e.endswith("+ema"))),
        ("True", _etth1("hot_product", horizon=96, experiment=lambda e: e.endswith("+ema+qk_bias")))],
        [2024, 2025, 2026], first="`qk_bias`"),
    "hot/etth1_causal": lambda rows: table_horizons(rows, [
        ("HOT product, four direct models + EMA", DIRECT),
        ("causal HOT product, loss on the horizon's patches (default)", CAUSAL("causal")),
        ("causal HOT product, loss at every position (`train_positions=all`)", CAUSAL("causal_all"))],
        extra=[("fits", lambda rs: str(len(rs)))]),
    "hot/weather": lambda rows: table_horizons(rows, WEATHER, extra=[
        ("paper avg", _weather_paper), ("epochs run (best)", epochs_best)]),
    "hot/adrenal": lambda rows: table_classification(rows, [
        ("HOT (product), flips + shifts", ADRENAL),
        ("HOT (product), flips only", dict(dataset="AdrenalMNIST3D", model="hot_product", augment="flips")),
        ("3D CNN reference `cnn3d_classifier` (GroupNorm, 0.2M parameters), no augmentation",
         dict(dataset="AdrenalMNIST3D", model="cnn3d"))],
        mean_of=("HOT (product), flips + shifts, mean", ADRENAL), paper=("paper, HOT (product)", "adrenal/hot_product")),
    "hot/etth1_paper": lambda rows: table_forecast(rows, ("iTransformer, its paper", PAPER["ETTh1/itransformer"]),
                                                   dataset="ETTh1", scale="paper"),
    "hot/weather_paper": lambda rows: table_forecast(rows, dataset="weather", scale="paper"),
    "hot/paper_runs": lambda rows: table_runs(rows, scale="paper"),
    "traffic/summary": lambda rows: _md(
        ["dataset", "model", "metric", "paper", "hoformer", "seeds"],
        [["Los-loop, 30 / 60 min", "Weaver NT (Tanimoto), 8 epochs", "MAE (mph)", "-",
          "{:.2f} / {:.2f}".format(*_traffic(rows, "weaver_NT")), "3"],
         ["Los-loop, 30 / 60 min", "best baseline (alternating temporal / spatial attention)", "MAE (mph)", "-",
          _best_traffic_baseline(rows), "3"]]),
    "traffic/los_loop": table_traffic,
    "text/summary": lambda rows: _md(
        ["dataset", "student (2 layers, width 64)", "metric", "paper", "hoformer", "seeds"],
        [[name, "HOBA / 2D block-local / 2D full", "accuracy %", "-",
          " / ".join(f"{_text_mean(rows, ds, m):.1f}" for m in ("hoba", "block2d", "full2d")),
          str(len(seeds_of(pick(rows, task="text", dataset=ds, model="hoba"))))]
         for name, ds in (("TREC test", "trec"), ("SST-2 dev", "sst2"))]),
    "text/students": table_text,
    "bench/attention": table_attention,
    "bench/attention_linear": table_attention_linear,
    "bench/attention_core": table_attention_core,
    "reproducing/kernels": table_kernels,
    "bench/compile": lambda rows: table_compile(rows),
    "bench/train_step": lambda rows: table_train_step(rows),
    "bench/decode": lambda rows: table_decode(rows),
    "bench/accelerator_chunk": lambda rows: table_accelerator_chunk(rows),
    "bench/weaver": lambda rows: table_weaver(rows),
    "bench/triplet_target": lambda rows: table_triplet_target(rows),
    "bench/triplet_scaling": lambda rows: table_triplet_scaling(rows),
    "bench/attention_gpu": lambda rows: table_attention(rows, "+cuda"),
    "bench/train_step_gpu": lambda rows: table_train_step(rows, ("+cuda", "+cuda-bf16")),
    "bench/decode_gpu": lambda rows: table_decode(rows, "+cuda"),
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


# ------------------------------------------------------------------------- docs/benchmarks.md: the other scripts
def _compile_ratio(m: dict) -> float | None:
    """Compiled / eager step time of a ``benchmarks/compile.py`` line (a line that kept only the ratio gives it)."""
    return m["compiled_ms"] / m["eager_ms"] if {"compiled_ms", "eager_ms"} <= set(m) else m.get("compiled/eager")


def table_compile(rows: list[dict]) -> str:
    """``benchmarks/compile.py``: eager against compiled with CompileModel's arguments, and plain ``torch.compile``."""
    rs = bench_lines(rows, "bench/compile/")
    by: dict[str, dict[str, dict]] = {}
    for r in rs:
        by.setdefault(r["case"], {})[r["variant"]] = r["metrics"]
    body, ratios, plain = [], [], []
    for case, v in by.items():
        if "compiled" not in v:
            continue
        m, p = v["compiled"], v.get("compiled-plain")
        ratios.append(_compile_ratio(m))
        plain += [_compile_ratio(p)] if p else []
        body.append([case, f"{m['eager_ms']:.1f}", f"{m['compiled_ms']:.1f}", f"**{ratios[-1]:.2f}**",
                     _fmt(p and _compile_ratio(p), 2), _fmt(m.get("compile_s"), 0)])
    table = _md(["model", "eager ms/step", "compiled ms/step (CompileModel)", "compiled / eager",
                 "plain `torch.compile` / eager", "compile s"], body)
    if not ratios:
        return table
    return "\n".join([table, "", f"* **Compiled / eager step time: {_range(ratios)}x** with `CompileModel`'s arguments"
                      + (f", {_range(plain)}x with plain `torch.compile`." if plain else "."),
                      f"* {_provenance(rs, 'bench/compile/*')}"])


def table_train_step(rows: list[dict], suffixes: tuple[str, ...] = ("",)) -> str:
    """``benchmarks/train_step.py``: hoformer's layer against the paper layer, eager and compiled, per precision
    (``suffixes``: :func:`device_suffix` of the lines shown; ``""``: CPU, fp32), and each step against hoformer's
    eager step of the same case and precision; peak memory where measured (GPU)."""
    rs = [r for sfx in suffixes for r in bench_lines(rows, "bench/train_step/", sfx)]
    precision = lambda r: r["split"].rsplit(", ", 1)[-1]
    eager = {(r["case"], precision(r)): r["metrics"]["hoformer_ms"] for r in rs if r["variant"] == "eager"}
    body = []
    for r in rs:
        m, e = r["metrics"], eager.get((r["case"], precision(r)))
        body.append([r["case"], precision(r), r["variant"], f"{m['hoformer_ms']:.0f}" if m["hoformer_ms"] >= 100
                     else f"{m['hoformer_ms']:.1f}", f"{m['paper_ms']:.0f}" if m["paper_ms"] >= 100
                     else f"{m['paper_ms']:.1f}", f"**{m['hoformer_ms'] / m['paper_ms']:.2f}**",
                     f"{m['hoformer_ms'] / e:.2f}" if e else "-"])
    memory = any("hoformer_mib" in r["metrics"] for r in rs)
    for row, r in zip(body, rs) if memory else ():
        row += [_fmt(r["metrics"].get("hoformer_mib"), 0), _fmt(r["metrics"].get("paper_mib"), 0)]
    table = _md(["case", "precision", "variant", "hoformer ms/step", "paper ms/step", "hoformer / paper",
                 "hoformer / its eager step", *(["hoformer MiB", "paper MiB"] if memory else [])], body)
    return "\n".join([table, "", _provenance(rs, *(f"bench/train_step/*{s}" for s in suffixes))]).rstrip()


def _speedup(m: dict) -> float:
    """A decoding line's speed-up of the cache: full causal forward / cached step (a line that kept only the ratio
    gives it)."""
    return m["full_ms"] / m["step_ms"] if "step_ms" in m else m["speedup"]


def table_decode(rows: list[dict], suffix: str = "") -> str:
    """``benchmarks/decode.py``: per attention type and number of past steps, the newest full measurement (cached step,
    full causal forward, their ratio) and the speed-ups of the other runs of that experiment on the same hardware
    (``suffix``: :func:`device_suffix` of the lines; ``""``: CPU)."""
    sel = [r for r in pick(rows, task="benchmark") if _on(r["experiment"], "bench/decode/", suffix)]
    mains = []
    for e in dict.fromkeys(r["experiment"] for r in sel):
        runs = [r for r in sel if r["experiment"] == e]
        full = [r for r in runs if "step_ms" in r["metrics"]]
        if full:
            mains.append((full[-1], [r for r in runs if r is not full[-1] and r["hardware"] == full[-1]["hardware"]]))
    mains.sort(key=lambda x: x[0]["past"])  # stable: the attention types in ledger order
    if not mains:
        return _md(["attention", "past steps", "ms / step, min (median)", "full causal forward ms", "speed-up",
                    "speed-up, other runs"], [])
    longest = max(r["past"] for r, _ in mains)
    body = []
    for r, others in mains:
        m, s = r["metrics"], f"{_speedup(r['metrics']):.0f}x"
        body.append([f"`{r['model']}`", r["past"], f"{m['step_ms']:.2f} ({m['step_median_ms']:.2f})",
                     f"{m['full_ms']:.0f}", f"**{s}**" if r["past"] == longest else s,
                     ", ".join(f"{_speedup(o['metrics']):.0f}x" for o in others) or "-"])
    table = _md(["attention", "past steps", "ms / step, min (median)", "full causal forward ms", "speed-up",
                 "speed-up, other runs"], body)
    steps = [r["metrics"]["step_ms"] for r, _ in mains]
    slowest = max((r for r, _ in mains if r["past"] == longest), key=lambda r: r["metrics"]["full_ms"])
    pasts = sorted({r["past"] for r, _ in mains})
    return "\n".join([table, "", f"* **The cached step stays at {min(steps):.0f}-{max(steps):.0f} ms from {pasts[0]} "
                      f"to {longest} past steps** while the full causal forward grows with the sequence (`"
                      f"{slowest['model']}`: {slowest['metrics']['full_ms'] / 1e3:.0f} s at {longest} past steps).",
                      f"* {_provenance([x for main, os in mains for x in (main, *os)], f'bench/decode/*{suffix}')}"])


def table_accelerator_chunk(rows: list[dict]) -> str:
    """``benchmarks/accelerator_chunk.py`` on a GPU: the paper layer, the Kronecker layer with one chunk and with the
    bounded accelerator chunk (time and peak memory), then the ratios between them."""
    rs = bench_lines(rows, "bench/accelerator_chunk/", "+cuda")
    chunk = ", ".join(dict.fromkeys(f"{r['chunk_mib']} MiB" for r in rs)) or "bounded"
    cell = lambda m, k: f"{m[k + '_ms']:.1f} ms, {m[k + '_mib']:.0f} MiB"
    body = [[f"{_shape_label(r['shape']).replace(',', ', ')}, {r['batch']}", r["model"].removeprefix("kron_"),
             cell(r["metrics"], "paper"), cell(r["metrics"], "one_chunk"), f"**{cell(r['metrics'], 'chunked')}**"]
            for r in rs]
    table = _md(["shape, batch", "combine", "paper layer", "Kronecker layer, one chunk",
                 f"Kronecker layer, {chunk} chunks"], body)
    if not rs:
        return table
    ms = [r["metrics"] for r in rs]
    faster = [m["paper_ms"] / m[k] for m in ms for k in ("one_chunk_ms", "chunked_ms")]
    cut = [100 * (1 - m["chunked_mib"] / m["one_chunk_mib"]) for m in ms]
    more = max(100 * (m["chunked_ms"] / m["one_chunk_ms"] - 1) for m in ms)
    return "\n".join([table, "", f"* At this size the Kronecker layer is **{_range(faster, 1)}x faster than the paper "
                      f"layer**; the bounded chunk cuts its peak memory by {min(cut):.0f}-{max(cut):.0f}% against one "
                      f"chunk for at most {max(more, 0):.0f}% more time, leaving it at "
                      f"{_range([m['chunked_mib'] / m['paper_mib'] for m in ms])}x the paper layer's memory.",
                      f"* {_provenance(rs, 'bench/accelerator_chunk/*')}"])


def table_weaver(rows: list[dict]) -> str:
    """``benchmarks/weaver.py``: P^2-KMV against the dense map (time, peak memory, their ratios) and the training
    step of Weaver against one full spatiotemporal attention layer."""
    rs = bench_lines(rows, "bench/weaver/")
    by = {r["experiment"].removeprefix("bench/weaver/"): r for r in rs}
    kmv, dense = by.get("p2_kmv/kmv"), by.get("p2_kmv/dense")
    weaver, full = by.get("step/weaver"), by.get("step/traffic_full_attention")
    body = []
    if kmv and dense:
        k, d = kmv["metrics"], dense["metrics"]
        x = lambda key: f"{d[key] / k[key]:.0f}x" if k[key] > 0 else "-"
        body += [["P^2-KMV (`p2_kmv` = `kron_apply`)", f"**{k['ms']:,.1f} ms**", f"**{k['peak_mib']:,.1f} MiB**"],
                 ["dense: form `Theta_T (x) Theta_S` + apply", f"{d['ms']:,.0f} ms ({x('ms')})",
                  f"{d['peak_mib']:,.0f} MiB for a chunk of {dense['dense_chunk']} ({x('peak_mib')})"]]
    if weaver and full:
        body += [[f"`weaver` training step (Table 3 defaults, {weaver['params']:,} parameters)",
                  f"**{weaver['metrics']['step_s']:.2f} s**", ""],
                 ["`traffic_full_attention` training step (one layer, softmax SDPA over the P N tokens, "
                  f"{full['params']:,} parameters)", f"{full['metrics']['step_s']:.2f} s", ""]]
    table = _md(["", "time", "peak memory"], body)
    notes = []
    if weaver and full:
        x = full["metrics"]["step_s"] / weaver["metrics"]["step_s"]
        notes.append(f"* Weaver's step is {x:.1f}x faster" if x >= 1 else f"* Weaver's step is {1 / x:.1f}x slower")
        notes[-1] += " than a *single* full spatiotemporal attention layer's."
    if dense and "max_abs_err" in dense["metrics"]:
        notes.append(f"* max |dense - KMV| = {dense['metrics']['max_abs_err']:.1e} in float32.")
    return "\n".join([table, "", *notes, f"* {_provenance(rs, 'bench/weaver/*')}"]) if rs else table


def table_triplet_target(rows: list[dict]) -> str:
    """``benchmarks/triplet.py --part target``: the triplet kernel against Algorithm 1, and their ratios."""
    rs = bench_lines(rows, "bench/triplet/target")
    if not rs:
        return _md(["candidate", "fwd+bwd CPU time (s)", "peak memory (MiB)"], [])
    m = rs[-1]["metrics"]
    ratio = lambda k: m[f"fast_{k}"] / m[f"naive_{k}"] if f"fast_{k}" in m and f"naive_{k}" in m else None
    goal = lambda v, target: f"(target <= {target}: {'met' if v <= target else 'not met'})"
    t, mem = ratio("s"), ratio("peak_mib")
    body = [[name, f"{m[f'{k}_s']:.3f}", _fmt(m.get(f"{k}_peak_mib"), 1), _fmt(m.get(f"{k}_saved_mib"), 1),
             _fmt(m.get(f"{k}_gflop"), 1)] for name, k in (("naive (Algorithm 1)", "naive"),
                                                           ("fast `triplet_attention`", "fast"))]
    body.append(["**ratio fast / naive**", f"**{t:.2f}** {goal(t, 0.3)}",
                 "-" if mem is None else f"**{mem:.2f}** {goal(mem, 0.2)}", _fmt(ratio("saved_mib"), 3),
                 _fmt(ratio("gflop"), 2)])
    table = _md(["candidate", "fwd+bwd CPU time (s)", "peak memory (MiB)", "saved for backward (MiB)",
                 "GFLOP (fwd+bwd)"], body)
    notes = [f"* **Time: {t:.2f}x** the naive algorithm's {goal(t, 0.3)}."]
    if mem is not None and "naive_saved_mib" in m:
        notes.insert(0, f"* **Peak memory: {mem:.2f}x** (the naive algorithm keeps every window's score cube, softmax "
                        f"output and value-pair tensor for the backward, {m['naive_saved_mib']:.0f} MiB; the kernel "
                        f"keeps {m['fast_saved_mib']:.0f} MiB plus one tile).")
    return "\n".join([table, "", *notes, f"* {_provenance(rs, 'bench/triplet/target')}"])


def table_triplet_scaling(rows: list[dict], up_to: int = 1024) -> str:
    """``benchmarks/triplet.py --part scaling``: HOBA against 2D attention per sequence length, the ratios, where the
    operation counts cross (HOBA's count linear in L, 2D's quadratic) and where the measured times do."""
    rs = sorted(bench_lines(rows, "bench/triplet/scaling/"), key=lambda r: r["length"])
    mem = lambda m: m["hoba_peak_mib"] / m["full2d_peak_mib"] if "full2d_peak_mib" in m else None  # --no-memory
    body = [[r["length"], f"{m['hoba_ms']:.1f}", f"{m['full2d_ms']:.1f}", f"{m['hoba_ms'] / m['full2d_ms']:.1f}",
             _fmt(m.get("hoba_peak_mib"), 1), _fmt(m.get("full2d_peak_mib"), 1), _fmt(mem(m), 1),
             f"{m['hoba_gflop']:.2f}", f"{m['full2d_gflop']:.2f}"] for r in rs for m in [r["metrics"]]]
    table = _md(["L", "HOBA CPU ms", "2D CPU ms", "time HOBA/2D", "HOBA peak MiB", "2D peak MiB", "mem HOBA/2D",
                 "GFLOP HOBA", "GFLOP 2D"], body)
    if not rs:
        return table
    last = rs[-1]["metrics"]
    cross_ops = last["hoba_gflop"] / max(last["full2d_gflop"], 1e-12) * rs[-1]["length"]  # c1 L = c2 L^2
    times = [(r["length"], r["metrics"]["hoba_ms"] / r["metrics"]["full2d_ms"]) for r in rs]
    after = [i for i, (_, x) in enumerate(times) if x < 1]
    cross_t = (f"between L = {times[after[0] - 1][0]} and L = {times[after[0]][0]}" if after and after[0] > 0
               else f"not up to L = {times[-1][0]}" if not after else f"below L = {times[0][0]}")
    short = [x for L, x in times if L <= up_to]
    return "\n".join([table, "", f"* HOBA's operation count grows linearly with L and 2D attention's quadratically: "
                      f"they cross near L = {round(cross_ops, -2):.0f}, the measured times {cross_t}."
                      + (f" Up to L = {up_to} HOBA attention takes {min(short):.0f}-{max(short):.0f}x the time of 2D "
                         "attention." if short else ""),
                      f"* {_provenance(rs, 'bench/triplet/scaling/*')}"])
