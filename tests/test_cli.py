"""The ``hoformer`` CLI: dispatch, every committed config, an end-to-end fit/test through LightningCLI, the demo."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from hoformer import cli
from hoformer.data import LTSF_DATASETS, MEDMNIST3D_INFO, NLCD_CLASSES, CDL_CLASSES
from hoformer.models import create_model, from_pretrained

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs" / "hot").rglob("*.yaml"))
MONITOR = {"ForecastingTask": ("val/mae", "min"), "ClassificationTask": ("val/auc", "max"),
           "SegmentationTask": ("val/acc", "max")}


def _import(path: str):
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def _check_init_args(class_path: str, init_args: dict, where: str):
    cls = _import(class_path)
    params = inspect.signature(cls.__init__).parameters
    unknown = set(init_args) - set(params)
    assert not unknown, f"{where}: {class_path} has no arguments {sorted(unknown)}"
    return cls


# --------------------------------------------------------------------------------------------- dispatch
def test_help_lists_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for word in ("fit", "validate", "test", "predict", "demo", "analyze", "bench"):
        assert word in out


def test_unknown_command(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_config_before_subcommand_is_an_error(tmp_path, capsys):
    """`hoformer --config run.yaml fit` would silently train LightningCLI's defaults (the root parser ignores a
    subcommand-level file): a clear error instead; root-level files (`fit: {...}`) still pass through."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("trainer:\n  max_epochs: 1\nmodel: null\n")
    for argv in (["--config", str(cfg), "fit"], [f"--config={cfg}", "test", "--ckpt_path", "best"],
                 ["-c", str(cfg)], [f"-c={cfg}", "fit"], [f"-c{cfg}", "validate"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"`--config {cfg}` comes before the subcommand" in err and "hoformer " in err and "--config" in err
    root = tmp_path / "root.yaml"
    root.write_text("fit:\n  trainer:\n    max_epochs: 1\n")
    assert cli._misplaced_config(["--config", str(root), "fit"]) is None
    assert cli._misplaced_config(["fit", "--config", str(cfg)]) is None  # the right order
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer: [unclosed\n")
    assert cli._misplaced_config(["--config", str(broken), "fit"]) is None  # LightningCLI reports a bad file
    assert cli._misplaced_config(["--config", str(tmp_path / "missing.yaml"), "fit"]) is None


def test_hooks_dispatch_and_missing_module(monkeypatch, capsys, tmp_path):
    pkg = tmp_path / "fakehook.py"
    pkg.write_text("calls = []\ndef main(argv):\n    calls.append(argv)\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.HOOKS, "bench", ("fakehook:main", "a fake benchmark"))
    assert cli.main(["bench", "--quick"]) == 3
    assert importlib.import_module("fakehook").calls == [["--quick"]]
    assert cli.main(["--help"]) == 0
    assert "  bench     a fake benchmark" in capsys.readouterr().out
    monkeypatch.setitem(cli.HOOKS, "analyze", ("hoformer.no_such_module:main", ""))
    assert cli.main(["analyze"]) == 2
    assert "not available in this installation (hoformer.no_such_module:main" in capsys.readouterr().err


def test_every_hook_resolves_to_a_command():
    for name, (path, help_) in cli.HOOKS.items():
        mod, fn = path.split(":")
        assert callable(getattr(importlib.import_module(mod), fn)), name
        assert help_, f"hoformer {name} has no help line"


def test_register_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    seen = []
    cli.register_command("hello", help="say hello")(lambda argv: seen.append(argv) or 5)
    assert cli.main(["hello", "x", "--y"]) == 5 and seen == [["x", "--y"]]  # the command's exit code
    cli.register_command("quiet")(lambda argv: None)
    assert cli.main(["quiet"]) == 0
    with pytest.raises(ValueError, match="LightningCLI"):
        cli.register_command("fit")(lambda argv: 0)


def test_console_script_installed():
    exe = shutil.which("hoformer") or str(Path(sys.executable).with_name("hoformer"))
    if not Path(exe).is_file():
        pytest.skip("the `hoformer` console script is not installed in this environment")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "demo" in r.stdout


def test_command_line_run_prints_no_lightningcli_args_warning():
    """From the command line LightningCLI parses sys.argv itself; passing it sys.argv[1:] as ``args`` too made it
    warn ("not recommended to provide both args and command line arguments") on every run."""
    cfg = REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml"
    r = subprocess.run([sys.executable, "-m", "hoformer.cli", "fit", "--config", str(cfg), "--print_config"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "kronecker_sum" in r.stdout and "args parameter is intended" not in r.stderr


# ---------------------------------------------------------------------------------------------- configs
def test_config_set_is_complete():
    names = {p.relative_to(REPO / "configs" / "hot").as_posix() for p in CONFIGS}
    for ds in ("etth1", "etth2", "ettm1", "ettm2", "weather", "electricity", "traffic", "solar"):
        for h in (96, 192, 336, 720):
            for v in ("hot_product", "hot_sum", "full", "spatial", "temporal"):
                assert f"ltsf/{ds}_96_{h}_{v}.yaml" in names
    for flag in ("organ", "nodule", "adrenal", "fracture", "vessel"):
        for v in ("hot_product", "hot_sum", "full", "cnn3d"):
            assert f"medmnist3d/{flag}_{v}.yaml" in names
    for prod in ("nlcd", "cdl"):
        for v in ("hot_product", "hot_sum"):
            assert f"ssl4eo_l/{prod}_{v}.yaml" in names


def test_configs_match_generator(tmp_path):
    spec = importlib.util.spec_from_file_location("hot_generate", REPO / "configs" / "hot" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.main(tmp_path)
    assert len(written) == len(CONFIGS)
    for p in written:
        committed = REPO / "configs" / "hot" / p.relative_to(tmp_path)
        assert committed.read_text() == p.read_text(), f"{committed} is stale: re-run configs/hot/generate.py"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_valid(path):
    cfg = yaml.safe_load(path.read_text())
    assert set(cfg) == {"seed_everything", "trainer", "model", "data"} and isinstance(cfg["seed_everything"], int)
    where = path.name
    model, data, trainer = cfg["model"], cfg["data"], cfg["trainer"]
    task_cls = _check_init_args(model["class_path"], model["init_args"], where)
    data_cls = _check_init_args(data["class_path"], data["init_args"], where)
    args = model["init_args"]
    paper = path.parent.name != "ltsf_cpu"  # ltsf_cpu/: the documented CPU-budget grid (configs/hot/generate.py)
    kw = args["model_kwargs"]
    m = create_model(args["model_name"], **kw)  # validates every model argument
    if args["model_name"] == "cnn3d_classifier":  # the CNN reference next to Table 2: CNN optimiser settings
        assert (args["lr"], args["weight_decay"]) == (1e-3, 1e-4) and paper
    else:
        assert args["lr"] == (2e-4 if paper else 1e-3) and args["weight_decay"] in (0.01, 0.1, 0.3, 0.5)  # Table 6
        assert kw["dim"] == (128 if paper else 64)
        if paper and kw["attention"] != "spatial":  # spatial = iTransformer: one token per variate (patch = seq_len)
            assert kw["patch_size"] in (2, 4)  # Table 6
        assert len(m.encoder.blocks) == (2 if task_cls.__name__ == "ForecastingTask" else 6)
    d = data["init_args"]
    if data_cls.__name__ == "LTSFDataModule":
        assert kw["seq_len"] == d["seq_len"] and kw["pred_len"] == d["pred_len"]
        assert kw["num_variates"] == LTSF_DATASETS[d["name"]].channels
    elif data_cls.__name__ == "MedMNIST3DDataModule":
        assert kw["num_classes"] == len(MEDMNIST3D_INFO[d["flag"]]["labels"]) and kw["input_size"] == d["size"]
    else:
        assert kw["num_classes"] == len({"nlcd": NLCD_CLASSES, "cdl": CDL_CLASSES}[d["product"]])
    monitor, mode = MONITOR[task_cls.__name__]
    cbs = {c["class_path"].rsplit(".", 1)[1]: c.get("init_args", {}) for c in trainer["callbacks"]}
    best, last = [c["init_args"] for c in trainer["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert last == {"dirpath": best["dirpath"], "filename": "last", "enable_version_counter": False}
    cbs["ModelCheckpoint"] = best
    # the paper trains a fixed 100 epochs and tests the best-validation checkpoint (B.4): early stopping only in
    # the CPU-budget grid
    assert ("EarlyStopping" in cbs) == (not paper)
    for name in ("ModelCheckpoint", "EarlyStopping")[: 1 if paper else 2]:
        assert cbs[name]["monitor"] == monitor and cbs[name]["mode"] == mode
    assert "ExportPretrained" in cbs and "SavePredictions" in cbs
    for c in trainer["callbacks"] + trainer["logger"] + trainer["plugins"]:
        _check_init_args(c["class_path"], c.get("init_args", {}), where)
    assert trainer["max_epochs"] == (100 if paper else 10) and data["init_args"]["batch_size"] == 32


@pytest.mark.parametrize("rel", ["ltsf/etth1_96_96_hot_product.yaml", "medmnist3d/adrenal_hot_sum.yaml",
                                 "ssl4eo_l/nlcd_hot_product.yaml"])
def test_print_config_through_lightningcli(rel, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", "--config", str(REPO / "configs" / "hot" / rel), "--print_config"])
    assert e.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["model_kwargs"] == yaml.safe_load(
        (REPO / "configs" / "hot" / rel).read_text())["model"]["init_args"]["model_kwargs"]
    assert printed["seed_everything"] == 2024


# -------------------------------------------------------------------------------------------- end to end
def test_fit_then_test_through_cli(tmp_path, monkeypatch):
    """`hoformer fit` + `hoformer test --ckpt_path best` with a paper config and command-line overrides."""
    monkeypatch.chdir(tmp_path)  # the config's runs/... paths are relative
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    over = ["--data.init_args.synthetic=true", "--data.init_args.synthetic_length=1200",
            "--data.init_args.num_workers=0", "--data.init_args.eval_batch_size=256",
            '--model.init_args.model_kwargs={"seq_len": 96, "pred_len": 96, "num_variates": 7, '
            '"attention": "kronecker_sum", "dim": 16, "depth": 1, "num_heads": 2, "patch_size": 8}',
            "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false"]
    assert cli.main(["fit", "--config", cfg, *over]) == 0
    run = tmp_path / "runs" / "hot" / "ltsf" / "etth1_96_96_hot_sum"
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    assert best and (run / "checkpoints" / "last.ckpt").is_file()
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (0, 2)  # --trainer.max_epochs / limit_train_batches applied
    # a newer best-*.ckpt of another run in the same directory: `--ckpt_path best` takes the one last.ckpt records
    stale = run / "checkpoints" / "best-epoch=99.ckpt"
    stale.write_bytes(b"not a checkpoint")
    model = from_pretrained(next(run.glob("logs/version_*/pretrained")))
    assert model.config["kwargs"]["attention"] == "kronecker_sum" and model.config["kwargs"]["dim"] == 16
    assert (next(run.glob("logs/version_*")) / "config.yaml").is_file()  # LightningCLI saved the resolved config
    assert cli.main(["test", "--config", cfg, *over, "--ckpt_path", "best"]) == 0
    assert list(run.glob("logs/version_*/forecast.png"))
    metrics = "".join(p.read_text() for p in run.glob("logs/version_*/metrics.csv"))
    assert "test/mse" in metrics and "val/mae" in metrics
    assert cli.main(["predict", "--config", cfg, *over, "--ckpt_path", "best"]) == 0
    (pred,) = run.glob("logs/version_*/predictions.pt")
    n_test = (int(0.2 * 1200) + 96) - 96 - 96 + 1  # 20 % test rows + lookback, minus the window span
    assert torch.load(pred, weights_only=True).shape == (n_test, 96, 7)  # every test window predicted


def test_cli_writes_checkpoints_atomically_without_a_config_plugin(tmp_path):
    """The committed configs name AtomicCheckpointIO; a command line (or YAML) without it gets it from the CLI,
    and another plugin of the user's does not remove it."""
    from lightning.pytorch.plugins import MixedPrecision

    from hoformer.train.tasks import AtomicCheckpointIO

    args = ["--model=hoformer.train.ForecastingTask", "--model.model_name=hot_forecaster",
            '--model.model_kwargs={"seq_len": 32, "pred_len": 8, "num_variates": 7, "dim": 16, "num_heads": 2, '
            '"depth": 1, "patch_size": 8}', "--data=hoformer.data.LTSFDataModule", "--data.synthetic=true",
            "--data.seq_len=32", "--data.pred_len=8", "--trainer.logger=false", "--trainer.accelerator=cpu",
            f"--trainer.default_root_dir={tmp_path}"]
    for extra in ([], ["--trainer.plugins=lightning.pytorch.plugins.MixedPrecision",
                       "--trainer.plugins.precision=bf16-mixed", "--trainer.plugins.device=cpu"]):
        trainer = cli.HoformerCLI(args=args + extra, run=False).trainer
        assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO), extra
        if extra:
            assert isinstance(trainer.strategy.precision_plugin, MixedPrecision)


def test_recorded_best_falls_back_when_last_ckpt_is_missing_or_stale(tmp_path):
    assert cli._recorded_best(tmp_path / "last.ckpt", "ModelCheckpoint{}") is None
    torch.save({"callbacks": {"K": {"best_model_path": str(tmp_path / "gone.ckpt")}}}, tmp_path / "last.ckpt")
    assert cli._recorded_best(tmp_path / "last.ckpt", "K") is None  # the recorded file was deleted: fall back
    (tmp_path / "b.ckpt").write_bytes(b"x")
    torch.save({"callbacks": {"K": {"best_model_path": str(tmp_path / "b.ckpt")}}}, tmp_path / "last.ckpt")
    assert cli._recorded_best(tmp_path / "last.ckpt", "K") == str(tmp_path / "b.ckpt")
    assert cli._recorded_best(tmp_path / "last.ckpt", "other") is None


def test_test_best_without_checkpoint_is_clear(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    with pytest.raises(FileNotFoundError, match="best"):
        cli.main(["test", "--config", cfg, "--data.init_args.synthetic=true", "--ckpt_path", "best"])
    # a config whose only ModelCheckpoint monitors nothing (CPU-budget HOBA: last epoch) has no "best" at all
    with pytest.raises(ValueError, match="monitors no metric.*last.ckpt"):
        cli.main(["test", "--config", str(REPO / "configs" / "hoba" / "cpu_trec_hoba.yaml"), "--ckpt_path", "best"])


def test_demo_synthetic(tmp_path, capsys):
    assert cli.main(["demo", "--dataset", "synthetic", "--max-epochs", "1", "--limit-train-batches", "2",
                     "--output", str(tmp_path / "demo"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "test/mse" in out and "synthetic" in out
    paths = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].split()[0] for line in out.splitlines()
             if line.startswith(("checkpoint:", "save_pretrained:", "forecast plot:"))}
    assert Path(paths["checkpoint"]).is_file() and Path(paths["forecast plot"]).is_file()
    assert from_pretrained(paths["save_pretrained"]).config["name"] == "hot_forecaster"


def test_demo_finds_real_data(data_root, monkeypatch):
    if not (data_root / "ltsf" / "ETT-small" / "ETTh1.csv").is_file():
        pytest.skip("ETTh1 not in the shared data")
    monkeypatch.setenv("HOFORMER_DATA", str(data_root))
    assert cli._demo_data_root() == data_root


def test_demo_dataset_choice(tmp_path, monkeypatch, capsys):
    """``--dataset auto`` trains on ETTh1 when $HOFORMER_DATA holds it, else on the synthetic set; a named dataset
    without a data root is a clear error."""
    import hoformer.data

    seen = []

    class Stop(Exception):
        pass

    def fake_dm(**kw):
        seen.append(kw)
        raise Stop

    monkeypatch.setattr(hoformer.data, "LTSFDataModule", fake_dm)
    monkeypatch.setattr(hoformer.data._utils, "download_url", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    (tmp_path / "d" / "ltsf" / "ETT-small").mkdir(parents=True)
    (tmp_path / "d" / "ltsf" / "ETT-small" / "ETTh1.csv").write_text("date,OT\n")
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "d"))
    out = ["--output", str(tmp_path / "demo"), "--threads", "1"]
    with pytest.raises(Stop):
        cli.main(["demo", *out])
    assert (seen[-1]["name"], seen[-1]["root"], seen[-1]["synthetic"]) == ("ETTh1", str(tmp_path / "d" / "ltsf"),
                                                                            False)
    # a named dataset must be in $HOFORMER_DATA itself: no silent fallback to ../shared/data (it used to check for
    # ETTh1 whatever --dataset said, then train on another folder's weather.csv)
    assert cli.main(["demo", "--dataset", "weather", *out]) == 2
    assert f"dataset 'weather' not found under {tmp_path / 'd'}/ltsf" in capsys.readouterr().err
    (tmp_path / "d" / "ltsf" / "weather").mkdir()
    (tmp_path / "d" / "ltsf" / "weather" / "weather.csv").write_text("date,OT\n")
    with pytest.raises(Stop):
        cli.main(["demo", "--dataset", "weather", *out])
    assert (seen[-1]["name"], seen[-1]["root"], seen[-1]["synthetic"]) == ("weather", str(tmp_path / "d" / "ltsf"),
                                                                           False)
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "a" / "b" / "c" / "cli.py"))  # no repo-relative data
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Stop):
        cli.main(["demo", *out])
    assert (seen[-1]["name"], seen[-1]["root"], seen[-1]["synthetic"]) == ("synthetic", None, True)
    assert cli.main(["demo", "--dataset", "ETTh1", *out]) == 2
    assert "set HOFORMER_DATA" in capsys.readouterr().err


def test_ckpt_path_best_falls_back_to_the_newest_best_checkpoint(tmp_path):
    """Without a readable ``last.ckpt``, ``--ckpt_path best`` resolves to the *newest* ``best-*.ckpt``."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hoformer import cli

    paths = [tmp_path / f"best-epoch={e:03d}.ckpt" for e in (5, 1, 3)]
    for k, p in enumerate(paths):
        p.write_bytes(b"x")
        os.utime(p, (1_000_000 + k, 1_000_000 + k))  # written in this order: epoch 3 is the newest
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val/mae")
    ns = SimpleNamespace(subcommand="test", config_init={"test": {"ckpt_path": "best"}},
                         trainer=SimpleNamespace(checkpoint_callback=cb))
    cli._lightning_cli()._resolve_best(ns)
    assert ns.config_init["test"]["ckpt_path"] == str(paths[-1])
