"""The ledger's table kinds (``benchmarks/ledger.py``): aggregates are computed from the lines, every table of the docs
is rendered from the committed ledger, and an empty selection says so."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from _bench import load_benchmark

REPO = Path(__file__).resolve().parents[1]


ledger = load_benchmark("ledger")


def _line(model: str, seed: int, horizon, mse: float, **more) -> dict:
    return {"experiment": f"x/{model}", "task": "forecasting", "dataset": "D", "model": model, "horizon": horizon,
            "seed": seed, "metrics": {"test/mse": mse, "test/mae": mse / 2}, "epochs": 3, "best_epoch": 1,
            "wall_s": 60.0, "hardware": "CPU, 2 cores, 1 thread(s) per run", **more}


def test_seed_table_averages_horizons_then_seeds_from_the_lines():
    h = ledger.HORIZONS
    rows = [_line("m", 1, hz, v) for hz, v in zip(h, (0.1, 0.2, 0.3, 0.4))]  # seed 1: mean 0.25
    rows.append(_line("m", 2, list(h), 0.35))  # seed 2: only its four-horizon average was recorded
    table = ledger.table_seeds(rows, [("M", {"model": "m"})], [1, 2])
    assert "| M | 0.250 / 0.350 | 0.300 ± 0.071 |" in table
    rows[0] = dict(rows[0], metrics={"test/mse": 0.5, "test/mae": 0.25})  # one horizon changes: every cell follows
    assert "| M | 0.350 / 0.350 | 0.350 ± 0.0000 |" in ledger.table_seeds(rows, [("M", {"model": "m"})], [1, 2])
    # a seed without every horizon (and no average line) is no row rather than a wrong mean
    assert ledger.NO_RUNS in ledger.table_seeds(rows[1:], [("M", {"model": "m"})], [1, 2])


def test_horizon_table_prefix_metrics_and_same_window_alternatives():
    """A line scoring several horizons (``test/mse@H``) and per-horizon lines share one table; the average column
    only appears for a metric every horizon has."""
    joint = _line("j", 1, 720, 0.0, metrics={f"test/mse@{h}": h / 1000 for h in ledger.HORIZONS})
    direct = [_line("d", 1, h, h / 1000 + 0.01) for h in ledger.HORIZONS]
    direct[0]["metrics"]["test_2161/mse"] = 0.05
    table = ledger.table_horizons([joint, *direct], [("joint", {"model": "j"}), ("direct", {"model": "d"})],
                                  metrics=(("test_2161/mse", "test/mse"),))
    assert "| joint | 0.096 | 0.192 | 0.336 | 0.720 | 0.336 |" in table
    assert "| direct | 0.050 | 0.202 | 0.346 | 0.730 | 0.332 |" in table


def test_empty_tables_say_no_runs_yet():
    for name in ("hot/etth1_paper", "hot/weather_paper", "hot/paper_runs"):
        body = ledger.TABLES[name]([]).splitlines()
        assert len(body) == 3 and body[2].startswith(f"| {ledger.NO_RUNS} |"), name


def test_every_table_renders_from_the_ledger_and_every_table_is_on_a_page():
    rows = ledger.read_ledger()
    used = {m.group("name") for f in ledger.doc_files() for m in ledger.TABLE_RE.finditer(f.read_text())}
    assert used <= set(ledger.TABLES) and set(ledger.TABLES) - used == set(), set(ledger.TABLES) - used
    for name, render in ledger.TABLES.items():
        body = render(copy.deepcopy(rows))
        assert body.startswith("| ") and "nan" not in body, name


def test_transcribed_lines_name_their_source_and_paper_numbers_are_no_lines():
    rows = ledger.read_ledger()
    pattern = re.compile(r"transcribed: (README\.md|docs/[\w.]+\.md) at [0-9a-f]{7}; run log not kept")
    for r in rows:
        assert r.get("record", "campaign") in ("campaign", "benchmark") or pattern.fullmatch(r["record"]), \
            r["experiment"]
        assert r["scale"] in ("paper", "cpu", "gpu"), r["experiment"]
    assert all("source" in v for v in ledger.PAPER.values())


def test_no_transcribed_line_stands_for_a_pending_campaign_experiment(monkeypatch):
    """The campaign counts an experiment whose name is in the ledger as done, so a line of an earlier, differently
    budgeted run must not carry the name of an experiment the campaign is still to run."""
    campaign = load_benchmark("campaign")
    monkeypatch.setattr(campaign, "data_present", lambda exp: True)
    planned = {e.name for plan in campaign.PLANS.values() for e in plan()}
    transcribed = {r["experiment"] for r in ledger.read_ledger() if r.get("record", "campaign") != "campaign"}
    assert planned and not transcribed & planned, sorted(transcribed & planned)


def test_benchmark_lines_from_attention_py_render_the_kernel_tables(tmp_path, monkeypatch):
    """``benchmarks/attention.py --ledger FILE`` appends one line per shape and variant with its provenance and the
    command without the file; the tables use the newest line of each experiment, so a re-measurement replaces the
    numbers it measured again."""
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
    assert all(r["task"] == "benchmark" and r["record"] == "benchmark" and r["commit"] and r["hardware"]
               for r in rows)
    table = ledger.table_attention(rows)
    assert "| (16,16,16) | kron_product | 40.0 | 20.0 | **0.40** | 0.40 | 0.50 |" in table
    assert "0.30-0.40x the time, 0.40-0.50x the peak memory, 0.50-0.50x the FLOPs" in table
    assert "(16,16,16) 10.0x / 13.3x" in table and "kron_linear_assoc" not in table
    linear = ledger.table_attention_linear(rows)
    assert "| (16,16,16) | 100.0 | 0.40x t, 0.40x mem | 0.60x t, 0.90x mem | 0.50x t, 0.90x mem | " \
           "0.90x t, 1.60x mem | 1.50x |" in linear
    assert ledger._kron_time(rows) == "0.30-0.40x" and ledger._full_speedup(rows) == "10x"
    # a GPU or bf16 measurement is its own experiment and never stands in the CPU fp32 table
    assert ledger.device_suffix("cuda:0") == "+cuda" and ledger.device_suffix("cpu", "bf16") == "+bf16"
    monkeypatch.setattr(ledger, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    attention.write_ledger(SimpleNamespace(ledger=str(path)), [dict(entries[2], metrics={
        **entries[2]["metrics"], "t/paper": 0.1})], "cuda", ledger.device_suffix("cuda"))
    rows = ledger.read_ledger(path)
    assert rows[-1]["experiment"] == "bench/attention/16x16x16/kron_product+cuda"
    assert ledger.table_attention(rows) == table


def test_train_step_benchmark_runs_and_writes_its_lines(tmp_path, capsys):
    """``benchmarks/train_step.py`` (the paper-size training step, hoformer's layer against the paper-equation layer
    in the same model; the first item of a GPU window) runs end to end and records one ledger line per variant."""
    train_step = load_benchmark("train_step")
    path = tmp_path / "ledger.jsonl"
    argv = ["--cases", "etth1", "--reps", "1", "--modes", "--batch", "2", "--ledger", str(path)]
    assert train_step.main(argv) == 0
    out = capsys.readouterr().out
    assert "| etth1 | eager |" in out and "| etth1 |" in out.split("| case | ms/step |")[1]
    ceiling, row = ledger.read_ledger(path)
    assert row["experiment"] == "bench/train_step/etth1/eager" and row["model"] == "hot_forecaster"
    assert row["command"] == "python benchmarks/train_step.py --cases etth1 --reps 1 --modes --batch 2"
    assert row["metrics"]["hoformer_ms"] > 0 and row["metrics"]["paper_ms"] > 0
    # the ceiling line: counted FLOPs, their rate against the matmul ceiling measured in the same process, the top
    # operators and the projected run
    m = ceiling["metrics"]
    assert ceiling["experiment"] == "bench/train_step/etth1/ceiling" and ceiling["projected_epochs"] == 12
    assert m["gflop"] > 0 and m["ceiling_gflops_fp32"] > 0 and m["steps_per_epoch"] == 265
    assert m["gflops"] == pytest.approx(m["gflop"] / (m["step_ms"] / 1e3), rel=0.02)
    assert m["fraction_of_ceiling"] == pytest.approx(m["gflops"] / m["ceiling_gflops_fp32"], rel=0.02)
    assert m["projected_run_h"] == pytest.approx(m["step_ms"] / 1e3 * 265 * 12 / 3600, rel=0.02)
    assert ceiling["top_ops"] and all(0 < share <= 1 for _, share in ceiling["top_ops"])


# ------------------------------------------------------------------------------------------- analysis.md
def _analysis_line(experiment: str, model: str, metrics: dict, commit: str = "abc1234", **more) -> dict:
    return {"experiment": experiment, "task": "benchmark" if experiment.startswith("bench/") else "analysis",
            "dataset": "D", "model": model, "scale": "cpu", "split": "val", "metrics": metrics, "seed": None,
            "epochs": 1, "best_epoch": None, "stopping": None, "wall_s": None, "hardware": "CPU, 2 cores, 1 thread(s) per run",
            "torch": None, "commit": commit, "date": "2026-01-01", "command": "hoformer x",
            "record": f"transcribed: docs/analysis.md at {commit}; run log not kept", **more}


ANALYSIS_TABLES = ("analysis/etth1_stable_ranks", "analysis/weather_stable_ranks", "analysis/adrenal_stable_ranks",
                   "analysis/heads", "analysis/bench_growth", "analysis/bench_flops")


def test_stable_rank_table_computes_eq_11_and_the_sum_ratio_from_the_lines():
    rows = [_analysis_line("analysis/stable_rank/etth1/hot_product", "hot_product",
                           {"val/mse": 0.5, "val/sr/mode0": 1.5, "val/sr/mode1": 2.0, "val/sr/product": 2.9,
                            "val/sr/sum": 8.7}),
            _analysis_line("analysis/stable_rank/etth1/full", "full", {"val/mse": 0.4, "val/sr/full": 1.25})]
    table = ledger.TABLES["analysis/etth1_stable_ranks"](rows)
    assert "| HOT product | 0.500 | 1.5 | 2 | 2.9 | 8.7 |  |" in table and "| full attention | 0.400 |" in table
    assert "HOT product 1.5 x 2 = 3.000 (logged 2.9)" in table and "3.0x; full attention 1.25." in table
    assert "at abc1234, run logs not kept" in table
    rows[0] = copy.deepcopy(rows[0])
    rows[0]["metrics"]["val/sr/mode0"] = 1.0  # one line changes: the derived numbers follow
    table = ledger.TABLES["analysis/etth1_stable_ranks"](rows)
    assert "HOT product 1 x 2 = 2.000 (logged 2.9)" in table
    # a re-measurement under the same name supersedes the line
    rows.append(_analysis_line("analysis/stable_rank/etth1/full", "full", {"val/mse": 0.3, "val/sr/full": 1.5}))
    assert "| full attention | 0.300 |" in ledger.TABLES["analysis/etth1_stable_ranks"](rows)


def test_heads_table_and_its_spread_come_from_the_lines():
    rows = [_analysis_line(f"analysis/heads/etth1/hot_{c}/h{h}", f"hot_{c}", {"val/mse": v}, heads=h)
            for c, vals in (("product", (0.70, 0.72)), ("sum", (0.71, 0.74))) for h, v in zip((1, 8), vals)]
    table = ledger.TABLES["analysis/heads"](rows)
    assert "| HOT (product) | 0.7000 | 0.7200 | 0.7000-0.7200 |" in table and "| 1 head | 8 heads |" in table
    assert "All 4 runs: validation MSE 0.7000-0.7400, a spread of 0.0400" in table
    rows[3] = dict(rows[3], metrics={"val/mse": 0.90})
    assert "0.7000-0.9000, a spread of 0.2000" in ledger.TABLES["analysis/heads"](rows)


def test_growth_table_shows_the_newest_complete_run_and_the_change_between_runs():
    exps = lambda f, fw, fb, m: {"exp_flops": f, "exp_fwd": fw, "exp_fwdbwd": fb, "exp_mem": m}
    rows = [_analysis_line("bench/growth/kronecker_product", "kronecker_product",
                           {**exps(1.1, 0.9, 0.9, 1.0), "time_fwdbwd_ms@4096": 30.0}, commit="aaaaaaa"),
            _analysis_line("bench/growth/full", "full", {**exps(2.0, 1.8, 1.9, 1.0), "time_fwdbwd_ms@4096": 600.0},
                           commit="aaaaaaa"),
            # a second run that kept only the time exponents: in the spread, not in the table
            _analysis_line("bench/growth/kronecker_product", "kronecker_product", {"exp_fwd": 1.2, "exp_fwdbwd": 1.0},
                           commit="bbbbbbb"),
            _analysis_line("bench/growth/full", "full", {"exp_fwd": 2.1, "exp_fwdbwd": 2.0}, commit="bbbbbbb")]
    table = ledger.TABLES["analysis/bench_growth"](rows)
    assert "| Kronecker product | 1.10 | 0.90 | 0.90 | 1.00 |" in table and "| full attention | 2.00 | 1.80 |" in table
    assert "The largest change between runs is 0.30 (full attention, forward)" in table
    assert "is the same in every run" in table
    assert "30 ms (Kronecker product) vs 600 ms (full attention): full attention takes 20x" in table
    assert "at aaaaaaa, bbbbbbb" in table
    rows[2] = dict(rows[2], metrics={"exp_fwd": 2.5, "exp_fwdbwd": 1.0})  # the product now grows faster than full
    table = ledger.TABLES["analysis/bench_growth"](rows)
    assert "The largest change between runs is 1.60 (Kronecker product, forward)" in table
    assert "changes between runs" in table
    rows.append(_analysis_line("bench/growth/kronecker_product", "kronecker_product", exps(1.0, 0.8, 0.8, 0.9),
                               commit="ccccccc"))  # a complete newer run replaces the table row
    assert "| Kronecker product | 1.00 | 0.80 | 0.80 | 0.90 |" in ledger.TABLES["analysis/bench_growth"](rows)


def test_flops_table_derives_tokens_and_the_full_attention_bound_from_the_sizes():
    sizes = dict(shape=[64, 64, 64], depth=2, dim=32, heads=4)
    rows = [_analysis_line(f"bench/flops/64^3/{a}", a, {"gflops": g}, patch=4, **sizes)
            for a, g in (("kronecker_product", 0.5), ("full", 1234.5))]
    rows.append(_analysis_line("bench/flops/64^3+patch16/full", "full", {"gflops": 0.25}, patch=16, **sizes))
    table = ledger.TABLES["analysis/bench_flops"](rows)
    assert "patch 4 (16^3 = 4,096 tokens) | patch 16 (4^3 = 64 tokens)" in table
    assert "| full attention | 1,234.5 | 0.25 | 775.3 |" in table and "| Kronecker product | 0.5 | - |" in table
    bound = 4 * 32 * 4096 ** 2 * 2  # 4 h e N^2 depth, h e = width
    assert f"= 4 x 32 x 4,096^2 x 2 = {bound / 1e9:.1f}e9 FLOPs ({bound / 1e9:,.0f} GFLOPs)" in table
    paper = ledger.PAPER["hot/flops_224"]["kronecker"]
    assert f"{0.5 / paper:.2f}x the paper's {paper}" in table


def test_analysis_tables_of_no_lines_say_so():
    for name in ANALYSIS_TABLES:
        body = ledger.TABLES[name]([]).splitlines()
        assert len(body) == 3 and body[2].startswith(f"| {ledger.NO_RUNS} |"), name
def _names(rows: list[dict], prefix: str) -> set[str]:
    return {r["experiment"] for r in rows if r["experiment"].startswith(prefix)}


def _write(entries: list[dict], path: Path, script: str, argv: list[str], device: str = "cpu") -> list[dict]:
    """Append ``entries`` as ``script`` with ``argv`` does; the lines written, checked for their provenance."""
    before = len(ledger.read_ledger(path))
    ledger.append_benchmarks(entries, path, script, [*argv, "--ledger", str(path)], device=device, threads=1)
    new = ledger.read_ledger(path)[before:]
    assert {r["command"] for r in new} == {" ".join([f"python benchmarks/{script}", *argv])}
    assert all(r["task"] == "benchmark" and r["record"] == "benchmark" and r["commit"] and r["hardware"] and
               r["scale"] == ("gpu" if device == "cuda" else "cpu") for r in new)
    return new


def test_compile_and_train_step_lines_supersede_the_transcribed_ones_and_ratios_come_from_the_lines(tmp_path):
    from types import SimpleNamespace

    compile_ = load_benchmark("compile")
    committed = ledger.read_ledger()
    a = SimpleNamespace(device="cpu", small=False, fallback_random="auto", mode=None, backend="inductor", reps=5)
    result = lambda m: {"model": m, "batch": 32, "eager_ms": 600.0, "compiled_ms": 300.0, "compile_s": 9.0}
    names = {e["experiment"] for fr in ("auto", "off")
             for e in compile_.ledger_entries(SimpleNamespace(**{**vars(a), "fallback_random": fr}),
                                              [result(m) for m in compile_.CASES])}
    assert names == _names(committed, "bench/compile/")  # a re-run of the documented commands supersedes them all
    path = tmp_path / "ledger.jsonl"
    (line,) = _write(compile_.ledger_entries(a, [result("hot_forecaster")]), path, "compile.py", ["--reps", "5"])
    assert line["experiment"] == "bench/compile/hot_forecaster/compiled" and line["variant"] == "compiled"
    assert compile_.ledger_entries(SimpleNamespace(**{**vars(a), "device": "cuda"}), [result("hoba_classifier")])[0][
        "experiment"] == "bench/compile/hoba_classifier/compiled+cuda"
    table = ledger.table_compile(committed + [line])
    newest = ledger.latest(committed)
    others = [ledger._compile_ratio(r["metrics"]) for r in newest if r["experiment"].startswith("bench/compile/")
              and r.get("variant") == "compiled" and r["case"] != "hot_forecaster"]
    plain = next(r for r in newest if r["experiment"] == "bench/compile/hot_forecaster/compiled-plain")
    assert f"| hot_forecaster | 600.0 | 300.0 | **0.50** | {ledger._compile_ratio(plain['metrics']):.2f} | 9 |" in table
    assert f"{min(others + [0.5]):.2f}-{max(others + [0.5]):.2f}x" in table  # the range follows the new line
    # the training step's ratios are computed from its lines' times
    rows = copy.deepcopy(committed)
    newest = {r["experiment"]: r for r in ledger.latest(rows)}
    newest["bench/train_step/etth1/eager"]["metrics"].update(hoformer_ms=1084.0, paper_ms=1242.0)
    newest["bench/train_step/etth1/compiled-default"]["metrics"].update(hoformer_ms=1150.0, paper_ms=1158.0)
    assert "| etth1 | fp32 | compiled default | 1150 | 1158 | **0.99** | 1.06 |" in ledger.table_train_step(rows)
    newest["bench/train_step/etth1/eager"]["metrics"]["hoformer_ms"] = 575
    assert "| etth1 | fp32 | compiled default | 1150 | 1158 | **0.99** | 2.00 |" in ledger.table_train_step(rows)


def test_decode_lines_supersede_the_transcribed_ones_and_keep_the_other_runs(tmp_path, monkeypatch):
    from types import SimpleNamespace

    decode = load_benchmark("decode")
    committed = ledger.read_ledger()
    args = SimpleNamespace(device="cpu", batch=1, dim=64, heads=4, depth=2, other=21, steps=16, reps=3)
    run = lambda v, p, step: {"variant": v, "past": p, "step_ms": step, "step_median_ms": 3.0, "full_ms": 1000.0}
    entries = decode.ledger_entries(args, [run(v, p, 2.0) for p in (32, 256, 1024) for v in decode.VARIANTS])
    assert {e["experiment"] for e in entries} == _names(committed, "bench/decode/")
    assert {e["split"] for e in entries} == {r["split"] for r in committed
                                             if r["experiment"].startswith("bench/decode/")}
    path = tmp_path / "ledger.jsonl"
    lines = _write(decode.ledger_entries(args, [run("full", 1024, 2.0)]), path, "decode.py", ["--threads", "1"])
    lines[0]["hardware"] = next(  # the same machine as the transcribed runs
        r["hardware"] for r in committed if r["experiment"] == "bench/decode/past1024/full")
    table = ledger.table_decode(committed + lines)
    assert "| `full` | 1024 | 2.00 (3.00) | 1000 | **500x** | 1386x, 1786x |" in table
    # a GPU line is its own experiment and never stands in the CPU table
    monkeypatch.setattr(ledger, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    gpu = _write(decode.ledger_entries(SimpleNamespace(**{**vars(args), "device": "cuda"}), [run("full", 1024, 0.5)]),
                 path, "decode.py", ["--device", "cuda"], device="cuda")
    assert gpu[0]["experiment"] == "bench/decode/past1024/full+cuda"
    assert ledger.table_decode(committed + lines + gpu) == table
    gpu_table = ledger.TABLES["bench/decode_gpu"](committed + lines + gpu)
    assert "| `full` | 1024 | 0.50 (3.00) | 1000 | **2000x** | - |" in gpu_table
    assert "`bench/decode/*+cuda`" in gpu_table


def test_weaver_lines_supersede_the_transcribed_ones_and_ratios_come_from_the_lines(tmp_path):
    from types import SimpleNamespace

    weaver = load_benchmark("weaver")
    committed = ledger.read_ledger()
    a = SimpleNamespace(device="cpu", batch=32, heads=8, window=12, nodes=207, dim=128, reps=2, dense_chunk=8,
                        step_batch=None, threads=1)
    kmv = {"seconds": 0.1, "peak_bytes": 10 * 2**20}
    dense = {"seconds": 1.0, "apply_seconds": 0.5, "peak_bytes": 100 * 2**20, "max_abs_err_vs_kmv": 1e-4}
    steps = [{"model": "weaver", "params": 5, "step_seconds": 1.0},
             {"model": "traffic_full_attention", "params": 3, "step_seconds": 4.0}]
    lines = _write(weaver.ledger_entries(a, kmv, dense, steps), tmp_path / "ledger.jsonl", "weaver.py",
                   ["--threads", "1", "--reps", "2"])
    assert {r["experiment"] for r in lines} == _names(committed, "bench/weaver/")
    table = ledger.table_weaver(committed + lines)
    assert "| dense: form `Theta_T (x) Theta_S` + apply | 1,000 ms (10x) | 100 MiB for a chunk of 8 (10x) |" in table
    assert "Weaver's step is 4.0x faster" in table and "max |dense - KMV| = 1.0e-04" in table
    assert "2.9x faster" in ledger.table_weaver(committed) and "max |dense" not in ledger.table_weaver(committed)


def test_triplet_lines_supersede_the_transcribed_ones_and_ratios_come_from_the_lines(tmp_path):
    from types import SimpleNamespace

    triplet = load_benchmark("triplet")
    committed = ledger.read_ledger()
    args = SimpleNamespace(device="cpu", clock="cpu", dtype="float32", block=32, overlap=0.25, dim=64, heads=4,
                           repeats=5, threads=1)
    row = {"naive": {"time_s": 1.0, "peak_mib": 100.0, "saved_mib": 90.0},
           "fast": {"time_s": 0.25, "peak_mib": 10.0, "saved_mib": 9.0}}
    target = triplet.target_entry(args, 8, 512, row, {"naive": 10.0, "fast": 12.0})
    scaling = [triplet.scaling_entry(args, 2, L, {"hoba": 0.1, "full2d": 0.05 * L / 128}, {"peak_mib": 20.0},
                                     {"peak_mib": 10.0}, L / 100, (L / 100) ** 2 / 10)
               for L in (128, 256, 512, 1024, 2048, 4096)]
    lines = _write([target, *scaling], tmp_path / "ledger.jsonl", "triplet.py", ["--repeats", "5"])
    assert {r["experiment"] for r in lines} == _names(committed, "bench/triplet/")
    assert lines[0]["split"] == next(r["split"] for r in committed if r["experiment"] == "bench/triplet/target")
    table = ledger.table_triplet_target(committed + lines)
    assert "| **ratio fast / naive** | **0.25** (target <= 0.3: met) | **0.10** (target <= 0.2: met) | 0.100 | 1.20 |" \
        in table and ledger._triplet(committed + lines) == "0.25x / 0.10x"
    scaling_table = ledger.table_triplet_scaling(committed + lines)
    assert "| 256 | 100.0 | 100.0 | 1.0 | 20.0 | 10.0 | 2.0 | 2.56 | 0.66 |" in scaling_table
    assert "cross near L = 1000, the measured times between L = 256 and L = 512" in scaling_table
    assert "L = 1400, the measured times between L = 2048 and L = 4096" in ledger.table_triplet_scaling(committed)


def test_accelerator_chunk_lines_are_gpu_lines_and_ratios_come_from_the_lines(tmp_path, monkeypatch):
    chunk = load_benchmark("accelerator_chunk")
    committed = ledger.read_ledger()
    monkeypatch.setattr(ledger, "hardware", lambda device, threads: "a GPU (CUDA 13)")
    res = {"paper": (30.0, 3000.0), "one chunk": (15.0, 6000.0), "chunked": (20.0, 4500.0)}
    entries = [chunk.ledger_entry(s, b, c, res, 256, "cuda", 10) for s, b in chunk.SHAPES for c in ("product", "sum")]
    assert {e["experiment"] for e in entries} == _names(committed, "bench/accelerator_chunk/")
    (line,) = _write(entries[:1], tmp_path / "ledger.jsonl", "accelerator_chunk.py", [], device="cuda")
    assert line["experiment"] == "bench/accelerator_chunk/64x64-b256/product+cuda"
    table = ledger.table_accelerator_chunk(committed + [line])
    assert "| (64, 64), 256 | product | 30.0 ms, 3000 MiB | 15.0 ms, 6000 MiB | **20.0 ms, 4500 MiB** |" in table
    assert "1.5-2.0x faster" in table and "by 25-37%" in table and "at most 33% more time" in table


def test_gpu_training_step_and_attention_lines_fill_the_gpu_tables_only():
    committed = ledger.read_ledger()
    base = next(r for r in committed if r["experiment"] == "bench/train_step/etth1/eager")
    gpu = [dict(base, experiment="bench/train_step/etth1/eager+cuda-bf16", split="training step, B=32, bf16",
                metrics={"hoformer_ms": 20.0, "paper_ms": 40.0, "hoformer_mib": 100.0, "paper_mib": 300.0}),
           dict(base, experiment="bench/train_step/etth1/compiled-default+cuda-bf16", variant="compiled default",
                split="training step, B=32, bf16", metrics={"hoformer_ms": 5.0, "paper_ms": 8.0})]
    assert ledger.table_train_step(committed + gpu) == ledger.table_train_step(committed)
    table = ledger.TABLES["bench/train_step_gpu"](committed + gpu)
    assert "| etth1 | bf16 | eager | 20.0 | 40.0 | **0.50** | 1.00 | 100 | 300 |" in table
    assert "| etth1 | bf16 | compiled default | 5.0 | 8.0 | **0.62** | 0.25 | - | - |" in table
    cpu = [r for r in committed if r["experiment"].startswith("bench/attention/16x16x16/")]
    cuda = [dict(r, experiment=r["experiment"] + "+cuda", metrics={**r["metrics"], "fwd_bwd_ms": 1.0}) for r in cpu]
    assert ledger.table_attention(committed + cuda) == ledger.table_attention(committed)
    gpu_table = ledger.TABLES["bench/attention_gpu"](committed + cuda)
    assert "| (16,16,16) | kron_product | 1.0 |" in gpu_table and "(21,24)" not in gpu_table
    assert "`bench/attention/*+cuda`" in gpu_table


def test_traffic_tables_aggregate_per_seed_lines_over_a_summary_line():
    """A traffic model's per-seed lines (``benchmarks/weaver_losloop.py --ledger``) replace its older line that only
    recorded a mean ± std over seeds; the newest line of a seed counts; models without per-seed lines keep theirs."""
    def line(model, seed, mae30, **more):
        return {"experiment": f"weaver/los_loop_cpu/{model}", "task": "traffic", "dataset": "los_loop", "model": model,
                "seed": seed, "metrics": {"test/mae@30m": mae30, "test/mae@60m": mae30 + 1}, "params": 10, "epochs": 8,
                "wall_s": 100.0, "hardware": "CPU, 2 cores, 1 thread(s) per run", **more}

    summary = line("weaver_NT", [0, 1, 2], 9.0, metrics_std={"test/mae@30m": 0.5})
    rows = [summary, line("alternating", [0, 1, 2], 5.0, metrics_std={"test/mae@30m": 0.1}),
            line("weaver_NT", 0, 3.0), line("weaver_NT", 1, 9.9), line("weaver_NT", 1, 4.0), line("weaver_NT", 2, 5.0)]
    (nt,) = [r for r in ledger.traffic_runs(rows) if r["model"] == "weaver_NT"]
    assert nt["seed"] == [0, 1, 2] and nt["metrics"]["test/mae@30m"] == 4.0  # seed 1's newest line (4.0), not 9.9
    assert abs(nt["metrics_std"]["test/mae@30m"] - 1.0) < 1e-12 and len(nt["lines"]) == 3
    table = ledger.table_traffic(rows)
    assert "| `weaver_NT` | 10 | - | 4.000 ± 1.000 | 5.000 ± 1.000 |" in table
    assert "| `alternating` | 10 | - | 5.000 ± 0.100 |" in table and "9.000" not in table
    assert ledger._traffic(rows, "weaver_NT") == (4.0, 5.0)
    assert "| Los-loop | best baseline (`alternating`) | - | 5.00 / 6.00 |" in ledger.table_reproducing_traffic(rows)


def test_weaver_losloop_writes_one_line_per_seed_without_machine_paths():
    """``benchmarks/weaver_losloop.py --ledger``: a run's test metrics under the ledger's names, its epoch 0-based, and
    a command without the ledger file or the side output ``--out`` (paths of the machine that ran it)."""
    losloop = load_benchmark("weaver_losloop")
    command = ledger.benchmark_command("weaver_losloop.py", ["--variants", "weaver_NT", "--out", "/tmp/x/a.jsonl",
                                                             "--ledger", "/tmp/x/l.jsonl"], "/tmp/x/l.jsonl",
                                       local=("--out",))
    assert command == "python benchmarks/weaver_losloop.py --variants weaver_NT"
    run = {"variant": "weaver_NT", "seed": 1, "epochs": 8, "best_epoch": 7, "params": 5, "val_mae": 3.2,
           "train_seconds": 12.0, "test": {"mae@3": 3.0, "mae@6": 3.5, "mae@12": 4.5, "mae": 3.6, "mape": 11.0,
                                          "rmse": 7.0}}
    line = losloop.ledger_line(run, command, threads=1)
    assert line["metrics"] == {"test/mae@15m": 3.0, "test/mae@30m": 3.5, "test/mae@60m": 4.5, "test/mae": 3.6,
                               "test/mape": 11.0, "test/rmse": 7.0}
    assert (line["seed"], line["best_epoch"], line["experiment"]) == (1, 6, "weaver/los_loop_cpu/weaver_NT")
    assert ledger.traffic_runs([line])[0]["metrics"]["test/mae@30m"] == 3.5
