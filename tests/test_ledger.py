"""The results ledger: its schema (``hoformer.results``: one validator, each kind of bad line named by file, line and
field), the tables rendered from it (``benchmarks/ledger.py`` with ``results/tables.yaml``: aggregates and paired
differences computed from the lines, every table of the docs rendered from the committed ledger), and the pages'
numbers (none outside a ledger block). No test pins a committed number: the expected values come from the ledger."""
from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pytest
from _bench import load_benchmark
from scipy import stats

from hoformer import results

REPO = Path(__file__).resolve().parents[1]

ledger = load_benchmark("ledger")
lg = lambda rows: ledger.Ledger(rows)
table_of = lambda rows, name: ledger.tables(rows, [name])[name]  # one table of results/tables.yaml


def declared(rows: list[dict], name: str, /, **args) -> str:
    """The table ``name`` of results/tables.yaml rendered from ``rows`` with some of its arguments replaced."""
    return ledger.declared(lg(rows), **{**ledger.TABLES[name], **args})


GOOD = {"experiment": "e", "task": "forecasting", "dataset": "D", "model": "m", "scale": "cpu", "split": "test",
        "metrics": {"test/mse": 0.5}, "seed": 1, "epochs": 2, "best_epoch": 1, "stopping": {"max_epochs": 2},
        "wall_s": 3.0, "hardware": "CPU", "torch": "2.13", "commit": "abc", "date": "2026-01-01", "command": "hoformer fit",
        "record": "run"}


def _line(model: str, seed: int, horizon, mse: float, **more) -> dict:
    h = "avg" if isinstance(horizon, list) else horizon
    return {**GOOD, "experiment": f"x/{model}_{h}" + ("" if seed == 2024 else f"+s{seed}"), "model": model,
            "horizon": horizon, "seed": seed, "metrics": {"test/mse": mse, "test/mae": mse / 2}, "epochs": 3,
            "wall_s": 60.0, "hardware": "CPU, 2 cores, 1 thread(s) per run", **more}


# -------------------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize("line, field", [
    ("[1, 2]", "a JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "experiment"}), "field 'experiment'"),
    (json.dumps({**GOOD, "metrics": [0.5]}), "field 'metrics'"),
    (json.dumps({**GOOD, "metrics": {"test/mse": "0.5"}}), "field 'metrics'"),
    (json.dumps({**GOOD, "seed": "1"}), "field 'seed'"),
    (json.dumps({**GOOD, "scale": "laptop"}), "field 'scale'"),
    (json.dumps({**GOOD, "record": "guess"}), "field 'record'"),
    (json.dumps({**GOOD, "record": "campaign"}), "first ledger format"),
    (json.dumps({**GOOD, "record": "transcribed: docs/x.md at abc1234; run log not kept"}), "first ledger format"),
    (json.dumps({**GOOD, "record": "transcribed"}), "field 'source'"),
    (json.dumps({**GOOD, "record": "tune", "study": "s", "trial": 1}), "field 'state'"),
    (json.dumps({**GOOD, "experiment": ""}), "field 'experiment'"),
    ('{"experiment": "e", ', "not a JSON line"),
])
def test_each_kind_of_bad_line_is_an_error_naming_file_line_and_field(tmp_path, line, field):
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(results.LedgerError, match=f"{re.escape(str(path))}:2: .*{re.escape(field)}"):
        results.read_ledger(path)
    with pytest.raises(results.LedgerError, match="no such ledger file"):
        results.read_ledger(tmp_path / "missing.jsonl")


def test_migrate_rewrites_the_first_format_and_keeps_every_value(tmp_path):
    old = [{**GOOD, "record": "campaign"}, {k: v for k, v in GOOD.items() if k != "record"},
           {**GOOD, "record": "transcribed: docs/results_hot.md at 21ec2af; run log not kept"}]
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert results._main(["migrate", str(path)]) == 0
    new = results.read_ledger(path)
    assert [r["record"] for r in new] == ["run", "run", "transcribed"]
    assert new[2]["source"] == {"file": "docs/results_hot.md", "commit": "21ec2af"} and new[2]["command_reconstructed"]
    assert all({k: r[k] for k in GOOD if k != "record"} == {k: GOOD[k] for k in GOOD if k != "record"} for r in new)


def test_committed_lines_follow_the_schema_and_transcribed_lines_name_their_source():
    rows = ledger.read_ledger()  # every line checked
    for r in rows:
        if r["record"] == "transcribed":
            assert re.fullmatch(r"README\.md|docs/[\w.]+\.md", r["source"]["file"]), r["experiment"]
            assert re.fullmatch(r"[0-9a-f]{7,40}", r["source"]["commit"]), r["experiment"]
        assert "/work/" not in r["command"] and "HOFORMER_DATA=/" not in r["command"], r["experiment"]
    assert {r["record"] for r in rows} <= set(results.RECORDS)
    assert all(v.get("source") for v in ledger.PAPER.values())


def test_renderers_say_measured_only_for_measured_lines():
    rows = ledger.read_ledger()
    measured = next(r for r in rows if r["record"] == "benchmark")
    copied = next(r for r in rows if r["record"] == "transcribed")
    note = ledger.provenance_note([measured], "x")
    assert note.startswith(f"Measured with `{measured['command']}` at commit {measured['commit']}")
    note = ledger.provenance_note([copied], "x")
    assert note.startswith(f"Transcribed from {copied['source']['file']} at {copied['source']['commit']}, run logs not "
                           "kept (command reconstructed afterwards") and "Measured" not in note


def test_no_transcribed_line_stands_for_a_pending_campaign_experiment(monkeypatch):
    """The campaign counts an experiment as done only by a measured line of it (``record: run``): a transcribed line
    of the same name (a number copied from a document, e.g. the CPU-budget variants re-run by the cpu_variants plan)
    leaves the experiment pending, and a measured one supersedes it in the tables."""
    campaign = load_benchmark("campaign")
    monkeypatch.setattr(campaign, "data_present", lambda exp: True)
    planned = {e.name for plan in campaign.PLANS.values() for e in plan()}
    rows = ledger.read_ledger()
    transcribed = {r["experiment"] for r in rows if r["record"] == "transcribed"}
    assert planned and transcribed & planned  # the variants' transcribed lines carry the names the plan runs
    assert not campaign.measured(rows) & transcribed & planned
    fake = [{**next(r for r in rows if r["experiment"] in planned and r["record"] == "transcribed"), "record": "run"}]
    assert campaign.measured(fake) == {fake[0]["experiment"]}


# --------------------------------------------------------------------------------------- the frame, the tables
def test_the_newest_line_of_each_experiment_and_seed_stands_for_it():
    rows = [_line("m", 1, 96, 0.5), _line("m", 2, 96, 0.6), _line("m", 1, 96, 0.4),
            {**_line("m", 1, 96, 0.9), "experiment": "y", "seed": None}, {**_line("m", 1, 96, 0.8), "experiment": "y"}]
    kept = lg(rows).sel()
    assert [(r["experiment"], r["seed"], r["metrics"]["test/mse"]) for r in kept] == [
        ("x/m_96+s2", 2, 0.6), ("x/m_96+s1", 1, 0.4), ("y", 1, 0.8)]  # a line of no seed: superseded by a later one
    assert len(lg(rows).history) == 5


def test_seed_table_averages_horizons_then_seeds_and_pairs_them_with_the_reference():
    h = ledger.HORIZONS
    rows = [_line("m", 1, hz, v) for hz, v in zip(h, (0.1, 0.2, 0.3, 0.4))]  # seed 1: mean 0.25
    rows.append(_line("m", 2, list(h), 0.35))  # seed 2: only its four-horizon average was recorded
    rows += [_line("r", s, list(h), v) for s, v in ((1, 0.2), (2, 0.4))]
    groups = {"M": {"model": "m"}, "R": {"model": "r"}}
    seeds = lambda rows: declared(rows, "hot/etth1_seed_spread", groups=groups, seeds=[1, 2], reference="R")
    table = seeds(rows)
    d = [0.25 - 0.2, 0.35 - 0.4]
    ci = stats.t.ppf(0.975, 1) * statistics.stdev(d) / 2 ** 0.5
    assert re.search(rf"\| M +\| 0.250 / 0.350 +\| 0.300 ± 0.071 +\| {statistics.mean(d):.3f} "
                     rf"\[{statistics.mean(d) - ci:.3f}, {statistics.mean(d) + ci:.3f}\] within noise", table)
    assert re.search(r"\| R +\| 0.200 / 0.400 +\| 0.300 ± 0.141 +\| reference", table)
    rows[0] = dict(rows[0], metrics={"test/mse": 0.5, "test/mae": 0.25})  # one horizon changes: every cell follows
    assert re.search(r"\| M +\| 0.350 / 0.350 +\| 0.350 ± 0.0000 ", seeds(rows))
    # a seed without every horizon (and no average line) is no row rather than a wrong mean
    assert "| M " not in seeds(rows[1:]) and "| R " in seeds(rows[1:])


def test_paired_interval_is_student_t_over_seeds_and_says_within_noise_or_one_seed():
    diffs = [-0.010, -0.014, -0.012, -0.013]
    m, half = statistics.mean(diffs), stats.t.ppf(0.975, 3) * statistics.stdev(diffs) / 2
    assert ledger.paired(diffs) == f"{m:.3f} [{m - half:.3f}, {m + half:.3f}]" and m + half < 0
    wide = [-0.02, 0.01, -0.005]
    m, half = statistics.mean(wide), stats.t.ppf(0.975, 2) * statistics.stdev(wide) / 3 ** 0.5
    assert ledger.paired(wide) == f"{m:.3f} [{m - half:.3f}, {m + half:.3f}] within noise"
    assert ledger.paired([0.004]) == "0.004 (1 seed, no interval)" and ledger.paired([]) == "-"
    assert ledger.vs({1: 0.5, 2: 0.7, 3: 0.1}, {1: 0.4, 2: 0.5}) == ledger.paired([0.1, 0.2])  # common seeds only


def _tuned(model: str, h: int, seed: int, mse: float) -> dict:
    return {**_line(model, seed, h, mse), "experiment": f"hot/ltsf/etth1_96_{h}_{model}+tuned+es10" +
            ("" if seed == 2024 else f"+s{seed}"), "dataset": "ETTh1", "scale": "paper"}


def test_tuned_etth1_table_pairs_hot_with_spatial_per_horizon():
    mse = {("spatial", 96): (0.40, 0.41, 0.42), ("hot_product", 96): (0.43, 0.445, 0.45),
           ("spatial", 720): (0.50, 0.52, 0.51), ("hot_product", 720): (0.51, 0.50, 0.53)}
    rows = [_tuned(m, h, s, v[i]) for (m, h), v in mse.items() for i, s in enumerate((2024, 2025, 2026))]
    table = ledger.tables(rows)["hot/etth1_tuned"]
    for h in (96, 720):
        d = [a - b for a, b in zip(mse["hot_product", h], mse["spatial", h])]
        assert re.search(rf"\| HOT \(product\) +\| {h} +\| 3 +\| {re.escape(ledger.paired(d))} ", table), table
    assert "within noise" in table.split("| 720 ")[1] and "within noise" not in table.split("| 96 ")[1].split("\n")[0]
    assert re.search(r"\| Transformer \(spatial\) +\| 0.410 ± 0.010 / 0.205 ± 0.005 ", table)
    assert f"| {ledger.paper('ETTh1/itransformer', 96)} " in table  # the paper's row, from paper_numbers.yaml
    one = ledger.tables([r for r in rows if r["seed"] == 2024])["hot/etth1_tuned"]
    assert "(1 seed, no interval)" in one and not re.search(r"\[-?\d+\.\d+, ", one)


def test_verdicts_follow_the_paired_interval_and_say_nothing_of_one_seed():
    """The verdict table: behind / ahead when the paired interval excludes 0 (on the metric's own direction), level
    when it covers 0, no verdict from one seed, 'not run yet' without the model's lines."""
    mse = {("spatial", 96): (0.40, 0.41, 0.42), ("hot_product", 96): (0.43, 0.445, 0.45),
           ("spatial", 720): (0.50, 0.52, 0.51), ("hot_product", 720): (0.51, 0.50, 0.53)}
    rows = [_tuned(m, h, s, v[i]) for (m, h), v in mse.items() for i, s in enumerate((2024, 2025, 2026))]
    table = ledger.tables(rows)["hot/verdict"]
    row = lambda h: next(ln for ln in table.splitlines() if f"96 -> {h}, paper size, Table 6-tuned" in ln)
    d96 = [a - b for a, b in zip(mse["hot_product", 96], mse["spatial", 96])]
    assert f"| {ledger.paired(d96)} " in row(96) and row(96).rstrip(" |").split("|")[-2].strip() == "behind"
    assert "| level (within noise) " in row(720)
    assert ledger.verdict([-0.02, -0.03, -0.025]) == "ahead" and ledger.verdict([0.02, 0.03, 0.025], False) == "ahead"
    assert ledger.verdict([0.01]) == "1 seed: no verdict" and ledger.verdict([]) == "not run yet"
    assert ledger.verdict([0.0330, 0.0331]) == "2 seeds: no verdict"  # a narrow interval of 2 seeds is chance
    assert "| not run yet " in next(ln for ln in table.splitlines() if ln.startswith("| Weather"))
    one = ledger.tables([r for r in rows if r["seed"] == 2024])["hot/verdict"]
    assert "1 seed: no verdict" in one and "behind" not in one


def test_weather_protocol_table_reads_the_four_horizons_of_one_line_per_seed():
    def line(model, seed, base):
        m = {f"test/{n}@{h}": base + h / 10000 + (n == "mae") * 0.01 for n in ("mse", "mae") for h in ledger.HORIZONS}
        m.update({f"test/{n}_mean": statistics.mean(m[f"test/{n}@{h}"] for h in ledger.HORIZONS) for n in ("mse", "mae")})
        return {**_line(model, seed, 720, 0.0), "metrics": m, "dataset": "weather", "protocol": "hot", "scale": "paper",
                "experiment": f"hot/ltsf_hot/weather_96_{model}+es3" + ("" if seed == 2024 else f"+s{seed}")}

    rows = [line("spatial", 2024, 0.20), line("hot_product", 2024, 0.19), line("hot_product", 2025, 0.21)]
    table = ledger.tables(rows)["hot/weather_protocol_hot"]
    mean_hot = statistics.mean(0.19 + h / 10000 for h in ledger.HORIZONS)
    assert re.search(r"\| HOT \(product\) +\| 0.210 ± 0.014 / 0.220 ± 0.014 ", table), table
    assert re.search(rf"\| Transformer \(spatial\) +(\| [^|]+){{4}}\| \*\*{mean_hot + 0.01:.3f} / ", table)
    assert f"| {ledger.paper('weather/hot', 'avg')} " in table and f"| {ledger.paper('weather/spatial', 'avg')} " in table
    assert re.search(r"\| HOT \(product\) +\| avg +\| 1 +\| -0.010 \(1 seed, no interval\)", table)


def test_tune_table_counts_trials_and_prunes_and_names_the_best_parameters():
    def trial(study, n, state, mae):
        return {**_line("spatial", 2024, 96, 0.0), "experiment": f"tune/{study}/trial_{n:03d}", "record": "tune",
                "study": study, "trial": n, "state": state, "objective": "val/mae", "metrics": {"val/mae": mae},
                "params": {"model.init_args.model.init_args.dropout": n / 10}}

    rows = [trial("etth1_96_96_spatial", 0, "complete", 0.6), trial("etth1_96_96_spatial", 1, "pruned", 0.5),
            trial("etth1_96_96_spatial", 2, "complete", 0.55), trial("etth1_96_96_hot_product", 0, "complete", 0.7)]
    table = ledger.tables(rows)["hot/etth1_tune"]
    assert re.search(r"\| `etth1_96_96_spatial` +\| 3 +\| 1 +\| 0.5500 \(trial 2\) +\| dropout=0.2 ", table)
    assert re.search(r"\| `etth1_96_96_hot_product` +\| 1 +\| 0 +\| 0.7000 \(trial 0\)", table)


def test_horizon_table_prefix_metrics_and_same_window_alternatives():
    """A line scoring several horizons (``test/mse@H``) and per-horizon lines share one table; the average column
    only appears for a metric every horizon has."""
    joint = _line("j", 1, 720, 0.0, metrics={f"test/mse@{h}": h / 1000 for h in ledger.HORIZONS})
    direct = [_line("d", 1, h, h / 1000 + 0.01) for h in ledger.HORIZONS]
    direct[0]["metrics"]["test_2161/mse"] = 0.05
    table = declared([joint, *direct], "hot/etth1_same_windows", groups={"joint": {"model": "j"}, "direct": {"model": "d"}},
                     metrics=[["test_2161/mse", "test/mse"]])
    assert re.search(r"\| joint +\| 0.096 +\| 0.192 +\| 0.336 +\| 0.720 +\| 0.336 +\|", table)
    assert re.search(r"\| direct +\| 0.050 +\| 0.202 +\| 0.346 +\| 0.730 +\| 0.332 +\|", table)


def test_empty_tables_say_no_runs_yet():
    for name in ("hot/etth1_paper", "hot/weather_paper", "hot/paper_runs", "hot/etth1_tuned", "hot/weather_protocol_hot",
                 "hot/etth1_tune", "analysis/etth1_stable_ranks", "analysis/heads", "analysis/bench_growth",
                 "analysis/bench_flops", "bench/decode_gpu"):
        body = ledger.tables([])[name].splitlines()
        assert len(body) == 3 and re.match(rf"\| {ledger.NO_RUNS} ", body[2]), name


def test_every_table_renders_from_the_ledger_and_every_table_is_on_a_page():
    rows = ledger.read_ledger()
    used = {m.group("name") for f in ledger.doc_files() for m in ledger.TABLE_RE.finditer(f.read_text())}
    assert used == set(ledger.TABLES), set(ledger.TABLES) ^ used
    for name, body in ledger.tables(copy.deepcopy(rows)).items():
        assert body.startswith("| ") and "nan" not in body, name


def test_markers_without_their_end_are_errors_naming_file_and_line(tmp_path):
    doc = tmp_path / "page.md"
    for text, where in [("a\n<!-- ledger:hot/paper_runs -->\nold\n", "page.md:2: .*has no end marker"),
                        ("<!-- ledger:hot/paper_runs -->\n\n<!-- ledger:hot/precision -->\n<!-- /ledger -->\n",
                         "page.md:1: .*no end marker before line 3"),
                        ("x\n\n<!-- /ledger -->\n", "page.md:3: <!-- /ledger --> closes no open block"),
                        ("see <!-- paper:weather/hot:avg -->0.1\n", "page.md:1: .*paper:weather/hot:avg"),
                        ("<!-- ledger:no/such -->\n<!-- /ledger -->\n", "page.md:1: unknown ledger table 'no/such'")]:
        doc.write_text(text)
        with pytest.raises(results.LedgerError, match=where):
            ledger.render_tables([doc], [], write=False)


def test_a_changed_ledger_makes_the_tables_stale_and_paper_references_are_rendered(tmp_path):
    rows = ledger.read_ledger()
    doc = tmp_path / "page.md"
    doc.write_text("text\n<!-- ledger:hot/paper_runs -->\nold\n<!-- /ledger -->\nthe paper: "
                   "<!-- paper:weather/hot:avg -->?<!-- /paper -->.\n")
    assert ledger.render_tables([doc], rows, write=True) == [doc]
    assert ledger.render_tables([doc], rows, write=False) == []
    assert doc.read_text().startswith("text\n<!-- ledger:hot/paper_runs -->\n| experiment ")
    assert f"<!-- paper:weather/hot:avg -->{ledger.paper('weather/hot', 'avg')}<!-- /paper -->." in doc.read_text()
    i = next(i for i, r in enumerate(rows) if r["scale"] == "paper" and r["record"] in ("run", "transcribed"))
    changed = copy.deepcopy(rows)
    changed[i]["metrics"] = {k: v + 1 for k, v in changed[i]["metrics"].items()}
    assert ledger.render_tables([doc], changed, write=False) == [doc]


# ------------------------------------------------------------------------------------ numbers on the pages
PAGES = ["README.md", "docs/results.md", "docs/results_hot.md", "docs/results_text.md", "docs/results_traffic.md",
         "docs/reproducing.md", "docs/benchmarks.md", "docs/analysis.md"]
#: a decimal, or a number with x (a ratio) or % (a share): what a measurement is printed as
RESULT = re.compile(r"(?<![\w.^/=~-])(?:\d+(?:\.\d+)?(?:x|%)(?![\w])|\d+\.\d+(?![\w.]))")
#: words next to a number that is a setting, a version or a reference, not a measurement
SETTING = re.compile(r"(dropout|decay|lr|alpha|tau|overlap|EMA|PyTorch|Python|CUDA|torch|sections?|License|warm-up|"
                     r"held out|holding out|FFN|Table|eq|patience|delta|clipping|require|>=)\W*$|"
                     r"^\W*(linear warm-up|warm-up|held out)", re.I)


def result_numbers(text: str) -> list[tuple[int, str]]:
    """``(line, number)`` of every result-like number of a page outside ledger blocks, paper references, code."""
    keep = lambda m: "\n" * m.group(0).count("\n")
    text = ledger.TABLE_RE.sub(keep, text)
    text = ledger.PAPER_RE.sub(keep, text)
    text = re.sub(r"```.*?```", keep, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    flat = re.sub(r"\s+", " ", text)  # a setting's word may end the line before its number
    out = []
    for m in RESULT.finditer(flat):
        if not (SETTING.search(flat[max(0, m.start() - 30):m.start()]) or SETTING.search(flat[m.end():m.end() + 20])):
            out.append((text[:_offset(text, flat, m.start())].count("\n") + 1, m.group(0)))
    return out


def _offset(text: str, flat: str, pos: int) -> int:
    """The position in ``text`` of the character at ``pos`` of its whitespace-collapsed ``flat``."""
    i = j = 0
    while j < pos:
        if text[i].isspace():
            while i + 1 < len(text) and text[i + 1].isspace():
                i += 1
        i, j = i + 1, j + 1
    return i


def test_no_result_number_outside_a_ledger_block():
    """Every number of the results pages that reports a measurement is in a generated block; the papers' numbers
    are ``<!-- paper:... -->`` references to results/paper_numbers.yaml."""
    found = {p: result_numbers((REPO / p).read_text()) for p in PAGES}
    assert not any(found.values()), {p: v for p, v in found.items() if v}
    assert result_numbers("the HOT model reaches 0.245 and is 2.5x faster, 12% better\n") == [
        (1, "0.245"), (1, "2.5x"), (1, "12%")]
    assert result_numbers("dropout 0.1, lr 2e-4, PyTorch 2.13, `x 0.5`\n<!-- paper:a:b -->0.3<!-- /paper -->\n") == []


def test_no_runs_jsonl_results_file_is_cited_by_the_docs():
    for p in [*PAGES, "CONTRIBUTING.md"]:
        assert not re.search(r"runs/[\w./*-]*\.jsonl", (REPO / p).read_text()), p


# ------------------------------------------------------------------------------------- benchmark lines
def _names(rows: list[dict], prefix: str) -> set[str]:
    return {r["experiment"] for r in rows if r["experiment"].startswith(prefix)}


def _write(entries: list[dict], path: Path, script: str, argv: list[str], device: str = "cpu") -> list[dict]:
    """Append ``entries`` as ``script`` with ``argv`` does; the lines written, checked for their provenance."""
    before = len(ledger.read_ledger(path)) if path.exists() else 0
    results.append_benchmarks(entries, path, script, [*argv, "--ledger", str(path)], device=device, threads=1)
    new = ledger.read_ledger(path)[before:]
    assert {r["command"] for r in new} == {" ".join([f"python benchmarks/{script}", *argv])}
    assert all(r["task"] == "benchmark" and r["record"] == "benchmark" and r["commit"] and r["hardware"] and
               r["scale"] == ("gpu" if device == "cuda" else "cpu") for r in new)
    return new


def test_a_table_declared_as_data_fills_its_columns_from_the_lines():
    """A benchmark table: one row per line of the device asked for (``bench``), each column a template (a named
    format, a ratio of two metrics, ``-`` where the row lacks a value, bold where the template says), rows in the
    declared order within the first appearances of a field, an optional column left out when empty; with ``pivot``,
    one row per value of a field, kept when it has a line for each value required."""
    def line(name, model, shape, **metrics):
        return {**GOOD, "experiment": f"bench/t/{name}", "task": "benchmark", "record": "benchmark", "model": model,
                "shape": shape, "metrics": metrics}

    rows = [line("a/y", "y", [2, 3], ms=30.0, ref=10.0), line("b/x", "x", [4], ms=200.0, ref=100.0),
            line("a/x", "x", [2, 3], ms=5.0), line("a/x+cuda", "x", [2, 3], ms=1.0, ref=4.0)]
    declaration = {
        "device": "", "define": {"lines": "bench('bench/t/*', device)"}, "source": "bench/t/*{{ device }}",
        "rows": "lines | ordered('model', ['x', 'y']) | ordered('shape', lines | map(attribute='shape') | list)",
        "columns": {"shape": "{{ r.shape | shape }}", "model": "{{ r.model }}",
                    "ms": "{{ ('**%s**' if r.model == 'y' else '%s') % (r.metrics.ms | ms) }}",
                    "ms / ref": "{{ '%.2f' % ratio(r.metrics, 'ms', 'ref') }}", "empty": "{{ r.nothing }}"}}
    spread = lambda table: [re.sub(r" +", " ", ln) for ln in table.splitlines()]
    table = spread(ledger.declared(lg(rows), **{**declaration, "optional": ["empty"]}))
    assert table[0] == "| shape | model | ms | ms / ref |"
    assert table[2:5] == ["| (2,3) | x | 5.0 | - |", "| (2,3) | y | **30.0** | 3.00 |", "| (4) | x | 200 | 2.00 |"]
    assert table[5] == "" and table[6].startswith("* Measured with `hoformer fit` at commit abc on CPU")
    assert "ledger lines `bench/t/*`" in table[6]
    gpu = spread(ledger.declared(lg(rows), **{**declaration, "device": "+cuda"}))
    assert gpu[2:4] == ["| (2,3) | x | 1.0 | 0.25 | - |", ""] and "ledger lines `bench/t/*+cuda`" in gpu[4]
    pivot = {"define": {"lines": "bench('bench/t/*')"}, "require": ["x"],
             "rows": "pivot(lines, 'shape', 'model') | select('has', require)",
             "columns": {"shape": "{{ r.shape | shape }}", "y / x": "{{ '%.0f / %.0f' % (r.y.metrics.ms, r.x.metrics.ms) }}"}}
    assert spread(ledger.declared(lg(rows), **pivot))[2:4] == ["| (2,3) | 30 / 5 |", "| (4) | - |"]
    assert ledger.declared(lg(rows), **{**pivot, "require": ["x", "y"]}).count("\n| (") == 1
    assert ledger.NO_RUNS in ledger.declared(lg(rows), **{**declaration, "define": {"lines": "bench('bench/none/*')"}})


def test_a_declared_table_says_its_notes_and_reads_any_selector():
    """``notes``: Jinja2 templates over the table's lines and its rows, one line each, a template that renders empty
    left out, ``""`` a blank line; every template empty: the table alone, without provenance; ``select``: lines of
    any task; a pivot column named by a number; no ``source``: no provenance."""
    rows = [{**GOOD, "experiment": f"analysis/t/h{h}", "task": "analysis", "model": "m", "heads": h,
             "metrics": {"ms": float(h)}} for h in (1, 8)]
    declaration = {"select": {"experiment": "analysis/t/*"}, "rows": "pivot(L(select), 'model', 'heads')",
                   "columns": {"model": "{{ r.model }}", "1 head": "{{ '%.1f' % r['1'].metrics.ms }}",
                               "8 heads": "{{ '%.1f' % r['8'].metrics.ms }}"}, "source": "analysis/t/*"}
    notes = ["* {{ lines | length }} lines, the slowest {{ f(lines | map(attribute='metrics.ms') | max, 1) }} ms.", "",
             "{% if rows | length > 5 %}never{% endif %}", "{{ rows[0].r.model }} done"]
    table = ledger.declared(lg(rows), **{**declaration, "notes": notes}).splitlines()
    assert [re.sub(r" +", " ", ln) for ln in table[:3:2]] == ["| model | 1 head | 8 heads |", "| m | 1.0 | 8.0 |"]
    assert table[3:7] == ["", "* 2 lines, the slowest 8.0 ms.", "", "m done"]
    assert table[7].startswith("* Measured with") and "ledger lines `analysis/t/*`" in table[7]
    quiet = ledger.declared(lg(rows), **{**declaration, "notes": ["{{ '' }}"]})
    assert quiet.splitlines()[-1].startswith("| m ") and "Measured" not in quiet
    assert "Measured" not in ledger.declared(lg(rows), **{**declaration, "source": None})


def test_benchmark_lines_from_attention_py_render_the_kernel_tables(tmp_path, monkeypatch):
    """``benchmarks/attention.py --ledger FILE`` appends one line per shape and variant with its provenance and the
    command without the file; the tables use the newest line of each experiment, so a re-measurement replaces the
    numbers it measured again; a GPU line is its own experiment."""
    import sys
    from types import SimpleNamespace

    attention = load_benchmark("attention")
    metrics = {"paper_product": (100.0, 50.0), "paper_sum": (100.0, 50.0), "kron_product": (40.0, 20.0),
               "kron_sum": (30.0, 25.0), "kron_linear": (60.0, 45.0), "kron_linear_sum": (50.0, 45.0),
               "kron_linear_assoc": (90.0, 80.0), "full": (400.0, 60.0), "axial": (200.0, 90.0)}
    entries = [dict(experiment=f"bench/attention/16x16x16/{n}", model=n, split="fwd+bwd, B=2, fp32",
                    metrics={"fwd_bwd_ms": t, "peak_mib": m, "t/paper": t / 100, "mem/paper": m / 50,
                             "flop/paper": 0.5}, shape=[16, 16, 16], note="test") for n, (t, m) in metrics.items()]
    path = tmp_path / "ledger.jsonl"
    old = dict(entries[2], metrics={**entries[2]["metrics"], "t/paper": 0.9})  # an earlier measurement, superseded
    monkeypatch.setattr(sys, "argv", ["attention.py", "--reps", "2", "--ledger", str(path)])
    attention.write_ledger(SimpleNamespace(ledger=str(path)), [old], "cpu")
    attention.write_ledger(SimpleNamespace(ledger=str(path)), entries, "cpu")
    rows = ledger.read_ledger(path)
    assert len(rows) == 10 and {r["command"] for r in rows} == {"python benchmarks/attention.py --reps 2"}
    table = table_of(rows, "bench/attention")
    assert re.search(r"\| \(16,16,16\) +\| kron_product +\| 40.0 +\| 20.0 +\| \*\*0.40\*\* +\| 0.40 +\| 0.50 +\|", table)
    assert "0.30-0.40x the time, 0.40-0.50x the peak memory, 0.50-0.50x the FLOPs" in table
    assert "(16,16,16) 10.0x / 13.3x" in table and "kron_linear_assoc" not in table
    assert "Measured with `python benchmarks/attention.py --reps 2`" in table
    linear = table_of(rows, "bench/attention_linear")
    assert re.search(r"\| \(16,16,16\) +\| 100.0 +\| 0.40x t, 0.40x mem +\| 0.60x t, 0.90x mem +\| 0.50x t, 0.90x mem +\| "
                     r"0.90x t, 1.60x mem +\| 1.50x +\|", linear)
    assert results.device_suffix("cuda:0") == "+cuda" and results.device_suffix("cpu", "bf16") == "+bf16"
    monkeypatch.setattr(results, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    attention.write_ledger(SimpleNamespace(ledger=str(path)), [dict(entries[2], metrics={
        **entries[2]["metrics"], "t/paper": 0.1})], "cuda", results.device_suffix("cuda"))
    rows = ledger.read_ledger(path)
    assert rows[-1]["experiment"] == "bench/attention/16x16x16/kron_product+cuda"
    assert table_of(rows, "bench/attention") == table and "| kron_product " in table_of(rows, "bench/attention_gpu")


def test_train_step_benchmark_runs_and_writes_its_lines(tmp_path, capsys):
    """``benchmarks/train_step.py`` (the paper-size training step, hoformer's layer against the paper-equation layer
    in the same model; the first item of a GPU window) runs end to end and records one ledger line per variant."""
    train_step = load_benchmark("train_step")
    path = tmp_path / "ledger.jsonl"
    argv = ["--cases", "etth1", "--reps", "1", "--modes", "--batch", "2", "--ledger", str(path)]
    assert train_step.main(argv) == 0
    assert "| etth1 | eager |" in capsys.readouterr().out
    rows = ledger.read_ledger(path)
    assert [r["experiment"] for r in rows] == ["bench/train_step/etth1/ceiling", "bench/train_step/etth1/eager"]
    row = rows[1]
    assert row["model"] == "hot_forecaster" and rows[0]["metrics"]["fraction_of_ceiling"] > 0
    # the ceiling line: counted FLOPs, their rate against the matmul ceiling measured in the same process, the top
    # operators and the projected run
    ceiling, m = rows[0], rows[0]["metrics"]
    assert ceiling["projected_epochs"] == 12 and m["gflop"] > 0 and m["ceiling_gflops_fp32"] > 0
    assert m["steps_per_epoch"] == 265
    # each field is rounded on its own (4 decimals for a fraction), hence the absolute tolerance of small fractions
    assert m["gflops"] == pytest.approx(m["gflop"] / (m["step_ms"] / 1e3), rel=0.02, abs=0.01)
    assert m["fraction_of_ceiling"] == pytest.approx(m["gflops"] / m["ceiling_gflops_fp32"], rel=0.02, abs=1e-3)
    assert 0 < m["counted_ops_ms"] and m["counted_ops_flop_ratio"] == 1.0 and m["bound_fraction"] > 0
    assert m["projected_run_h"] == pytest.approx(m["step_ms"] / 1e3 * 265 * 12 / 3600, rel=0.02, abs=1e-3)
    assert ceiling["top_ops"] and all(0 < share <= 1 for _, share in ceiling["top_ops"])
    assert row["command"] == "python benchmarks/train_step.py --cases etth1 --reps 1 --modes --batch 2"
    assert row["metrics"]["hoformer_ms"] > 0 and row["metrics"]["paper_ms"] > 0
    table = table_of(rows, "bench/train_step")
    m = row["metrics"]
    assert f"**{m['hoformer_ms'] / m['paper_ms']:.2f}**" in table and "| 1.00 " in table


def test_train_step_bf16_is_measured_against_the_bf16_ceiling_beside_its_fp32_step(tmp_path):
    """``--precision bf16`` on a CPU: the step under bf16 autocast against the bf16 matmul ceiling of the same
    process, and the float32 step of the same model timed in the same rounds (the ``bf16/fp32`` ratio); its line is
    ``+bf16`` and lands in the bf16 table, not the fp32 one."""
    train_step = load_benchmark("train_step")
    path = tmp_path / "ledger.jsonl"
    argv = ["--cases", "etth1_spatial", "--reps", "1", "--no-paper", "--batch", "2", "--precision", "bf16",
            "--ledger", str(path)]
    assert train_step.main(argv) == 0
    (row,) = ledger.read_ledger(path)
    m = row["metrics"]
    assert row["experiment"] == "bench/train_step/etth1_spatial/ceiling+bf16" and row["split"].endswith("bf16")
    assert m["ceiling_gflops_bf16"] > 0 and m["ceiling_gflops_fp32"] > 0
    assert m["fraction_of_ceiling"] == pytest.approx(m["gflops"] / m["ceiling_gflops_bf16"], rel=0.02, abs=1e-3)
    assert m["fp32_step_ms"] > 0 and m["bf16/fp32"] == pytest.approx(m["step_ms"] / m["fp32_step_ms"], rel=0.02)
    assert f"**{m['bf16/fp32']:.2f}**" in table_of([row], "bench/train_step_ceiling_bf16")
    assert "etth1_spatial" not in table_of([row], "bench/train_step_ceiling")


def test_dropout_benchmark_times_every_mask_and_checks_its_keep_rate(tmp_path):
    """``benchmarks/dropout.py`` times each way of drawing a dropout mask and records a line per variant; every mask
    keeps ``1 - p`` of a million elements to within 4 standard errors; the 32-bit-words mask keeps exactly the words
    at or above its threshold."""
    import torch

    dropout = load_benchmark("dropout")
    path = tmp_path / "ledger.jsonl"
    assert dropout.main(["--shape", "1000", "1000", "--reps", "1", "--ledger", str(path)]) == 0
    rows = ledger.read_ledger(path)
    names = ["bernoulli", "hoformer", "hoformer_torch", "mask_32bit_words", "words_32bit", "bias_gelu_torch",
             "bias_gelu_fused", "bernoulli_bf16", "hoformer_bf16", "hoformer_torch_bf16", "bias_gelu_fused_bf16"]
    assert [r["experiment"] for r in rows] == [f"bench/dropout/{n}" for n in names]
    for r in rows:
        m = r["metrics"]
        assert m["ms"] > 0 and m["vs_bernoulli"] == pytest.approx(m["ms"] / rows[0]["metrics"]["ms"], rel=0.01)
        assert r["model"].startswith("words") or abs(m["kept_z"]) < 4, r
    assert rows[0]["command"] == "python benchmarks/dropout.py --shape 1000 1000 --reps 1"
    torch.manual_seed(3)
    words = dropout._words(2**15).view(torch.int32)
    torch.manual_seed(3)
    mask = dropout.mask_words_32bit((2**16,), 0.1)
    assert torch.equal(mask != 0, words >= round(-2**31 + 0.1 * 2**32)) and float(mask.max()) == pytest.approx(1 / 0.9)
    table = table_of(rows, "bench/dropout")
    assert "| `bernoulli` " in table and "**1.00**" in table and "| `hoformer_torch` " in table
    assert "| `bias_gelu_fused` " in table


def test_compile_lines_supersede_the_committed_ones_and_ratios_come_from_the_lines(tmp_path):
    from types import SimpleNamespace

    compile_ = load_benchmark("compile")
    committed = ledger.read_ledger()
    a = SimpleNamespace(device="cpu", small=False, fallback_random="auto", mode=None, backend="inductor", reps=5)
    result = lambda m: {"model": m, "batch": 32, "eager_ms": 600.0, "compiled_ms": 300.0, "compile_s": 9.0}
    names = {e["experiment"] for fr in ("auto", "off")
             for e in compile_.ledger_entries(SimpleNamespace(**{**vars(a), "fallback_random": fr}),
                                              [result(m) for m in compile_.CASES])}
    assert names == _names(committed, "bench/compile/")  # a re-run of the documented commands supersedes them all
    (line,) = _write(compile_.ledger_entries(a, [result("hot_forecaster")]), tmp_path / "l.jsonl", "compile.py",
                     ["--reps", "5"])
    assert line["experiment"] == "bench/compile/hot_forecaster/compiled" and line["variant"] == "compiled"
    rows = committed + [line]
    table = table_of(rows, "bench/compile")
    newest = lg(rows).sel(task="benchmark", experiment="bench/compile/*")
    ratio = lambda m: m["compiled_ms"] / m["eager_ms"] if "eager_ms" in m else m["compiled/eager"]
    plain = next(r for r in newest if r["experiment"] == "bench/compile/hot_forecaster/compiled-plain")
    assert re.search(rf"\| hot_forecaster +\| 600.0 +\| 300.0 +\| \*\*0.50\*\* +\| {ratio(plain['metrics']):.2f} +\| 9 ", table)
    ratios = [ratio(r["metrics"]) for r in newest if r.get("variant") == "compiled"]
    assert f"{min(ratios):.2f}-{max(ratios):.2f}x" in table and 0.5 in ratios  # the range follows the new line


def test_decode_lines_keep_the_other_runs_of_the_same_machine(tmp_path, monkeypatch):
    from types import SimpleNamespace

    decode = load_benchmark("decode")
    committed = ledger.read_ledger()
    args = SimpleNamespace(device="cpu", batch=1, dim=64, heads=4, depth=2, other=21, steps=16, reps=3)
    run = lambda v, p, step: {"variant": v, "past": p, "step_ms": step, "step_median_ms": 3.0, "full_ms": 1000.0}
    entries = decode.ledger_entries(args, [run(v, p, 2.0) for p in (32, 256, 1024) for v in decode.VARIANTS])
    assert {e["experiment"] for e in entries} == _names(committed, "bench/decode/")
    lines = _write(decode.ledger_entries(args, [run("full", 1024, 2.0)]), tmp_path / "l.jsonl", "decode.py",
                   ["--threads", "1"])
    earlier = [r for r in committed if r["experiment"] == "bench/decode/past1024/full"]
    lines[0]["hardware"] = earlier[-1]["hardware"]  # the same machine as the committed runs
    speed = lambda m: m["full_ms"] / m["step_ms"] if "step_ms" in m else m["speedup"]
    others = ", ".join(f"{speed(r['metrics']):.0f}x" for r in earlier)
    table = table_of(committed + lines, "bench/decode")
    assert re.search(rf"\| `full` +\| 1024 +\| 2.00 \(3.00\) +\| 1000 +\| \*\*500x\*\* +\| {others} +\|", table)
    monkeypatch.setattr(results, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    gpu = _write(decode.ledger_entries(SimpleNamespace(**{**vars(args), "device": "cuda"}), [run("full", 1024, 0.5)]),
                 tmp_path / "l.jsonl", "decode.py", ["--device", "cuda"], device="cuda")
    assert table_of(committed + lines + gpu, "bench/decode") == table  # a GPU line never stands in the CPU table
    gpu_table = ledger.tables(committed + lines + gpu)["bench/decode_gpu"]
    assert re.search(r"\| `full` +\| 1024 +\| 0.50 \(3.00\) +\| 1000 +\| \*\*2000x\*\* +\| - +\|", gpu_table)


def test_weaver_and_triplet_lines_supersede_the_committed_ones_and_ratios_come_from_the_lines(tmp_path):
    from types import SimpleNamespace

    weaver, triplet = load_benchmark("weaver"), load_benchmark("triplet")
    committed = ledger.read_ledger()
    a = SimpleNamespace(device="cpu", batch=32, heads=8, window=12, nodes=207, dim=128, reps=2, dense_chunk=8,
                        step_batch=None, threads=1)
    kmv = {"seconds": 0.1, "peak_bytes": 10 * 2**20}
    dense = {"seconds": 1.0, "apply_seconds": 0.5, "peak_bytes": 100 * 2**20, "max_abs_err_vs_kmv": 1e-4}
    steps = [{"model": "weaver", "params": 5, "step_seconds": 1.0},
             {"model": "traffic_full_attention", "params": 3, "step_seconds": 4.0}]
    lines = _write(weaver.ledger_entries(a, kmv, dense, steps), tmp_path / "w.jsonl", "weaver.py", ["--reps", "2"])
    assert {r["experiment"] for r in lines} == _names(committed, "bench/weaver/")
    table = table_of(committed + lines, "bench/weaver")
    assert re.search(r"\| dense: form `Theta_T \(x\) Theta_S` \+ apply +\| 1,000 ms \(10x\) +\| 100 MiB for a chunk of 8 "
                     r"\(10x\) +\|", table)
    assert "Weaver's step is 4.0x faster" in table and "max |dense - KMV| = 1.0e-04" in table
    steps_ = {r["experiment"]: r["metrics"]["step_s"] for r in committed if r["experiment"].startswith("bench/weaver/step/")}
    x = steps_["bench/weaver/step/traffic_full_attention"] / steps_["bench/weaver/step/weaver"]
    assert f"Weaver's step is {x:.1f}x faster" in table_of(committed, "bench/weaver")
    args = SimpleNamespace(device="cpu", clock="cpu", dtype="float32", block=32, overlap=0.25, dim=64, heads=4,
                           repeats=5, threads=1)
    row = {"naive": {"time_s": 1.0, "peak_mib": 100.0, "saved_mib": 90.0},
           "fast": {"time_s": 0.25, "peak_mib": 10.0, "saved_mib": 9.0}}
    target = triplet.target_entry(args, 8, 512, row, {"naive": 10.0, "fast": 12.0})
    scaling = [triplet.scaling_entry(args, 2, L, {"hoba": 0.1, "full2d": 0.05 * L / 128}, {"peak_mib": 20.0},
                                     {"peak_mib": 10.0}, L / 100, (L / 100) ** 2 / 10)
               for L in (128, 256, 512, 1024, 2048, 4096)]
    lines = _write([target, *scaling], tmp_path / "t.jsonl", "triplet.py", ["--repeats", "5"])
    assert {r["experiment"] for r in lines} == _names(committed, "bench/triplet/")
    table = table_of(committed + lines, "bench/triplet_target")
    assert re.search(r"\| \*\*ratio fast / naive\*\* +\| \*\*0.25\*\* \(target <= 0.3: met\) +\| \*\*0.10\*\* \(target <= "
                     r"0.2: met\) +\| 0.100 +\| 1.20 +\|", table)
    scaling_table = table_of(committed + lines, "bench/triplet_scaling")
    assert re.search(r"\| 256 +\| 100.0 +\| 100.0 +\| 1.0 +\| 20.0 +\| 10.0 +\| 2.0 +\| 2.56 +\| 0.66 +\|", scaling_table)
    assert "cross near L = 1000, the measured times between L = 256 and L = 512" in scaling_table


def test_accelerator_chunk_and_gpu_train_step_lines_fill_the_gpu_tables_only(tmp_path, monkeypatch):
    chunk = load_benchmark("accelerator_chunk")
    committed = ledger.read_ledger()
    monkeypatch.setattr(results, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    res = {"paper": (30.0, 3000.0), "one chunk": (15.0, 6000.0), "chunked": (20.0, 4500.0)}
    entries = [chunk.ledger_entry(s, b, c, res, 256, "cuda", 10) for s, b in chunk.SHAPES for c in ("product", "sum")]
    assert {e["experiment"] for e in entries} == _names(committed, "bench/accelerator_chunk/")
    (line,) = _write(entries[:1], tmp_path / "l.jsonl", "accelerator_chunk.py", [], device="cuda")
    table = table_of(committed + [line], "bench/accelerator_chunk")
    assert re.search(r"\| \(64, 64\), 256 +\| product +\| 30.0 ms, 3000 MiB +\| 15.0 ms, 6000 MiB +\| "
                     r"\*\*20.0 ms, 4500 MiB\*\* +\|", table)
    base = next(r for r in committed if r["experiment"] == "bench/train_step/etth1/eager")
    gpu = [dict(base, experiment="bench/train_step/etth1/eager+cuda-bf16", split="training step, B=32, bf16",
                metrics={"hoformer_ms": 20.0, "paper_ms": 40.0, "compiled/eager": 1.0, "hoformer_mib": 100.0,
                         "paper_mib": 300.0})]
    assert table_of(committed + gpu, "bench/train_step") == table_of(committed, "bench/train_step")
    gpu_table = ledger.tables(committed + gpu)["bench/train_step_gpu"]
    assert re.search(r"\| etth1 +\| bf16 +\| eager +\| 20.0 +\| 40.0 +\| \*\*0.50\*\* +\| 1.00 +\| 100 +\| 300 +\|", gpu_table)


# ------------------------------------------------------------------------------------------- analysis.md
def _analysis_line(experiment: str, model: str, metrics: dict, commit: str = "abc1234", **more) -> dict:
    return {"experiment": experiment, "task": "benchmark" if experiment.startswith("bench/") else "analysis",
            "dataset": "D", "model": model, "scale": "cpu", "split": "val", "metrics": metrics, "seed": None,
            "epochs": 1, "best_epoch": None, "stopping": None, "wall_s": None, "hardware": "CPU, 2 cores",
            "torch": None, "commit": commit, "date": "2026-01-01", "command": "hoformer x", "record": "transcribed",
            "source": {"file": "docs/analysis.md", "commit": commit}, "command_reconstructed": True, **more}


def test_stable_rank_table_computes_eq_11_and_the_sum_ratio_from_the_lines():
    rows = [_analysis_line("analysis/stable_rank/etth1/hot_product", "hot_product",
                           {"val/mse": 0.5, "val/sr/mode0": 1.5, "val/sr/mode1": 2.0, "val/sr/product": 2.9,
                            "val/sr/sum": 8.7}),
            _analysis_line("analysis/stable_rank/etth1/full", "full", {"val/mse": 0.4, "val/sr/full": 1.25})]
    table = ledger.tables(rows)["analysis/etth1_stable_ranks"]
    assert re.search(r"\| HOT product +\| 0.500 +\| 1.5 +\| 2 +\| 2.9 +\| 8.7 +\| +\|", table)
    assert "HOT product 1.5 x 2 = 3.000 (logged 2.9)" in table and "3.0x; full attention 1.25." in table
    assert "Transcribed from docs/analysis.md at abc1234, run logs not kept" in table
    rows[0] = copy.deepcopy(rows[0])
    rows[0]["metrics"]["val/sr/mode0"] = 1.0  # one line changes: the derived numbers follow
    assert "HOT product 1 x 2 = 2.000 (logged 2.9)" in ledger.tables(rows)["analysis/etth1_stable_ranks"]
    rows.append(_analysis_line("analysis/stable_rank/etth1/full", "full", {"val/mse": 0.3, "val/sr/full": 1.5}))
    assert re.search(r"\| full attention +\| 0.300 ", ledger.tables(rows)["analysis/etth1_stable_ranks"])


def test_heads_table_and_its_spread_come_from_the_lines():
    rows = [_analysis_line(f"analysis/heads/etth1/hot_{c}/h{h}", f"hot_{c}", {"val/mse": v}, heads=h)
            for c, vals in (("product", (0.70, 0.72)), ("sum", (0.71, 0.74))) for h, v in zip((1, 8), vals)]
    table = ledger.tables(rows)["analysis/heads"]
    assert re.search(r"\| HOT \(product\) +\| 0.7000 +\| 0.7200 +\| 0.7000-0.7200 +\|", table) and "8 heads" in table
    assert "All 4 runs: validation MSE 0.7000-0.7400, a spread of 0.0400" in table
    rows[3] = dict(rows[3], metrics={"val/mse": 0.90})
    assert "0.7000-0.9000, a spread of 0.2000" in ledger.tables(rows)["analysis/heads"]


def test_growth_table_shows_the_newest_complete_run_and_the_change_between_runs():
    exps = lambda f, fw, fb, m: {"exp_flops": f, "exp_fwd": fw, "exp_fwdbwd": fb, "exp_mem": m}
    rows = [_analysis_line("bench/growth/kronecker_product", "kronecker_product",
                           {**exps(1.1, 0.9, 0.9, 1.0), "time_fwdbwd_ms@4096": 30.0}, commit="aaaaaaa"),
            _analysis_line("bench/growth/full", "full", {**exps(2.0, 1.8, 1.9, 1.0), "time_fwdbwd_ms@4096": 600.0},
                           commit="aaaaaaa"),
            _analysis_line("bench/growth/kronecker_product", "kronecker_product", {"exp_fwd": 1.2, "exp_fwdbwd": 1.0},
                           commit="bbbbbbb"),
            _analysis_line("bench/growth/full", "full", {"exp_fwd": 2.1, "exp_fwdbwd": 2.0}, commit="bbbbbbb")]
    table = ledger.tables(rows)["analysis/bench_growth"]
    assert re.search(r"\| Kronecker product +\| 1.10 +\| 0.90 +\| 0.90 +\| 1.00 +\|", table)
    assert "The largest change between runs is 0.30 (full attention, forward)" in table
    assert "is the same in every run" in table
    assert "30 ms (Kronecker product) vs 600 ms (full attention): full attention takes 20x" in table
    rows[2] = dict(rows[2], metrics={"exp_fwd": 2.5, "exp_fwdbwd": 1.0})
    table = ledger.tables(rows)["analysis/bench_growth"]
    assert "The largest change between runs is 1.60 (Kronecker product, forward)" in table and "changes between runs" in table


def test_flops_table_derives_tokens_and_the_full_attention_bound_from_the_sizes():
    sizes = dict(shape=[64, 64, 64], depth=2, dim=32, heads=4)
    rows = [_analysis_line(f"bench/flops/64^3/{a}", a, {"gflops": g}, patch=4, **sizes)
            for a, g in (("kronecker_product", 0.5), ("full", 1234.5))]
    rows.append(_analysis_line("bench/flops/64^3+patch16/full", "full", {"gflops": 0.25}, patch=16, **sizes))
    table = ledger.tables(rows)["analysis/bench_flops"]
    assert "patch 4 (16^3 = 4,096 tokens) | patch 16 (4^3 = 64 tokens)" in table.replace("  ", " ").replace("  ", " ")
    assert re.search(rf"\| full attention +\| 1,234.5 +\| 0.25 +\| {ledger.paper('hot/flops_224', 'full')} +\|", table)
    bound = 4 * 32 * 4096 ** 2 * 2  # 4 h e N^2 depth, h e = width
    assert f"= 4 x 32 x 4,096^2 x 2 = {bound / 1e9:.1f}e9 FLOPs ({bound / 1e9:,.0f} GFLOPs)" in table
    ref = ledger.PAPER["hot/flops_224"]["values"]["kronecker"]
    assert f"{0.5 / ref:.2f}x the paper's {ref:g}" in table


# ------------------------------------------------------------------------------------------------ traffic, text
def test_traffic_tables_aggregate_per_seed_lines_over_a_summary_line_and_pair_them():
    """A traffic model's per-seed lines replace its older line that only recorded a mean ± std over seeds; the newest
    line of a seed counts; models without per-seed lines keep theirs; the paired MAE is over common seeds."""
    def line(model, seed, mae30, **more):
        return {"experiment": f"weaver/los_loop_cpu/{model}", "task": "traffic", "dataset": "los_loop", "model": model,
                "seed": seed, "metrics": {"test/mae@30m": mae30, "test/mae@60m": mae30 + 1, "test/mae": mae30},
                "params": 10, "epochs": 8, "wall_s": 100.0, "hardware": "CPU, 2 cores, 1 thread(s) per run",
                "record": "run", **more}

    rows = [line("weaver_NT", [0, 1, 2], 9.0, metrics_std={"test/mae@30m": 0.5}),
            line("alternating", [0, 1, 2], 5.0, metrics_std={"test/mae@30m": 0.1}),
            line("weaver_NT", 0, 3.0), line("weaver_NT", 1, 9.9), line("weaver_NT", 1, 4.0), line("weaver_NT", 2, 5.0),
            line("hot", 0, 3.5), line("hot", 1, 4.6)]
    (nt,) = [r for r in lg(rows).traffic_runs() if r["model"] == "weaver_NT"]
    assert nt["seed"] == [0, 1, 2] and nt["metrics"]["test/mae@30m"] == 4.0  # seed 1's newest line (4.0), not 9.9
    assert abs(nt["metrics_std"]["test/mae@30m"] - 1.0) < 1e-12 and len(nt["lines"]) == 3
    table = declared(rows, "traffic/los_loop", reference="weaver_NT")
    assert re.search(r"\| `weaver_NT` +\| 10 +\| - +\| 4.000 ± 1.000 +\| 5.000 ± 1.000 .*\| reference +\|", table)
    assert re.search(r"\| `alternating` +\| 10 +\| - +\| 5.000 ± 0.100 .*\| - +\|", table) and "9.000" not in table
    assert re.search(rf"\| `hot` .*\| {re.escape(ledger.paired([0.5, 0.6]))} +\|", table)
    assert "| Los-loop | best baseline (`hot`) | - | 4.05 / 5.05 |" in re.sub(
        r" +\|", " |", ledger.tables(rows)["reproducing/traffic"])


def test_text_students_table_pairs_every_student_with_the_reference():
    def line(model, seed, acc, ds="trec"):
        return {"experiment": f"hoba/cpu_{ds}_{model}", "task": "text", "dataset": ds, "model": model, "seed": seed,
                "role": "student", "metrics": {"test/acc": acc}, "record": "run"}

    rows = [line("hoba", s, a) for s, a in ((0, 0.80), (1, 0.82))] + [line("full2d", s, a) for s, a in ((0, 0.79), (1, 0.80))]
    table = declared(rows, "text/students", rows=[{"label": "HOBA", "model": "hoba"}, {"label": "2D", "model": "full2d"}],
                     reference="full2d")
    assert re.search(rf"\| HOBA +\| 81.0 ± 1.4 +\| 80.0 / 82.0 \(seeds 0, 1\) +\| {re.escape(ledger.paired([1.0, 2.0], 1))} ",
                     table)
    assert re.search(r"\| 2D +\| 79.5 ± 0.7 .*\| reference ", table)


def test_hoba_students_writes_a_ledger_line_per_finished_run(tmp_path):
    """``benchmarks/hoba_students.py --ledger``: one ``run`` line per run folder with a test accuracy, its seed and
    stopping rule from the saved config, its last validation accuracy and the commands that produced it."""
    import yaml

    students = load_benchmark("hoba_students")
    run = tmp_path / "hoba" / "cpu_trec_hoba" / "s1"
    for version, rows in ((0, "epoch,val/acc\n0,0.5\n3,0.75\n"), (1, "epoch,test/acc\n3,0.8\n")):
        (run / "logs" / f"version_{version}").mkdir(parents=True)
        (run / "logs" / f"version_{version}" / "metrics.csv").write_text(rows)
    (run / "logs" / "version_0" / "config.yaml").write_text(yaml.safe_dump(
        {"seed_everything": 1, "trainer": {"max_epochs": 4, "callbacks": []}}))
    (tmp_path / "hoba" / "cpu_trec_full2d" / "s0").mkdir(parents=True)  # no logs: not a finished run
    path = tmp_path / "ledger.jsonl"
    assert students.main(["--root", str(tmp_path / "hoba"), "--datasets", "trec", "--ledger", str(path)]) == 0
    (line,) = ledger.read_ledger(path)
    assert (line["experiment"], line["seed"], line["record"], line["role"]) == ("hoba/cpu_trec_hoba", 1, "run", "student")
    assert line["metrics"] == {"test/acc": 0.8} and line["best_val"] == {"val/acc": 0.75}
    assert line["stopping"] == {"max_epochs": 4} and "--seed_everything=1" in line["command"]
    assert line["command"].startswith("hoformer fit --config configs/hoba/cpu_student.yaml")
    assert line["test_command"].startswith("hoformer test ") and line["test_command"].endswith("s1/checkpoints/last.ckpt")
    with pytest.raises(SystemExit):
        students.main(["--root", str(tmp_path / "none")])
