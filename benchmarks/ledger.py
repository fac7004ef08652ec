"""The documentation tables generated from the results ledger (``results/ledger.jsonl``; schema, reader and writer:
:mod:`hoformer.results`). Every hoformer number in README.md and docs/*.md sits in a block

    <!-- ledger:NAME -->
    ...
    <!-- /ledger -->

whose body the entry NAME of ``results/tables.yaml`` renders (:func:`declared`: the entry is its arguments, Jinja2
over this module's functions, the :class:`Ledger`'s methods and the file's macros; ``DataFrame.to_markdown`` writes
it); a paper's number sits in ``<!-- paper:KEY:VALUE -->...<!-- /paper -->`` (``results/paper_numbers.yaml``).
``python benchmarks/campaign.py --tables`` rewrites the blocks, ``--check`` fails on a stale one. Of each experiment
and seed **the newest line** counts (:class:`Ledger`: a re-measurement supersedes; run-to-run cells read every line).
"""
from __future__ import annotations

import fnmatch
import functools
import json
import math  # noqa: F401 (math.prod in the templates)
import re
import statistics
import sys
from pathlib import Path

import jinja2
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the hoformer of this checkout, whatever is installed
from hoformer.results import (LedgerError, add_ledger_argument, append_benchmarks, append_ledger,  # noqa: E402,F401
                              commit, device_suffix, hardware)
from hoformer import results  # noqa: E402

LEDGER = ROOT / "results" / "ledger.jsonl"
SPEC, PAPER = (yaml.safe_load((ROOT / "results" / name).read_text()) for name in ("tables.yaml", "paper_numbers.yaml"))
TABLES = SPEC["tables"]
TABLE_RE = re.compile(r"(<!-- ledger:(?P<name>[\w./-]+) -->\n)(?P<body>.*?)(<!-- /ledger -->)", re.S)
PAPER_RE = re.compile(r"(<!-- paper:(?P<key>[\w./-]+):(?P<value>\w+) -->)(?P<body>.*?)(<!-- /paper -->)")
MARK_RE = re.compile(r"<!-- (ledger:[\w./-]+|/ledger|paper:[\w./:-]+|/paper) -->")
HORIZONS, SEEDS5, NO_RUNS = (96, 192, 336, 720), [2024, 2025, 2026, 2027, 2028], "no runs yet"
VERDICT_SEEDS = 3  # the fewest seeds a verdict is drawn from
LABELS, SHORT = SPEC["labels"], {**SPEC["labels"], **SPEC["short_labels"]}  # the models' names, shorter ones
BENCH_ATTN = ("kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial", "divided")


def read_ledger(path=LEDGER):
    """Every line of the ledger, each checked."""
    return results.read_ledger(path)


# --------------------------------------------------------------------------------------- the ledger, selection
def _match(value, want) -> bool:
    if isinstance(want, list):
        pos, neg = [w for w in want if not str(w).startswith("!")], [w[1:] for w in want if str(w).startswith("!")]
        return (not pos or any(_match(value, w) for w in pos)) and not any(_match(value, w) for w in neg)
    if isinstance(want, str) and "*" in want:
        return isinstance(value, str) and fnmatch.fnmatchcase(value, want)
    return value == want


def matches(r, spec):
    """Whether the line ``r`` matches the selector ``spec`` ({field: value, glob or list; ``!``: not})."""
    return all(_match(r.get(k), v) for k, v in spec.items())


class Ledger:
    """The loaded ledger: ``df``, the newest line (``line``) of each experiment and seed (one of no seed gives way to
    any later line of its experiment); ``history``, every line. Its methods: the templates' functions reading it (a
    selector: a dict or a name of the ``selectors`` of ``results/tables.yaml``)."""

    def __init__(self, rows: list[dict]) -> None:
        df = pd.DataFrame({"line": rows, "experiment": [r["experiment"] for r in rows], "seed": [
            json.dumps(r["seed"]) for r in rows]}).drop_duplicates(["experiment", "seed"], keep="last")
        self.history, self.df = rows, df[~((df["seed"] == "null") & df.duplicated("experiment", keep="last"))]
        env = self.env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False,
                                            finalize=lambda v: "-" if v is None else v)  # a missing value prints as -
        # the templates' names: this module's (functions, constants, modules), the methods below, a few shorthands
        env.globals.update({k: v for k, v in globals().items() if not k.startswith("_")})
        env.globals.update({k: getattr(self, k) for k in vars(Ledger) if not k.startswith("_")})
        env.globals.update(
            L=self.sel, table=lambda t: declared(self, **t), every=lambda spec: [r for r in rows if matches(r, spec)],
            col=lambda spec, name, scale=1: [scale * v for r in self.sel(spec) if (v := metric(r, name)) is not None],
            students=lambda ds, m: by_seed(sorted(self.sel(task="text", dataset=ds, model=m, role="student"),
                                                  key=lambda r: r["seed"]), "test/acc", scale=100))
        env.globals["from"] = lambda name, values: values[name]  # map('from', dict): the values of keys
        env.filters.update({k: v for k, v in env.globals.items() if callable(v) and k not in env.filters})
        env.tests.update(has=has, matches=matches)  # selectattr('metrics', 'has', [name, ...])
        macros = env.from_string(SPEC["macros"]).module  # after the functions, which the macros call
        env.globals.update({k: getattr(macros, k) for k in dir(macros) if not k.startswith("_")})
        # each template and expression compiled once (a table renders the same cells row after row)
        self.template, self.expression = functools.cache(env.from_string), functools.cache(env.compile_expression)

    def sel(self, spec=None, **more) -> list[dict]:
        """The newest lines matching the selector ``spec`` and the fields ``more``."""
        spec = {**(SPEC["selectors"][spec] if isinstance(spec, str) else spec or {}), **more}
        return [r for r in self.df["line"] if matches(r, spec)]

    def bench(self, lines: str, device: str | list = "") -> list[dict]:
        """The benchmark lines of the glob ``lines`` measured on ``device`` alone (a list: each; ``""``: CPU, fp32)."""
        return [r for d in ([device] if isinstance(device, str) else device)
                for r in self.sel(task="benchmark", experiment=lines + d) if device_of(r) == d]

    def newest_with(self, prefix: str, suffix: str, names) -> list[dict]:
        """Per benchmark ``prefix*`` on the device ``suffix`` (every line, ``history``): its newest line holding the
        metrics ``names``, with ``others``, its other lines on the same hardware (``lines``: all of them)."""
        hist = [r for r in self.history if r["task"] == "benchmark" and r["experiment"].startswith(prefix)
                and device_of(r) == suffix]
        out = []
        for e in dict.fromkeys(r["experiment"] for r in hist):
            if full := [r for r in hist if r["experiment"] == e and has(r["metrics"], names)]:
                others = [r for r in hist if r["experiment"] == e and r is not full[-1]
                          and r["hardware"] == full[-1]["hardware"]]
                out.append(dict(full[-1], others=others, lines=[full[-1], *others]))
        return out

    def traffic_runs(self, dataset: str = "los_loop") -> list[dict]:
        """One summary per traffic model: from its per-seed lines (mean and sample std over the seeds, mean wall time
        per run) when it has any, else its line recording a summary over seeds. ``lines``: the lines behind it."""
        out = []
        for model in dict.fromkeys(r["model"] for r in self.sel(task="traffic", dataset=dataset)):
            mine = self.sel(task="traffic", dataset=dataset, model=model)
            if not (lines := sorted([r for r in mine if isinstance(r["seed"], int)], key=lambda r: r["seed"])):
                out += [dict(r, lines=[r]) for r in mine]
                continue
            vals = {k: [r["metrics"][k] for r in lines] for k in lines[0]["metrics"]
                    if all(k in r["metrics"] for r in lines)}
            out.append(dict(lines[-1], metrics={k: mean(v) for k, v in vals.items()}, seed=[r["seed"] for r in lines],
                            metrics_std={k: statistics.stdev(v) for k, v in vals.items()} if len(lines) > 1 else {},
                            wall_s=mean([r["wall_s"] for r in lines]), lines=lines))
        return out


# ------------------------------------------------------------------------------------------------ formatting
def f(v, digits=3):
    """A value with ``digits`` decimals, ``-`` for None."""
    return "-" if v is None else f"{v:.{digits}f}"


def mean(vals):
    """The mean of ``vals``; None when there are none."""
    return sum(vals) / len(vals) if vals else None


def rng(vals, digits=2):
    """``min-max`` of ``vals`` with ``digits`` decimals; ``-`` when there are none."""
    return f"{min(vals):.{digits}f}-{max(vals):.{digits}f}" if vals else "-"


def sr(v):
    """A logged stable rank as recorded (4 significant digits at most); empty for None."""
    return "" if v is None else f"{v:.4g}"


def shape(v):
    """A shape as printed: [16, 16, 16] -> (16,16,16)."""
    return "(" + ",".join(map(str, v)) + ")"


def ms(v):
    """A time: one decimal below 100."""
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def duration(s):
    """A wall-clock time: seconds below an hour, else hours and minutes; ``-`` for None."""
    return "-" if s is None else f"{s:.0f} s" if s < 3600 else "%d h %d min" % divmod(round(s / 60), 60)


def span(vals, spec=None):
    """``min-max`` of ``vals`` (one value when they print alike) in the format ``spec`` (None: :func:`sr`)."""
    return "-".join(dict.fromkeys(sr(v) if spec is None else format(v, spec) for v in (min(vals), max(vals))))


def short_label(model):
    """An attention type in the analysis tables: ``HOT product``."""
    return SHORT.get(model, model)


def has(metrics, names):
    """Whether ``metrics`` holds every one of ``names``."""
    return all(n in metrics for n in names)


def objective(r):
    """A tuning trial's objective (``val/mae`` by default)."""
    return r["metrics"].get(r.get("objective", "val/mae"))


def best_trial(rs):
    """The complete tuning trial of the lowest objective (None without one)."""
    return min([r for r in rs if r["state"] == "complete" and objective(r) is not None], key=objective, default=None)


def seeds_of(rs):
    """The seeds of the lines (a line of a list of seeds: each of them)."""
    return sorted({s for r in rs for s in (r["seed"] if isinstance(r["seed"], list) else [r["seed"]])}, key=str)


def at_seeds(values, seeds):
    """``{seed: value}`` of ``values`` at ``seeds``, or None when one of them is missing."""
    return {s: values[s] for s in seeds} if all(s in values for s in seeds) else None


def ordered(rs, field, values):
    """``rs`` sorted (stably) by the position of their ``field`` in ``values``, the unlisted last."""
    return sorted(rs, key=lambda r: [*values, r.get(field)].index(r.get(field)))


def diffs(a, b):
    """The differences of two {seed: value}, at their common seeds."""
    return [a[s] - b[s] for s in sorted(set(a) & set(b), key=str)]


def vs(a, b, digits=3):
    """The paired difference of ``a`` over ``b`` (:func:`paired`); ``-`` without ``b`` (no reference)."""
    return "-" if b is None else paired(diffs(a, b), digits)


def hardware_short(rs):
    """``2 CPU cores`` / the GPU's name, for the lines of one cell."""
    return ", ".join(dict.fromkeys(
        f"{c[1]} CPU cores" if (c := re.search(r"(\d+) cores", r["hardware"])) else r["hardware"].split(" (CUDA")[0]
        for r in rs)) or "-"


def epochs_best(r):
    """``epochs (best epoch)`` of a line, and whether it was stopped by hand; ``-``."""
    return "-" if r.get("epochs") is None else str(r["epochs"]) + (
        "" if r.get("best_epoch") is None else f" ({r['best_epoch']})") + (
        ", stopped by hand" if (r.get("stopping") or {}).get("stopped_by_hand") else "")


def fast_over_naive(m, k):
    """The triplet kernel's metric ``k`` over Algorithm 1's (the metrics ``fast_k`` / ``naive_k`` of one line)."""
    return m[f"fast_{k}"] / m[f"naive_{k}"] if f"fast_{k}" in m and f"naive_{k}" in m else None


def device_of(r):
    """What a benchmark line was measured on: its name from the first ``+`` (``+cuda``; ``""``: CPU, fp32)."""
    return r["experiment"][r["experiment"].find("+"):] if "+" in r["experiment"] else ""


def tokens(rs, p):
    """The tokens of the first line of patch size ``p``: (its volume's side / p) ** its dimensions; None without one."""
    return next(((r["shape"][0] // p) ** len(r["shape"]) for r in rs if r.get("patch") == p), None)


def mean_std(vals: list[float], digits: int = 3) -> str:
    """``mean ± sample std`` (a spread below the last digit keeps one more); one value: itself."""
    if len(vals) < 2:
        return f(mean(vals), digits)
    s = statistics.stdev(vals)
    return f"{mean(vals):.{digits}f} ± {s:.{digits if round(s, digits) else digits + 1}f}"


def interval(diffs: list[float]) -> tuple[float, float]:
    """The 95 % Student-t interval of the mean of ``diffs`` (two or more; a zero spread: the mean itself)."""
    from scipy import stats  # slow to import: only where an interval is drawn
    ci = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    return (float(ci.low), float(ci.high)) if statistics.pstdev(diffs) else (mean(diffs), mean(diffs))


def paired(diffs: list[float], digits: int = 3) -> str:
    """The paired difference over seeds: mean and its 95 % Student-t interval, ``within noise`` when it covers 0."""
    if len(diffs) < 2:
        return f"{diffs[0]:.{digits}f} (1 seed, no interval)" if diffs else "-"
    lo, hi = interval(diffs)
    return f"{mean(diffs):.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" + (" within noise" if lo <= 0 <= hi else "")


def verdict(diffs: list[float], lower_is_better: bool = True) -> str:
    """In words, from the paired differences (model minus reference) over seeds: ``ahead`` / ``behind`` when the
    95 % interval excludes 0, else ``level (within noise)``; none under :data:`VERDICT_SEEDS` seeds (two seeds'
    interval rests on one degree of freedom: two nearly equal differences make it narrow by chance)."""
    if len(diffs) < VERDICT_SEEDS:
        return f"{len(diffs)} seed{'s' * (len(diffs) > 1)}: no verdict" if diffs else "not run yet"
    lo, hi = interval(diffs)
    return "level (within noise)" if lo <= 0 <= hi else "ahead" if (hi < 0) == lower_is_better else "behind"


def metric(r: dict, names, horizon: int | None = None):
    """The first of ``names`` the line has; with ``horizon``: ``NAME@horizon`` or ``NAME`` of a line of that horizon."""
    keys = [k for name in ((names,) if isinstance(names, str) else names)
            for k in ([name] if horizon is None else [f"{name}@{horizon}", *[name] * (r.get("horizon") == horizon)])]
    return next((r["metrics"][k] for k in keys if k in r["metrics"]), None)


def by_seed(rs: list[dict], name: str = "test/mse", horizon=None, scale=1, key: str = "seed") -> dict:
    """``{seed: scale * value}`` of ``name`` (at ``horizon``) of the lines ``rs`` of one seed (a line of a list of seeds
    records a summary over them; ``key``: another field than the seed). ``horizon="avg"``: each seed's mean over the
    four horizons, from its per-horizon values, or from a line recording only that average (``horizon``: a list)."""
    if horizon != "avg":
        return {r.get(key): scale * v for r in rs if not isinstance(r["seed"], list)
                and (v := metric(r, name, horizon)) is not None}
    out = {}
    for s in seeds_of(rs):
        per = [[v for r in rs if r["seed"] == s and (v := metric(r, name, h)) is not None] for h in HORIZONS]
        whole = [metric(r, name) for r in rs if r["seed"] == s and r.get("horizon") == list(HORIZONS)]
        v = mean([p[0] for p in per]) if all(len(p) == 1 for p in per) else whole[0] if len(whole) == 1 else None
        if v is not None:
            out[s] = scale * v
    return out


def horizon_cell(rs: list[dict], horizon, metrics: list) -> str:
    """``metrics`` (each a name or alternative names) at ``horizon``: mean ± std over the lines, ``/`` between;
    ``horizon="avg"``: the mean over the four horizons (of the mean over the lines) of each metric every one has."""
    if horizon == "avg":
        means = [[mean(vals) for h in HORIZONS if (vals := [v for r in rs if (v := metric(r, name, h)) is not None])]
                 for name in metrics]
        return " / ".join(f"{mean(m):.3f}" for m in means if len(m) == len(HORIZONS)) or "-"
    values = [[v for r in rs if (v := metric(r, name, horizon)) is not None] for name in metrics]
    return " / ".join(mean_std(vals) for vals in values if vals) or "-"


def ratio(m: dict, a: str, b: str, recorded: str | None = None):
    """``m[a] / m[b]``; without both, the metric ``recorded`` (the line's own ratio), else undefined (a ``-`` cell)."""
    return m[a] / m[b] if a in m and m.get(b) else m[recorded] if recorded in m else jinja2.StrictUndefined(
        obj=m, name=f"{a}/{b}")


def pivot(lines: list[dict], row: str, column: str) -> list[dict]:
    """One dict per value of the field ``row``, first appearance first: ``{row: value, COLUMN VALUE (text): its last
    line, ...}``."""
    out: dict = {}
    for v in lines:
        out.setdefault(str(v[row]), {row: v[row]})[str(v[column])] = v
    return list(out.values())


def run_to_run(rs: list[dict], keys: list) -> dict:
    """The runs (a commit and date) of one command among the lines ``rs``: ``runs``, ``{model: metrics}`` each;
    ``common``, the types of :data:`BENCH_ATTN` with ``keys`` in every run; ``change``, the largest change between
    runs (size, label, key; None without a common type); ``same``, whether each key orders the types alike in all."""
    runs = [{r["model"]: r["metrics"] for r in rs if (r["commit"], r["date"]) == run}
            for run in dict.fromkeys((r["commit"], r["date"]) for r in rs)]
    common = [a for a in BENCH_ATTN if all(a in run and has(run[a], keys) for run in runs)]
    change = max(((max(v) - min(v), short_label(a), k) for a in common for k in keys
                  for v in [[run[a][k] for run in runs]]), default=None)
    same = all(len({tuple(sorted(common, key=lambda a: run[a][k])) for run in runs}) == 1 for k in keys)
    return dict(runs=runs, common=common, change=change, same=same)


def by_size(rs: list[dict], prefix: str) -> list:
    """``[(N, {model: value}), ...]``, N ascending, of the metrics ``PREFIX@N`` of the lines ``rs`` (the last wins)."""
    sizes = sorted({int(k.split("@")[1]) for r in rs for k in r["metrics"] if k.startswith(prefix + "@")})
    return [(n, {r["model"]: r["metrics"][f"{prefix}@{n}"] for r in rs if f"{prefix}@{n}" in r["metrics"]})
            for n in sizes]


def provenance_note(rs: list[dict], *names: str) -> str:
    """Where the lines come from: measured (command, commit) or transcribed (file, commit), hardware, torch, dates."""
    join = lambda xs: ", ".join(dict.fromkeys(map(str, xs)))
    parts = []
    for transcribed in (False, True):
        if not (mine := [r for r in rs if (r["record"] == "transcribed") == transcribed]):
            continue
        cmds = join(f"`{r['command']}`" for r in mine)
        how = (f"Transcribed from {join(r['source']['file'] + ' at ' + r['source']['commit'] for r in mine)}, run "
               f"logs not kept (command{'s' * (len(set(r['command'] for r in mine)) > 1)} reconstructed afterwards: "
               f"{cmds})" if transcribed else f"Measured with {cmds} at commit {join(r['commit'] for r in mine)}")
        parts.append(f"{how} on {join(r['hardware'] for r in mine)}, torch "
                     f"{join('not recorded' if r['torch'] is None else r['torch'] for r in mine)} "
                     f"({join(r['date'] for r in mine)}; ledger lines {', '.join(f'`{n}`' for n in names)}).")
    return " ".join(parts)


def paper(key: str, value: str, index: int | None = None) -> str:
    """A paper's number of ``results/paper_numbers.yaml`` as printed (a pair: ``a / b``; ``index``: one of them)."""
    entry = PAPER[key]
    v = entry["values"][int(value) if str(value).isdigit() else value]
    v = [v] if not isinstance(v, list) else v if index is None else [v[index]]
    return " / ".join(f"{x:g}" if entry["digits"] is None else f"{x:.{entry['digits']}f}" for x in v)


# ------------------------------------------------------------------------------------------------ the renderer
def declared(lg: Ledger, columns: dict, groups: dict | None = None, each: str | None = None, select=None,
             rows=(), expand: bool = False, per: dict | None = None, define: dict | None = None,
             let: dict | None = None, keep: str | None = None, optional=(), notes: list | None = None, source=None,
             bullets: bool = True, **args) -> str:
    """The one renderer: the table an entry of ``results/tables.yaml`` declares (its arguments, described at the top
    of that file; a list row is left out when its first cell renders empty, a None column template is no column),
    then each of ``notes`` that renders non-empty (``""``: a blank line) and where the lines come from (``source``).
    The table's lines: ``define``'s ``lines``, else those of ``select``, else of the rows; without lines, or when
    every note renders empty: the table alone."""
    columns = {h: t for h, t in (dict.fromkeys(columns, "") if isinstance(columns, list) else columns).items()
               if t is not None}  # a list: the heads of list rows
    render = lambda template, v: lg.template(str(template)).render(v)

    def cell(template, v):  # ``-`` where the template reads a field or key the row lacks; an unknown name raises
        try:
            return render(template, v)
        except jinja2.UndefinedError as e:
            if str(e).endswith("is undefined"):  # "'nmae' is undefined": not a missing value
                raise
            return "-"

    args = {**args, "groups": groups, "select": select}
    for name, expression in (define or {}).items():
        args[name] = lg.expression(expression)(**args)
    if isinstance(rows, str):
        rows = [{"r": r, "rs": r.get("lines", [r])} for r in lg.expression(rows)(**args)]
    found = [{"label": label, "rs": lg.sel(spec)} for label, spec in (groups or {}).items()]
    if each is not None:
        rs = lg.sel(select)
        found += [{each: v, "rs": [r for r in rs if r.get(each) == v]} for v in dict.fromkeys(r.get(each) for r in rs)]
    found = [{**g, "r": r} for g in found for r in g["rs"]] if expand else found
    for name, values in (per or {}).items():
        found = [{**g, name: x} for g in found for x in values]
    body, shown, lines = [], [], {}
    for row in [*found, *rows]:
        if isinstance(row, list):
            if first := render(row[0], {**args, "rows": body}):
                body.append([first, *(render(c, {**args, "rows": body}) for c in row[1:])])
            continue
        v = {**args, **row}
        for name, expression in (let or {}).items():
            v[name] = lg.expression(expression)(**v)
        if keep is None or lg.expression(keep)(**v):
            body.append([cell(t, v) for t in columns.values()])
            shown.append(v)
            lines.update({id(r): r for r in v.get("rs", [v["r"]] if "r" in v else [])})
    kept = [i for i, head in enumerate(columns) if head not in optional or any(row[i] not in "-" for row in body)]
    body = [[row[i] for i in kept] for row in body] or [[NO_RUNS] + [""] * (len(kept) - 1)]  # no rows: one saying so
    table = pd.DataFrame(body, columns=[render(h, args) for i, h in enumerate(columns) if i in kept]).to_markdown(
        index=False, tablefmt="github", disable_numparse=True)  # tabulate
    names = [render(n, args) for n in ([] if not source else [source] if isinstance(source, str) else source)]
    rs = args["lines"] if "lines" in args else lg.sel(select) if select else list(lines.values())
    if not rs:
        return table
    out = [t if t == "" else render(t, {**args, "lines": rs, "rows": shown}).strip() for t in notes or []]
    below = [o for o, t in zip(out, notes or []) if o or t == ""]
    if (notes and not any(out)) or not (below or names):
        return table
    return "\n".join([table, "", *below, *[f"* {p}" if bullets else p for p in [provenance_note(rs, *names)] if names]])


# ---------------------------------------------------------------------------------------------- the pages
def tables(rows: list[dict], names=None) -> dict:
    """``{NAME: body}`` of the tables ``names`` (None: all) of ``results/tables.yaml`` from the ledger ``rows``."""
    lg = Ledger(rows)
    return {name: declared(lg, **t) for name, t in TABLES.items() if names is None or name in names}


def render_tables(files: list[Path], rows: list[dict], write: bool) -> list[Path]:
    """Replace the body of every ledger block and inline paper reference of ``files`` by what the ledger and the paper
    numbers give (a marker without its end before the next opening, an end without an opening, an unknown table: a
    :class:`LedgerError` naming the file and the line). Returns the files that differ (written when ``write``)."""
    bodies, changed = tables(rows), []
    for page in files:
        text = page.read_text()
        open_ = None  # the open block's line and tag
        for m in [*MARK_RE.finditer(text), None]:  # None: the end of the page
            line, tag = (text.count("\n", 0, m.start()) + 1, m.group(1)) if m else (0, "")
            opens = tag.startswith(("ledger:", "paper:"))
            if open_ and (opens or not m):
                raise LedgerError(f"{page}:{open_[0]}: <!-- {open_[1]} --> has no end marker"
                                  + (f" before line {line}" if m else f" (<!-- /{open_[1].split(':')[0]} -->)"))
            if m and not opens and (not open_ or open_[1].split(":")[0] != tag[1:]):
                raise LedgerError(f"{page}:{line}: <!-- {tag} --> closes no open block"
                                  + (f" (line {open_[0]} opened <!-- {open_[1]} -->)" if open_ else ""))
            open_ = (line, tag) if opens else None
        if unknown := [m for m in TABLE_RE.finditer(text) if m.group("name") not in bodies]:
            raise LedgerError(f"{page}:{text.count(chr(10), 0, unknown[0].start()) + 1}: unknown ledger table "
                              f"{unknown[0].group('name')!r} (results/tables.yaml has {sorted(bodies)})")
        new = TABLE_RE.sub(lambda m: m.group(1) + bodies[m.group("name")].rstrip("\n") + "\n" + m.group(4), text)
        new = PAPER_RE.sub(lambda m: m.group(1) + paper(m.group("key"), m.group("value")) + m.group(5), new)
        if new != text:
            changed.append(page)
            if write:
                page.write_text(new)
    return changed


def doc_files():
    """The pages of generated tables."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
