"""The paper-scale campaign (``benchmarks/campaign.py``): exact resumes across deadlines, the ledger line of a finished
run, planning and packing, the dry run, and the documentation tables generated from ``results/ledger.jsonl``."""
from __future__ import annotations

import json
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
    assert line["record"] == "campaign"
    for key in ("experiment", "dataset", "model", "best_epoch", "wall_s", "hardware", "torch", "commit", "command"):
        assert line[key] not in (None, ""), key
    assert line["command"].startswith("hoformer fit --config ") and "runs/campaign/test/tiny" in line["command"]


def test_early_stopping_is_in_the_command_and_the_ledger(tiny, tmp_path):
    exp = campaign.Experiment("test/tiny+es", "test/tiny", scale="cpu", patience=1, family="forecasting")
    assert exp.args()[-4:] == ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
                               "--trainer.callbacks.monitor=val/mae", "--trainer.callbacks.patience=1",
                               "--trainer.callbacks.mode=min"]
    c = campaign.Campaign(tmp_path / "out", tmp_path / "l.jsonl", "cpu", 1, time.time() + 3600, runner=in_process)
    assert c.run(exp, test_reserve=0) == "done"
    (line,) = campaign.read_ledger(tmp_path / "l.jsonl")
    assert line["stopping"]["early_stopping"] == {"monitor": "val/mae", "mode": "min", "patience": 1}
    assert 1 <= line["epochs"] <= 3 and line["best_epoch"] < line["epochs"]


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


def test_plans_follow_the_priority_list(data_root):
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
    assert [e.name for e in cpu] == [f"hot/ltsf/etth1_96_{h}_{v}+es10" for h in (96, 720, 192, 336)
                                     for v in ("hot_product", "spatial")]
    assert all(e.patience == 10 and e.scale == "paper" for e in cpu)


def test_dry_run_smoke_tests_and_prints_a_plan(data_root, monkeypatch, tmp_path, capsys):
    """``--dry-run`` smoke-tests the planned runs for one short epoch on the CPU and plans with the measured step
    times (here the cheapest paper-size ETTh1 run)."""
    monkeypatch.setattr(campaign, "run_cli", in_process)
    monkeypatch.setattr(campaign.smoke_test, "__defaults__", (in_process,))
    rc = campaign.main(["--dry-run", "--budget-min", "9", "--only", "*96_96_spatial*", "--parallel", "1",
                        "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "none.jsonl")])
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


def test_a_changed_ledger_makes_the_tables_stale(tmp_path):
    rows = campaign.read_ledger()
    doc = tmp_path / "page.md"
    doc.write_text("text\n<!-- ledger:hot/paper_runs -->\nold\n<!-- /ledger -->\nmore\n")
    assert campaign.ledger.render_tables([doc], rows, write=True) == [doc]
    assert campaign.ledger.render_tables([doc], rows, write=False) == []
    assert doc.read_text().startswith("text\n<!-- ledger:hot/paper_runs -->\n| experiment |")
    changed = [dict(rows[0], metrics={k: v + 1 for k, v in rows[0]["metrics"].items()})] + rows[1:]
    assert campaign.ledger.render_tables([doc], changed, write=False) == [doc]
    doc.write_text("<!-- ledger:no/such -->\n<!-- /ledger -->\n")
    with pytest.raises(KeyError, match="unknown ledger table 'no/such'"):
        campaign.ledger.render_tables([doc], rows, write=False)
