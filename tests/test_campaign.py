"""The paper-scale campaign (``benchmarks/campaign.py``): exact resumes across deadlines, the ledger line of a finished
run, planning and packing, the dry run, and the documentation tables generated from ``results/ledger.jsonl``."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from _bench import load_benchmark

REPO = Path(__file__).resolve().parents[1]


campaign = load_benchmark("campaign")

TINY = ["--config", str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_product.yaml"),
        "--data.init_args.synthetic=true", "--data.init_args.synthetic_length=600", "--data.init_args.num_workers=0",
        "--data.init_args.seq_len=32", "--data.init_args.pred_len=16", "--data.init_args.batch_size=16",
        "--model.model.init_args.dim=16", "--model.model.init_args.depth=1", "--model.model.init_args.num_heads=2",
        "--model.model.init_args.patch_size=8", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2", "--trainer.max_epochs=3", "--trainer.enable_model_summary=false"]


def in_process(argv, log_path, threads, deadline):
    """The campaign's runner, without a process per command."""
    from hoformer.cli import main

    return main(list(argv))


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """A tiny forecasting experiment registered as ``test/tiny`` (and ``test/tiny+es``, early-stopped)."""
    exps = {"test/tiny": [*TINY, "--trainer.default_root_dir=unused"]}
    monkeypatch.setattr(campaign.paper_configs, "experiments", lambda: exps)
    monkeypatch.chdir(tmp_path)
    return campaign.Experiment("test/tiny", "test/tiny", scale="cpu", family="forecasting")


def _weights(root: Path) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_interrupted_run_resumes_exactly_and_writes_one_ledger_line(tiny, tmp_path):
    """A run stopped by the deadline after its first epoch, then resumed by the next call, ends with exactly the
    weights and test metrics of an uninterrupted run; only the finished run gets a ledger line, with its provenance."""
    ledger = tmp_path / "ledger.jsonl"
    far = time.time() + 3600
    ref = campaign.Campaign(tmp_path / "ref", tmp_path / "ref.jsonl", "cpu", 1, far, runner=in_process)
    assert ref.run(tiny, test_reserve=0) == "done"

    past = campaign.Campaign(tmp_path / "out", ledger, "cpu", 1, time.time() - 1, runner=in_process)
    assert past.run(tiny, test_reserve=0) == "paused"
    root = tmp_path / "out" / "test" / "tiny"
    assert campaign._ckpt_epochs(root) == 1 and not ledger.exists()
    assert json.loads((root / "deadline.json").read_text())["stopped_by_deadline"] is True

    again = campaign.Campaign(tmp_path / "out", ledger, "cpu", 1, far, runner=in_process)
    assert again.run(tiny, test_reserve=0) == "done"
    assert again.run(tiny, test_reserve=0) == "done"  # nothing runs twice
    ref_w, w = _weights(tmp_path / "ref" / "test" / "tiny"), _weights(root)
    assert ref_w.keys() == w.keys() and all(torch.equal(ref_w[k], w[k]) for k in w)

    (line,) = campaign.read_ledger(ledger)
    (ref_line,) = campaign.read_ledger(tmp_path / "ref.jsonl")
    assert line["metrics"] == ref_line["metrics"] and set(line["metrics"]) >= {"test/mse", "test/mae"}
    assert line["epochs"] == 3 and line["attempts"] == 2 and ref_line["attempts"] == 1
    assert line["stopping"] == {"max_epochs": 3}
    assert line["seed"] == 2024 and line["scale"] == "cpu" and line["task"] == "forecasting"
    assert line["horizon"] == 16 and line["lookback"] == 32
    assert line["record"] == "run"
    for key in ("experiment", "dataset", "model", "best_epoch", "wall_s", "hardware", "torch", "commit", "command"):
        assert line[key] not in (None, ""), key
    assert line["command"].startswith("hoformer fit --config ") and "runs/campaign/test/tiny" in line["command"]
    assert line["test_command"] == line["command"].replace("hoformer fit", "hoformer test", 1) + " --ckpt_path best"
    state = json.loads((root / "campaign.json").read_text())
    assert line["fit_s"] == line["wall_s"] == round(sum(a["wall_s"] for a in state["attempts"]), 1)
    assert line["test_s"] == state["test_s"] > 0


def test_early_stopping_is_in_the_command_and_the_ledger(tiny, tmp_path):
    exp = campaign.Experiment("test/tiny+es", "test/tiny", scale="cpu", patience=1, family="forecasting")
    assert exp.args()[-4:] == ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
                               "--trainer.callbacks.monitor=val/mae", "--trainer.callbacks.patience=1",
                               "--trainer.callbacks.mode=min"]
    c = campaign.Campaign(tmp_path / "out", tmp_path / "l.jsonl", "cpu", 1, time.time() + 3600, runner=in_process)
    assert c.run(exp, test_reserve=0) == "done"
    (line,) = campaign.read_ledger(tmp_path / "l.jsonl")
    assert line["stopping"]["early_stopping"] == {"monitor": "val/mae", "mode": "min", "patience": 1, "min_delta": 0.0}
    assert 1 <= line["epochs"] <= 3 and line["best_epoch"] < line["epochs"]
    # a second campaign on another folder that records into the same ledger adds no second line
    other = campaign.Campaign(tmp_path / "other", tmp_path / "l.jsonl", "cpu", 1, time.time() + 3600, runner=in_process)
    assert other.run(exp, test_reserve=0) == "done"
    assert len(campaign.read_ledger(tmp_path / "l.jsonl")) == 1


def test_a_run_folder_is_resumed_and_recorded_only_by_the_arguments_that_started_it(tiny, tmp_path):
    """An experiment whose arguments changed under the same name (a plan edited between two calls) finds the
    folder of the earlier arguments: it is refused, not resumed nor tested as this experiment, and nothing is
    recorded; the experiment of the folder's own arguments still finds it done."""
    ledger = tmp_path / "l.jsonl"
    c = campaign.Campaign(tmp_path / "out", ledger, "cpu", 1, time.time() + 3600, runner=in_process)
    assert c.run(tiny, test_reserve=0) == "done"
    state = json.loads((tmp_path / "out" / "test" / "tiny" / "campaign.json").read_text())
    assert state["attempts"][0]["args"] == tiny.args()
    assert campaign.read_ledger(ledger)[0]["precision"] == "32-true"  # the trainer's, as the run resolved it
    changed = campaign.Experiment("test/tiny", "test/tiny", ("--model.model.init_args.head=flatten",), scale="cpu",
                                  family="forecasting")
    logged = []
    c2 = campaign.Campaign(tmp_path / "out", ledger, "cpu", 1, time.time() + 3600, log=logged.append,
                           runner=in_process)
    assert c2.run(changed, test_reserve=0) == "failed"
    assert "holds a run of other arguments" in logged[0] and "head=flatten" in logged[0]
    assert len(campaign.read_ledger(ledger)) == 1
    assert c2.run(tiny, test_reserve=0) == "done"
    # the plan and --status say the same: the folder is not the changed experiment's progress nor its epoch times
    out = tmp_path / "out"
    assert campaign._status(changed, out, set()).startswith("refused")
    assert campaign._status(tiny, out, set()) == "in progress"  # its checkpoint (not in this empty ledger set)
    assert campaign.estimate_s(changed, out, [], {})[2].startswith("unknown")
    assert campaign.estimate_s(tiny, out, [], {})[2] == "this run's epochs"


def test_a_run_that_early_stopping_and_the_deadline_end_together_is_finished_not_paused(tiny, tmp_path, monkeypatch,
                                                                                        capsys):
    """min_delta 1000: the validation MAE never improves after epoch 0, so patience 1 stops after epoch 1, the epoch
    the deadline stops too (the deadline is checked before early stopping). The run is finished (tested, one ledger
    line); resuming its last.ckpt trains no further epoch."""
    from hoformer.cli import main
    from hoformer.train import Deadline

    def epoch_end(self, trainer, pl_module, _orig=Deadline.on_train_epoch_end):
        if trainer.current_epoch == 1:
            self.at = time.time()  # no further epoch fits before the deadline: it stops this one
        _orig(self, trainer, pl_module)

    monkeypatch.setattr(Deadline, "on_train_epoch_end", epoch_end)
    stop = ("--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping", "--trainer.callbacks.monitor=val/mae",
            "--trainer.callbacks.patience=1", "--trainer.callbacks.min_delta=1000")
    exp = campaign.Experiment("test/tiny+es", "test/tiny", extra=stop, scale="cpu", family="forecasting")
    root = tmp_path / "out" / "test" / "tiny+es"
    c = campaign.Campaign(tmp_path / "out", tmp_path / "l.jsonl", "cpu", 1, time.time() + 3600, runner=in_process)
    assert c.run(exp, test_reserve=0) == "done"
    report = json.loads((root / "deadline.json").read_text())
    assert report["epochs_done"] == 2 and report["stopped_by_deadline"] is False
    (line,) = campaign.read_ledger(tmp_path / "l.jsonl")
    assert line["epochs"] == 2 and line["attempts"] == 1
    capsys.readouterr()
    # resumed anyway: the checkpoint's early stopping has ended the run, so no epoch is trained
    last = root / "checkpoints" / "last.ckpt"
    before = torch.load(last, weights_only=True)
    main(["fit", *exp.args(), f"--trainer.default_root_dir={root}", f"--ckpt_path={last}"])
    after = torch.load(last, weights_only=True)
    assert after["epoch"] == before["epoch"] == 1 and after["global_step"] == before["global_step"]
    assert "the resumed checkpoint's early stopping (val/mae) ended this run after epoch 1/2; nothing is left to " \
           "train" in capsys.readouterr().err


def test_the_stopping_rule_is_read_from_the_run_s_saved_config(tmp_path):
    """Early stopping that the config itself adds (the CPU-budget protocol's ``EarlyStopping(patience=3)``) is in the
    line as well as the plan's; the campaign's Deadline is not a stopping rule of the run."""
    import yaml

    cfg = {"seed_everything": 2024, "trainer": {"max_epochs": 10, "max_time": None, "callbacks": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "val/mae"}},
        {"class_path": "lightning.pytorch.callbacks.EarlyStopping",
         "init_args": {"monitor": "val/mae", "mode": "min", "patience": 3, "min_delta": 0.0, "verbose": False}},
        {"class_path": "hoformer.train.Deadline", "init_args": {"at": 4102444800}}]}}
    (tmp_path / "logs" / "version_0").mkdir(parents=True)
    (tmp_path / "logs" / "version_0" / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert campaign.stopping_rule(tmp_path) == {
        "max_epochs": 10, "early_stopping": {"monitor": "val/mae", "mode": "min", "patience": 3, "min_delta": 0.0}}
    cfg["trainer"]["callbacks"].append(dict(cfg["trainer"]["callbacks"][1], init_args={"monitor": "val/loss", "patience": 10}))
    cfg["trainer"]["max_time"] = "00:01:00:00"
    (tmp_path / "logs" / "version_0" / "config.yaml").write_text(yaml.safe_dump(cfg))
    rule = campaign.stopping_rule(tmp_path)
    assert rule["max_time"] == "00:01:00:00" and [e["patience"] for e in rule["early_stopping"]] == [3, 10]


def test_pack_fills_slots_in_priority_order_within_the_budget():
    exps = [campaign.Experiment(f"e{i}", "b") for i in range(5)]
    est = {"e0": (300.0, 60.0, ""), "e1": (1000.0, 100.0, ""), "e2": (100.0, 10.0, ""),
           "e3": (50.0, 500.0, ""), "e4": (float("inf"), float("inf"), "unknown")}
    slots = campaign.pack(exps, est, budget_s=600, parallel=2)
    assert [[(e.name, s) for e, s in slot] for slot in slots] == [[("e0", 300.0), ("e2", 100.0), ("e4", 200.0)],
                                                                                   [("e1", 600.0)]]
    # one slot: e1 runs until the budget ends (paused, resumed by the next call); nothing is left for the others
    (slot,) = campaign.pack(exps, est, budget_s=600, parallel=1)
    assert [(e.name, s) for e, s in slot] == [("e0", 300.0), ("e1", 300.0)]
    # e3's epoch (500 s) does not fit in what e2 leaves; e4 (never measured) takes the rest of the budget
    (slot,) = campaign.pack(exps[2:], est, budget_s=600, parallel=1)
    assert [(e.name, s) for e, s in slot] == [("e2", 100.0), ("e4", 500.0)]


def test_an_experiment_of_unknown_duration_starts_only_with_a_quarter_of_the_budget_left():
    exps = [campaign.Experiment(f"e{i}", "b") for i in range(2)]
    inf = float("inf")
    est = {"e0": (500.0, 50.0, ""), "e1": (inf, inf, "unknown")}
    (slot,) = campaign.pack(exps, est, budget_s=600, parallel=1)
    assert [e.name for e, _ in slot] == ["e0"]  # 100 s left < 600 / 4
    (slot,) = campaign.pack(exps, {**est, "e0": (400.0, 50.0, "")}, budget_s=600, parallel=1)
    assert [(e.name, s) for e, s in slot] == [("e0", 400.0), ("e1", 200.0)]
    assert not campaign.can_start(50, inf, 120) and campaign.can_start(61, inf, 120)  # at least a minute
    assert not campaign.can_start(0, 1.0, 600) and not campaign.can_start(74, 50.0, 600)
    assert campaign.can_start(76, 50.0, 600)


def test_an_epoch_time_comes_from_the_closest_measured_relative(tiny, tmp_path):
    out = tmp_path / "runs"
    exp = campaign.Experiment("test/tiny+tuned+s2026", "test/tiny", scale="cpu", family="forecasting")
    line = {**exp.describe(), "record": "run", "device": "cpu", "epochs": 4}
    assert campaign.sibling_epoch_s(exp, out, []) is None
    assert campaign.estimate_s(exp, out, [], {})[2].startswith("unknown")
    history = [{**line, "experiment": "test/other", "fit_s": 40.0},                      # same model and data
               {**line, "experiment": "test/other", "fit_s": 80.0, "device": "cuda"},     # another device kind
               {**line, "experiment": "test/tiny", "fit_s": 8.0, "model": "x"}]          # the same paper experiment
    assert campaign.sibling_epoch_s(exp, out, history[:2]) == (10.0, "test/other")
    assert campaign.sibling_epoch_s(exp, out, history[1:2]) is None
    assert campaign.sibling_epoch_s(exp, out, history[1:2], "cuda:0") == (20.0, "test/other")
    assert campaign.sibling_epoch_s(exp, out, history) == (2.0, "test/tiny")
    # a run folder of the same paper experiment that shares the override wins over the ledger's run without it
    for name, epoch_s in [("test/tiny+tuned+s2025", [3.0, 5.0]), ("test/tiny_2+tuned", [99.0])]:
        state = campaign.RunState.load(out / name)
        state.attempts.append({"epoch_s": epoch_s})
        state.save()
    assert campaign.sibling_epoch_s(exp, out, history) == (5.0, "test/tiny+tuned+s2025")
    total, epoch, src = campaign.estimate_s(exp, out, history, {})
    assert epoch == 5.0 and src == "the epochs of test/tiny+tuned+s2025" and total == 3 * 5.0 + 2.5
    # a ledger line of this machine's processor wins over a closer relative measured on another machine
    here = campaign.hardware("cpu", 1).replace("1 thread(s)", "2 thread(s)")
    other = [{**line, "experiment": "test/tiny", "fit_s": 400.0, "hardware": "Other CPU, 2 cores, 1 thread(s) per run"},
             {**line, "experiment": "test/other", "fit_s": 20.0, "hardware": here}]
    assert campaign.sibling_epoch_s(exp, tmp_path / "empty", other) == (5.0, "test/other")
    own = [{**line, "experiment": exp.name, "wall_s": 8.0, "hardware": here},
           {**line, "experiment": exp.name, "wall_s": 400.0, "hardware": "Other CPU, 2 cores, 1 thread(s) per run"}]
    assert campaign.estimate_s(exp, tmp_path / "empty", own, {})[1:] == (2.0, "ledger")


def test_plans_follow_the_priority_list(data_root, tmp_path, monkeypatch, capsys):
    paper = [e.name for e in campaign.paper_plan()]
    weather = [n for n in paper if n.startswith("hot/ltsf/weather_")]
    assert paper[:12] == weather[:12] and len(weather) >= 12
    assert paper[:3] == ["hot/ltsf/weather_96_96_hot_product", "hot/ltsf/weather_96_96_hot_sum",
                         "hot/ltsf/weather_96_96_spatial"]
    first_adrenal = next(i for i, n in enumerate(paper) if "medmnist3d" in n)
    assert all(n.startswith("hot/ltsf/etth1_") for n in paper[12:first_adrenal])
    table6 = [n for n in paper if "adrenal_hot_product_p" in n]
    assert len(table6) == 2 * 4 * 4
    cpu = campaign.cpu_plan()
    runs = [(h, v) for h in (96, 720, 192, 336) for v in ("hot_product", "spatial")]
    assert [e.name for e in cpu] == (
        [f"hot/ltsf/etth1_96_{h}_{v}+mean+es10" + ("" if s == 2024 else f"+s{s}") for s in (2025, 2026, 2024)
         for h, v in runs]
        + [f"hot/ltsf/etth1_96_{h}_{v}+es10" + ("" if s == 2024 else f"+s{s}") for s in (2024, 2025, 2026)
           for h, v in runs])
    assert all(e.patience == 10 and e.scale == "paper" and e.base == e.name.split("+")[0] for e in cpu)
    flat = "--model.model.init_args.head=flatten"
    assert [e.extra for e in cpu[::8]] == [("--seed_everything=2025",), ("--seed_everything=2026",), (),
                                           (flat,), (flat, "--seed_everything=2025"), (flat, "--seed_everything=2026")]
    # the plan the running campaigns use, unchanged
    assert [e.name for e in campaign.protocol_plan()] == [
        f"hot/ltsf_hot/weather_96_{v}+es3" + ("" if s == 2024 else f"+s{s}") for s in (2024, 2025, 2026)
        for v in ("spatial", "hot_product", "hot_sum")]
    # etth1_tuned: the tuned configs are the lead's to add; without them the plan leaves their experiments out
    monkeypatch.setattr(campaign, "ROOT", tmp_path)
    monkeypatch.setattr(campaign, "data_present", lambda e: True)  # the plan's shape, with or without ETTh1 here
    assert campaign.etth1_tuned_plan() == []
    assert "configs/hot/tuned/etth1_96_96_spatial.yaml is not in the checkout" in capsys.readouterr().out
    (tmp_path / "configs" / "hot" / "tuned").mkdir(parents=True)
    for v in ("spatial", "hot_product"):
        (tmp_path / "configs" / "hot" / "tuned" / f"etth1_96_96_{v}.yaml").write_text("{}\n")
    tuned = campaign.etth1_tuned_plan()
    assert [e.name for e in tuned] == [f"hot/ltsf/etth1_96_{h}_{v}+tuned+es10" + ("" if s == 2024 else f"+s{s}")
                                       for v in ("spatial", "hot_product") for h in (96, 720) for s in (2024, 2025, 2026)]
    assert tuned[1].extra == ("--config", "configs/hot/tuned/etth1_96_96_spatial.yaml", "--seed_everything=2025")
    assert all(e.patience == 10 and e.base == e.name.split("+")[0] for e in tuned)
    assert tuned[0].args().index("--config") < tuned[0].args().index("configs/hot/tuned/etth1_96_96_spatial.yaml")


def test_dry_run_smoke_tests_and_prints_a_plan(data_root, monkeypatch, tmp_path, capsys):
    """``--dry-run`` smoke-tests the planned runs for one short epoch on the CPU and plans with the measured step
    times (here the cheapest paper-size ETTh1 run)."""
    rc = campaign.main(["--dry-run", "--budget-min", "9", "--only", "*96_96_spatial+es10", "--parallel", "1",
                        "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "none.jsonl"), "--new-ledger"],
                       runner=in_process)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "smoke test hot/ltsf/etth1_96_96_spatial+es10: ok" in out and "steps/epoch" in out
    assert "plan: 1 experiments, 0 done, 1 pending; budget 9 min on cpu" in out
    assert "hot/ltsf/etth1_96_96_spatial+es10:" in out.split("plan:")[1]


# --------------------------------------------------------------------------------------------------- ledger
REQUIRED = {"experiment", "task", "dataset", "model", "scale", "split", "metrics", "seed", "epochs", "best_epoch",
            "stopping", "wall_s", "hardware", "torch", "commit", "command", "date"}


def test_every_ledger_line_records_its_provenance():
    rows = campaign.read_ledger()
    assert rows, "results/ledger.jsonl is empty"
    for r in rows:
        missing = REQUIRED - set(r)
        assert not missing, f"{r.get('experiment')}: missing {sorted(missing)}"
        assert r["scale"] in ("paper", "cpu", "gpu") and r["metrics"], r["experiment"]
        assert "/work/" not in r["command"] and "HOFORMER_DATA=/" not in r["command"], r["experiment"]


def test_committed_tables_are_the_ledger_s():
    """Every ``<!-- ledger:NAME -->`` block of README.md and docs/*.md is what ``python benchmarks/campaign.py
    --tables`` renders from results/ledger.jsonl."""
    blocks = [f for f in campaign.ledger.doc_files() if "<!-- ledger:" in f.read_text()]
    assert blocks, "no ledger tables in README.md or docs/"
    stale = campaign.ledger.render_tables(campaign.ledger.doc_files(), campaign.read_ledger(), write=False)
    assert not stale, f"stale tables in {[str(f.relative_to(REPO)) for f in stale]}: run " \
                      "`python benchmarks/campaign.py --tables`"


def test_losloop_plan_runs_the_cli_experiments_with_the_tables_model_names(data_root):
    plan = campaign.losloop_plan()
    assert [e.name for e in plan[:2]] == ["weaver/los_loop_cpu_weaver_t", "weaver/los_loop_cpu_weaver_nt"]
    assert len(plan) == 3 * len(campaign.paper_configs.CPU_TRAFFIC) and plan[-1].name.endswith("+s2")
    models = {e.describe()["model"] for e in plan}
    assert models == {"weaver_T", "weaver_NT", "weaver_T_sdpa", "weaver_T_cosine", "weaver_NT_sdpa",
                      "weaver_NT_cosine", "full_attention", "alternating", "hot"}
    assert all(e.task == "traffic" and campaign.data_present(e) for e in plan)


# ------------------------------------------------------------------------------------- bad input, signals
def _done_line(name: str) -> dict:
    return {"experiment": name, "task": "forecasting", "dataset": "synthetic", "model": "m", "scale": "cpu",
            "split": "test", "metrics": {"test/mse": 1.0}, "seed": 2024, "epochs": 1, "best_epoch": 0,
            "stopping": {"max_epochs": 1}, "wall_s": 1.0, "hardware": "CPU", "torch": "2", "commit": "abc",
            "date": "2026-01-01", "command": "hoformer fit", "record": "run"}


@pytest.fixture
def tiny_plan(tiny, monkeypatch, tmp_path):
    """``--plan cpu`` is the one tiny experiment; ``ledger.jsonl`` exists (empty)."""
    monkeypatch.setattr(campaign, "PLANS", {**campaign.PLANS, "cpu": lambda: [tiny]})
    (tmp_path / "ledger.jsonl").write_text("")
    return ["--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.jsonl"), "--parallel", "1",
            "--threads", "1"]


@pytest.mark.parametrize("argv, message", [
    (["--budget-min", "nan"], "--budget-min must be a finite number of minutes > 0, got nan"),
    (["--budget-min", "inf"], "--budget-min must be a finite number of minutes > 0, got inf"),
    (["--budget-min", "0"], "--budget-min must be a finite number of minutes > 0, got 0.0"),
    (["--parallel", "-1"], "--parallel must be >= 1, got -1"),
    (["--parallel", "0"], "--parallel must be >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
    (["--check"], "--check goes with --tables"),
    (["--only", "test/tinny"], "--only 'test/tinny' matches no experiment of the plan 'cpu' (1 experiments with their "
                               "data present); closest: test/tiny"),
    (["--status", "--only", "nothing*"], "--only 'nothing*' matches no experiment"),
    (["--ledger", "no/such.jsonl"], "--ledger no/such.jsonl: no such file (a mistyped ledger"),
    (["--tables", "--ledger", "no/such.jsonl"], "--ledger no/such.jsonl: no such file"),
])
def test_every_argument_is_checked(tiny_plan, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        campaign.main([*tiny_plan, *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_new_ledger_is_started_only_when_asked(tiny_plan, tmp_path, capsys):
    new = tmp_path / "new.jsonl"
    assert campaign.main([*tiny_plan, "--status", "--ledger", str(new), "--new-ledger"]) == 0
    assert "pending      test/tiny" in capsys.readouterr().out


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "ledger.jsonl:1: a ledger line must be a JSON object, got a JSON list"),
    ('{"task": "forecasting"}', "ledger.jsonl:1: the line of '?' has no field 'experiment'"),
    ("{not json", "ledger.jsonl:1: not a JSON line"),
])
def test_a_bad_ledger_line_is_an_error_naming_file_line_and_field(tiny_plan, tmp_path, capsys, line, message):
    (tmp_path / "ledger.jsonl").write_text(line + "\n")
    for extra in (["--status"], ["--tables", "--check"], []):
        assert campaign.main([*tiny_plan, *extra]) == 2
        assert message in capsys.readouterr().err


def test_tables_check_fails_on_a_missing_end_marker_naming_file_and_line(tiny_plan, tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- ledger:hot/paper_runs -->\n| old |\n")
    monkeypatch.setattr(campaign.ledger, "doc_files", lambda: [page])
    assert campaign.main([*tiny_plan, "--tables", "--check"]) == 2
    assert f"{page}:2: <!-- ledger:hot/paper_runs --> has no end marker" in capsys.readouterr().err


def test_one_campaign_per_output_folder(tiny_plan, tmp_path, capsys):
    """The folder's lock: held by a live campaign -> refused; left by a process that is gone -> taken over with a
    note; garbage, or another host's -> refused, naming the file."""
    import subprocess
    import sys

    (tmp_path / "ledger.jsonl").write_text(json.dumps(_done_line("test/tiny")) + "\n")  # nothing left to run
    lock = tmp_path / "out" / ".campaign.lock"
    with campaign.OutLock(tmp_path / "out"):
        assert campaign.main(tiny_plan) == 2
        err = capsys.readouterr().err
        assert f"is held by the campaign of pid {os.getpid()} on " in err and str(lock) in err
    assert not lock.exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "since": "2026-01-01T00:00:00+00:00"}))
    assert campaign.main(tiny_plan) == 0
    assert f"taking over the lock of pid {gone.pid} (since 2026-01-01T00:00:00+00:00), which is gone" in \
        capsys.readouterr().out
    assert not lock.exists()
    for text, message in (("garbage", "is not a campaign lock"), (json.dumps({"pid": 1, "host": "elsewhere"}),
                                                                  "on host elsewhere")):
        lock.write_text(text)
        assert campaign.main(tiny_plan) == 2
        err = capsys.readouterr().err
        assert message in err and str(lock) in err


def test_sigint_stops_the_fits_and_records_the_attempt(tiny_plan, tmp_path, capsys):
    """Ctrl-C: the running fit is asked to stop (here a runner that runs until it is), the attempt is in
    campaign.json, nothing is tested or recorded, and the campaign exits non-zero."""
    import signal
    import threading

    started = threading.Event()

    def runner(argv, log_path, threads, deadline):
        started.set()
        while not campaign.STOP.is_set():
            time.sleep(0.05)
        return -signal.SIGTERM

    threading.Thread(target=lambda: started.wait(30) and os.kill(os.getpid(), signal.SIGINT), daemon=True).start()
    assert campaign.main([*tiny_plan, "--budget-min", "5"], runner=runner) == 130
    out = capsys.readouterr().out
    assert "campaign: SIGINT: stopping the running fits" in out and "interrupted 1" in out
    (attempt,) = json.loads((tmp_path / "out" / "test" / "tiny" / "campaign.json").read_text())["attempts"]
    assert attempt["stopped_by"] == "SIGINT" and attempt["rc"] == -signal.SIGTERM
    assert (tmp_path / "ledger.jsonl").read_text() == "" and not (tmp_path / "out" / ".campaign.lock").exists()


DRIVER = """
import sys, time
sys.path.insert(0, {bench!r})
import campaign
campaign.paper_configs.experiments = lambda: {{"test/tiny": {args!r}}}
campaign.PLANS["cpu"] = lambda: [campaign.Experiment("test/tiny", "test/tiny", scale="cpu", family="forecasting")]
sys.exit(campaign.main({argv!r}))
"""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_a_real_fit_at_its_checkpoint_and_leaves_nothing_running(tmp_path):
    """SIGTERM to a campaign whose ``hoformer fit`` runs in its own process: the fit is stopped (its last complete
    epoch's checkpoint kept), the attempt recorded, the campaign exits 143 and no child outlives it."""
    import signal
    import subprocess
    import sys

    args = [*TINY, "--trainer.max_epochs=500", "--trainer.default_root_dir=unused"]
    (tmp_path / "ledger.jsonl").write_text("")
    argv = ["--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.jsonl"), "--parallel", "1",
            "--threads", "1", "--budget-min", "10"]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(bench=str(REPO / "benchmarks"), args=args, argv=argv))
    p = subprocess.Popen([sys.executable, str(driver)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = tmp_path / "out" / "test" / "tiny"
    t0 = time.time()
    while not (root / "checkpoints" / "last.ckpt").exists() and time.time() - t0 < 300 and p.poll() is None:
        time.sleep(0.5)
    kids = _children(p.pid)
    assert kids and p.poll() is None, p.stdout.read().decode()[-2000:]
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=300)[0].decode()
    assert p.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert not any(_running(k) for k in kids)
    (attempt,) = json.loads((root / "campaign.json").read_text())["attempts"]
    assert attempt["stopped_by"] == "SIGTERM" and attempt["epochs_after"] >= 1
    assert (tmp_path / "ledger.jsonl").read_text() == "" and "stopped by SIGTERM" in out
