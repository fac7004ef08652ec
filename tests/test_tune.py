"""hoformer tune: an Optuna study of a tiny forecaster on synthetic data, stored in SQLite, pruned, resumed, recorded
in the ledger and exported as a config that composes with the experiment's; its inputs checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("optuna_integration")

from hoformer.cli import main  # noqa: E402
from hoformer.tune import nested_overrides, read_space, space_distributions  # noqa: E402

EXPERIMENT = """
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 4
  limit_train_batches: 3
  limit_val_batches: 2
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: runs/tiny
model:
  class_path: hoformer.train.ForecastingTask
  init_args:
    plot_variates: 0
    model:
      class_path: hoformer.models.HOTForecaster
      init_args: {dim: 16, depth: 1, num_heads: 2, patch_size: 8}
    optim: {lr: 0.003}
data:
  class_path: hoformer.data.LTSFDataModule
  init_args: {synthetic: true, synthetic_length: 500, seq_len: 32, pred_len: 8, batch_size: 32}
"""
SPACE = """
model.init_args.optim.lr: {choices: [0.01, 0.000001]}
model.init_args.model.init_args.num_heads: {choices: [1, 2, 3, 4], divides: model.init_args.model.init_args.dim}
"""
LR, HEADS = "model.init_args.optim.lr", "model.init_args.model.init_args.num_heads"


@pytest.fixture
def study_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    (tmp_path / "space.yaml").write_text(SPACE)
    return tmp_path


def _tune(*extra):
    return main(["tune", "--config", "experiment.yaml", "--space", "space.yaml", "--study", "s", "--storage",
                 "sqlite:///runs/tune/s.db", "--ledger", "ledger.jsonl", *extra])


def test_a_study_is_stored_pruned_resumed_recorded_and_exported(study_dir, capsys):
    """Three good trials, then a learning rate that cannot learn (pruned by the median rule after its first
    epochs); a second call continues the numbering; every finished trial is one ledger line; the exported best
    config composes with the experiment's."""
    storage = "sqlite:///runs/tune/s.db"
    Path("runs/tune").mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=storage)  # the trials' values, fixed in advance
    for heads in (1, 2, 4):
        study.enqueue_trial({LR: 0.01, HEADS: heads})
    study.enqueue_trial({LR: 0.000001, HEADS: 2})
    assert _tune("--trials", "4", "--export-best", "best.yaml") == 0
    out = capsys.readouterr().out
    assert "num_heads [1, 2, 4]" in out  # 3 does not divide the width 16
    trials = optuna.load_study(study_name="s", storage=storage).trials
    states = [t.state.name for t in trials]
    assert states == ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"], states
    assert "trial 3: pruned after epoch" in out
    rows = [json.loads(line) for line in Path("ledger.jsonl").read_text().splitlines()]
    assert [r["trial"] for r in rows] == [0, 1, 2, 3] and {r["record"] for r in rows} == {"tune"}
    assert [r["state"] for r in rows] == ["complete"] * 3 + ["pruned"]
    first = rows[0]
    assert first["study"] == "s" and first["params"] == {LR: 0.01, HEADS: 1} and first["objective"] == "val/mae"
    assert first["metrics"]["val/mae"] == pytest.approx(trials[0].value)
    assert first["command"].startswith("hoformer fit --config experiment.yaml") and f"--{HEADS}=1" in first["command"]
    assert first["task"] == "forecasting" and first["dataset"] == "synthetic" and first["protocol"] == "tslib"
    assert first["stopping"]["pruner"] == "median" and first["epochs"] == 4
    # resumed: the numbering goes on (with values no trial has, so that the sampler's draw is not replaced)
    optuna.load_study(study_name="s", storage=storage).enqueue_trial({LR: 0.000001, HEADS: 4})
    assert _tune("--trials", "1") == 0
    assert [t.number for t in optuna.load_study(study_name="s", storage=storage).trials] == [0, 1, 2, 3, 4]
    assert len(Path("ledger.jsonl").read_text().splitlines()) == 5
    # the best values as a config of the same nesting as the experiment's
    from hoformer.config import resolve_config

    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    cfg = resolve_config("experiment.yaml", ["--config", "best.yaml"])
    assert cfg["model"]["init_args"]["model"]["init_args"]["num_heads"] == best.params[HEADS]
    assert cfg["model"]["init_args"]["optim"]["lr"] == best.params[LR]
    assert "trial" in Path("best.yaml").read_text().splitlines()[0]
    # the database lost (a fresh machine): rebuilt from the ledger, numbers, values, states and curves as they were
    before = optuna.load_study(study_name="s", storage=storage).trials
    rows = [json.loads(line) for line in Path("ledger.jsonl").read_text().splitlines()]
    assert all(len(r["curve"]) == r["epochs"] for r in rows)
    Path("runs/tune/s.db").unlink()
    assert _tune("--trials", "0", "--from-ledger") == 0
    assert "5 trial(s) of ledger.jsonl added" in capsys.readouterr().out
    after = optuna.load_study(study_name="s", storage=storage).trials
    assert [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in after] == \
        [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in before]
    assert _tune("--trials", "0", "--from-ledger") == 0  # a second call adds nothing
    assert "already holds" in capsys.readouterr().out
    # a trial the ledger lacks (it failed) keeps its number as a failed trial; a value outside the space is refused
    Path("runs/tune/s.db").unlink()
    Path("gap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["trial"] != 1))
    assert _tune("--trials", "0", "--from-ledger", "--ledger", "gap.jsonl") == 0
    assert [t.state.name for t in optuna.load_study(study_name="s", storage=storage).trials] == \
        [t.state.name if t.number != 1 else "FAIL" for t in before]
    Path("runs/tune/s.db").unlink()
    rows[0]["params"][HEADS] = 3
    Path("bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _tune("--trials", "0", "--from-ledger", "--ledger", "bad.jsonl") == 2
    assert "trial 0 of bad.jsonl has values" in capsys.readouterr().err


def test_a_trial_left_running_by_a_dead_process_is_failed_and_tried_again(study_dir, capsys):
    storage = "sqlite:///runs/tune/s.db"
    Path("runs/tune").mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    t = study.ask({LR: optuna.distributions.CategoricalDistribution([0.01, 0.000001]),
                   HEADS: optuna.distributions.CategoricalDistribution([1, 2, 4])})
    t.set_user_attr("pid", dead.pid)
    t.set_user_attr("host", os.uname().nodename)
    params = dict(t.params)
    assert _tune("--trials", "1") == 0
    assert "its process" in capsys.readouterr().out
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].state.name == "FAIL" and trials[1].state.name == "COMPLETE" and trials[1].params == params


def test_search_spaces_and_arguments_are_checked(study_dir, capsys):
    for text, match in (("a: [1, 2]", "expected {choices"), ("x.y: {choices: []}", "non-empty list"),
                        ("x.y: {low: 2, high: 1}", "low < high"), ("x.y: {low: 0, high: 1, log: true}", "low > 0"),
                        ("--x: {choices: [1]}", "without dashes"), ("[1, 2]", "must map"), ("a: {choices: [1]", "YAML")):
        Path("bad.yaml").write_text(text)
        with pytest.raises(ValueError, match=match):
            read_space("bad.yaml")
    assert read_space(["space.yaml"])[LR] == {"choices": [0.01, 0.000001]}
    cfg = {"model": {"init_args": {"model": {"init_args": {"dim": 12, "num_heads": 2}}, "optim": {"lr": 1.0}}}}
    d = space_distributions(read_space("space.yaml"), cfg)
    assert list(d[HEADS].choices) == [1, 2, 3, 4]  # all divide 12
    with pytest.raises(ValueError, match="not an argument of the experiment"):
        space_distributions({"model.init_args.nope": {"choices": [1]}}, cfg)
    assert nested_overrides({"a.b": 1, "a.c.d": 2}) == {"a": {"b": 1, "c": {"d": 2}}}
    for args, match in ((["--trials", "-1"], "--trials must be >= 0"), (["--timeout-min", "nan"], "finite"),
                        (["--patience", "0"], "--patience must be >= 1"), (["--config", "nope.yaml"], "no such file")):
        with pytest.raises(SystemExit):
            main(["tune", "--config", "experiment.yaml", "--space", "space.yaml", *args])
        assert match in capsys.readouterr().err
    Path("bad.yaml").write_text("model.init_args.nope: {choices: [1]}")
    assert main(["tune", "--config", "experiment.yaml", "--space", "bad.yaml", "--trials", "1"]) == 2
    assert "not an argument of the experiment" in capsys.readouterr().err


def test_a_configuration_already_finished_is_not_trained_again(study_dir, capsys):
    """A finite space's sampler can draw a finished trial's values again (TPE does once it has seen the best); that
    draw is told failed (``duplicate_of``, no ledger line) and a configuration no finished trial has is trained
    instead. When the whole space has been tried, the call stops and says so."""
    storage = "sqlite:///runs/tune/s.db"
    Path("runs/tune").mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=storage)
    for _ in range(2):
        study.enqueue_trial({LR: 0.01, HEADS: 2})
    assert _tune("--trials", "2") == 0
    assert "trial 1: the sampler drew trial 0's values again" in capsys.readouterr().out
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[1].user_attrs["duplicate_of"] == 0 and trials[2].params != trials[0].params
    rows = [json.loads(line) for line in Path("ledger.jsonl").read_text().splitlines()]
    assert [r["trial"] for r in rows] == [0, 2]
    Path("one.yaml").write_text(f"{LR}: {{choices: [0.01]}}\n{HEADS}: {{choices: [2]}}\n")
    assert main(["tune", "--config", "experiment.yaml", "--space", "one.yaml", "--study", "one", "--storage",
                 storage, "--ledger", "ledger.jsonl", "--trials", "3"]) == 0
    assert "every configuration of the space has been tried; 1 trial(s) run" in capsys.readouterr().out
