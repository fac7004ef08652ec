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
from hoformer.config import _bases, expand_configs, resolve_config
from hoformer.lightning_cli import _recorded_best
from hoformer.data import LTSF_DATASETS, MEDMNIST3D_INFO, NLCD_CLASSES, CDL_CLASSES
from hoformer.models import create_model, from_pretrained

REPO = Path(__file__).resolve().parents[1]


def _import_file(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_command_line_run_prints_no_lightningcli_args_warning(monkeypatch, capsys):
    """From the command line (``main()`` without arguments: the console script) LightningCLI parses sys.argv itself;
    passing it sys.argv[1:] as ``args`` too made it warn ("not recommended to provide both args and command line
    arguments") on every run."""
    import warnings

    cfg = REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml"
    monkeypatch.setattr(sys, "argv", ["hoformer", "fit", "--config", str(cfg), "--print_config"])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as e:
        warnings.simplefilter("always")
        cli.main()
    assert e.value.code in (0, None)
    out = capsys.readouterr()
    said = out.err + "".join(str(w.message) for w in caught)
    assert "kronecker_sum" in out.out and "args parameter is intended" not in said and "both args" not in said


# ---------------------------------------------------------------------------------------------- configs
#: the run configs (experiments and the bases they extend); not the search spaces of `hoformer tune` (configs/tune/)
#: nor the tuned overrides that compose with an experiment (configs/hot/tuned/, `--config EXP --config TUNED`)
OVERLAYS = ("configs/tune/", "configs/hot/tuned/")
CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml")
                 if not p.relative_to(REPO).as_posix().startswith(OVERLAYS))
EXPERIMENTS = _import_file(REPO / "benchmarks" / "paper_configs.py").experiments()
#: experiment files that extend a protocol file: what differs from it, nothing else
SMALL = 40


def _printed(args, capsys) -> dict:
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", *args, "--print_config"])
    assert e.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_overlays_compose_with_the_experiment_they_name():
    """A tuned override file (configs/hot/tuned/) extends nothing and only sets keys of the experiment it names in
    its header; a search space's keys (configs/tune/) are keys of the paper config's resolution."""
    from hoformer.config import resolve_config
    from hoformer.tune import read_space

    cfg = resolve_config(REPO / "configs/hot/ltsf/etth1_96_96_hot_product.yaml")
    for path in sorted((REPO / "configs/tune").glob("*.yaml")):
        for key in read_space(path):
            node = cfg
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{path.name}: {key}"
                node = node[part]
    for path in sorted((REPO / "configs/hot/tuned").glob("*.yaml")):
        text = path.read_text()
        assert "# extends:" not in text and "hoformer fit --config" in text, path
        exp = text.split("hoformer fit --config ", 1)[1].split()[0]
        resolve_config(REPO / exp, ["--config", str(path)])  # composes (a key the experiment lacks is an error)


def test_configs_compose_from_a_shared_trainer():
    """Every config extends (directly or through a protocol file) configs/trainer.yaml; experiment files are small;
    no output path appears in a config except the one ``trainer.default_root_dir``."""
    assert len(CONFIGS) <= 40 and sum(len(p.read_text().splitlines()) for p in CONFIGS) <= 1200
    for path in CONFIGS:
        chain = _bases(path)
        assert chain[-1] == str(path) and (path.name == "trainer.yaml" or chain[0].endswith("configs/trainer.yaml"))
        text = path.read_text()
        assert text.count("runs/") <= 1 + text.count("teacher_run:"), path  # a student's teacher is the other path
        is_protocol = any(_bases(other)[-2:-1] == [str(path)] for other in CONFIGS if other != path)
        if not is_protocol and path.name != "trainer.yaml":
            assert len(text.splitlines()) <= SMALL, f"{path}: an experiment file holds only what differs"


def test_paper_experiments_are_all_expressible():
    """benchmarks/paper_configs.py expresses every paper experiment (350 grid entries, and the 45 of the HOT
    authors' protocol: one model per dataset and attention, and the CPU-budget volume model) as a composed config
    plus overrides."""
    names = set(EXPERIMENTS)
    assert len(names) == 350 + 45 + 1 and "hot/medmnist3d_cpu/adrenal_hot_product" in names
    for ds in ("etth1", "etth2", "ettm1", "ettm2", "weather", "electricity", "traffic", "solar"):
        for v in ("hot_product", "hot_sum", "full", "spatial", "temporal"):
            assert f"hot/ltsf_hot/{ds}_96_{v}" in names
            for h in (96, 192, 336, 720):
                assert f"hot/ltsf/{ds}_96_{h}_{v}" in names
    for flag in ("organ", "nodule", "adrenal", "fracture", "vessel", "synapse"):
        for v in ("hot_product", "hot_sum", "full", "cnn3d"):
            assert f"hot/medmnist3d/{flag}_{v}" in names
    for prod in ("nlcd", "cdl"):
        for v in ("hot_product", "hot_sum"):
            assert f"hot/ssl4eo_l/{prod}_{v}" in names
    for ds in ("metr_la", "pems_bay", "los_loop"):
        assert {f"weaver/{ds}_t", f"weaver/{ds}_nt"} <= names
    assert {"hoba/sst2_teacher", "hoba/sst2_hoba_3l_b16", "hoba/imdb_full2d_6l", "hoba/cpu_trec_triplet_full"} <= names
    for name, args in EXPERIMENTS.items():
        assert args[-1] == f"--trainer.default_root_dir=runs/{name}" and (REPO / args[1]).is_file(), name


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "trainer.yaml"],
                         ids=lambda p: p.relative_to(REPO / "configs").as_posix())
def test_config_parses_with_the_protocol(path, capsys):
    """Each committed config parses through LightningCLI (its bases first); the HOT paper protocol (appendix B.4 /
    Table 6) where it applies."""
    cfg = _printed(["--config", str(path)], capsys)
    task, model = cfg["model"]["class_path"], cfg["model"]["init_args"]["model"]
    optim = cfg["model"]["init_args"]["optim"]
    assert cfg["trainer"]["default_root_dir"].startswith("runs/")
    assert any(c["class_path"].endswith("ExportPretrained") for c in cfg["trainer"]["callbacks"])
    if "/hot/" in path.as_posix() and not path.stem.endswith("cnn3d"):
        paper, authors = "ltsf_cpu" not in path.as_posix() and not path.stem.endswith("_cpu"), path.stem == "ltsf_hot"
        assert optim["lr"] == (2e-4 if paper and not authors else 1e-3) and optim["weight_decay"] == 0.1
        assert model["init_args"]["dim"] == (128 if paper else 64)
        volumes_cpu = task.endswith("ClassificationTask") and not paper  # 2 blocks, 30 epochs, a 10 % warm-up
        assert model["init_args"]["depth"] == (2 if task.endswith("ForecastingTask") or volumes_cpu else 6)
        assert cfg["trainer"]["max_epochs"] == (100 if paper else 30 if volumes_cpu else 10)
        if volumes_cpu:
            assert optim["warmup_ratio"] == 0.1 and cfg["data"]["init_args"]["flip_augment"] is True
        assert cfg["data"]["init_args"]["batch_size"] == (128 if authors else 32)
        if "head" in model["init_args"] and path.stem != "etth1_96_720_official":  # the paper's head on the paper's
            # model, the flattened one at a CPU budget (the reference preset: the reference's mean head)
            assert model["init_args"]["head"] == ("mean" if paper else "flatten")
        if task.endswith("ForecastingTask"):
            assert cfg["model"]["init_args"]["protocol"] == ("hot" if authors else "tslib")
        if authors:  # the HOT authors' code: one 720-step model, clipping 1.0
            assert cfg["data"]["init_args"]["pred_len"] == 720 and cfg["trainer"]["gradient_clip_val"] == 1.0
    if path.stem.endswith("cnn3d"):  # the CNN reference next to Table 2: CNN optimiser settings
        assert (optim["lr"], optim["weight_decay"]) == (1e-3, 1e-4)
        assert model["class_path"] == "hoformer.models.CNN3DClassifier" and "attention" not in model["init_args"]


@pytest.mark.parametrize("name", ["hot/ltsf/traffic_96_720_spatial", "hot/ltsf_cpu/weather_96_336_full",
                                  "hot/medmnist3d/organ_cnn3d", "hot/ssl4eo_l/cdl_hot_sum", "weaver/pems_bay_nt",
                                  "weaver/ablation_pems_bay_dict_m8_k4", "weaver/los_loop_cpu_alternating",
                                  "hoba/ag_news_teacher", "hoba/imdb_block2d_nocb_6l", "hoba/cpu_sst2_full2d"])
def test_paper_experiments_parse(name, capsys):
    """The grid's overrides reach their arguments (a sample over every protocol file and kind of override)."""
    cfg = _printed(EXPERIMENTS[name], capsys)
    assert cfg["trainer"]["default_root_dir"] == f"runs/{name}"
    model = cfg["model"]["init_args"]["model"]["init_args"]
    if name == "hot/ltsf/traffic_96_720_spatial":
        assert cfg["data"]["init_args"]["pred_len"] == 720 and model["attention"] == "spatial"
        assert model["patch_size"] == 96
    if name == "weaver/pems_bay_nt":
        assert model["use_time"] is False and cfg["model"]["init_args"]["use_time"] is False
    if name == "weaver/los_loop_cpu_alternating":
        assert cfg["model"]["init_args"]["model"]["class_path"] == "hoformer.models.TrafficTransformer"
        assert model["layout"] == "alternating" and model["dim"] == 32
    if name == "hoba/imdb_block2d_nocb_6l":  # max_len: the data's, linked into the model (test_text_max_len_...)
        assert (model["depth"], model["attention"], model["cross_block"], "max_len" in model) == (6, "block2d", False,
                                                                                                  False)
        assert cfg["data"]["init_args"]["max_len"] == 512


def test_fit_help_shows_typed_model_arguments_under_names_that_work(capsys):
    """The model is a typed argument of the task: its class's help lists every argument with type and default, each
    under the option name that sets it (`--model.model.dim`, not `--model.dim`)."""
    import re

    with pytest.raises(SystemExit):
        cli.main(["fit", "--model.model.help", "hoformer.models.HOTForecaster"])
    out = capsys.readouterr().out
    assert "--model.model.attention" in out and "type: Literal['kronecker_product'" in out
    assert "--model.model.dim DIM" in out and "(type: int, default: 128)" in out
    assert not re.search(r"--model\.(?!model\.)\w", out), "an option printed without its `model.model.` path"
    printed = sorted(set(re.findall(r"--model\.model\.(\w+) \{true,false\}", out)))
    assert len(printed) >= 5
    cfg = resolve_config(REPO / "configs/hot/ltsf/etth1_96_96_hot_product.yaml",
                             [f"--model.model.{k}=true" for k in printed] + ["--model.model.dim=32"])
    model = cfg["model"]["init_args"]["model"]["init_args"]
    assert model["dim"] == 32 and all(model[k] is True for k in printed)


def test_help_and_errors_say_what_to_do(capsys):
    cfg = str(REPO / "configs/hot/ltsf/etth1_96_96_hot_product.yaml")
    with pytest.raises(SystemExit):  # the help of a model asked of the task's argument
        cli.main(["fit", "--config", cfg, "--model.help", "hoformer.models.HOTForecaster"])
    assert "--model.model.help hoformer.models.HOTForecaster" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a wrong type: the error line first and last, the usage between
        cli.main(["fit", "--config", cfg, "--trainer.max_epochs=abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: ") and "trainer.max_epochs" in err[0] and "usage:" in "\n".join(err)
    assert "Given value: abc" in err[-1] and sum(line.startswith("error: ") for line in err) == 2


@pytest.mark.parametrize("config,model,first", [
    ("hot/ltsf/etth1_96_96_hot_product.yaml", "HOTForecaster", "seq_len, pred_len, num_variates, attention, head"),
    ("hot/medmnist3d/adrenal_hot_sum.yaml", "HOTVolumeClassifier", "in_channels, input_size, num_classes, depth, pos_embed"),
    ("weaver/los_loop_cpu.yaml", "Weaver", "num_nodes, window, horizon, in_channels, out_channels, dim"),
    ("hoba/cpu_trec_hoba.yaml", "HOBAClassifier", "vocab_size, num_classes, max_len, dim"),
], ids=["hot-ltsf", "hot-medmnist3d", "weaver", "hoba"])
def test_misspelled_model_argument_fails_at_parse_time_naming_the_valid_ones(config, model, first, capsys):
    cfg = str(REPO / "configs" / config)
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", *expand_configs(["--config", cfg]), "--model.model.init_args.dimm=3"])
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    assert f"hoformer.models.{model} has no argument 'dimm': did you mean 'dim'?" in err
    assert f"its arguments are {first}" in err


def test_one_data_override_switches_to_another_csv(tmp_path, monkeypatch, capsys):
    """A config pointed at another CSV with another number of columns by one ``--data`` override: the model's
    variates (and lookback / horizon) and the plot labels (column names) come from the datamodule, the run trains and
    tests."""
    from hoformer.data import write_synthetic_ltsf_csv

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path))
    (tmp_path / "ltsf").mkdir()
    csv = write_synthetic_ltsf_csv(tmp_path / "ltsf" / "mine.csv", "electricity", 1500, num_variates=5)
    cfg = str(REPO / "configs" / "hot" / "ltsf_cpu" / "etth1_96_96_hot_product.yaml")
    quick = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
             "--trainer.limit_test_batches=1", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}/r"]
    obj = cli.HoformerCLI(args=[*expand_configs(["--config", cfg]), f"--data.name={csv}", *quick], run=False)
    assert obj.model.model.config["kwargs"]["num_variates"] == 5 == obj.datamodule.num_variates
    import pandas as pd

    columns = [c for c in pd.read_csv(csv, nrows=0).columns if c != "date"]  # the forecast plots' panel labels
    assert obj.model.hparams.variate_names == columns == obj.datamodule.variate_names and len(columns) == 5
    assert cli.main(["fit", *expand_configs(["--config", cfg]), f"--data.name={csv}", *quick]) == 0
    assert (tmp_path / "r" / "checkpoints" / "last.ckpt").is_file()
    assert cli.main(["test", "--config", cfg, f"--data.name={csv}", *quick, "--ckpt_path", "best"]) == 0


def test_text_max_len_vocab_and_pad_come_from_the_datamodule(tmp_path, capsys):
    """The HOBA model's position table (``max_len``), vocabulary size and pad id are linked from the text datamodule:
    one ``--data.init_args.max_len`` override sets the model's too, and giving the model's at the command line fails
    before anything is built (the data's value would silently replace it)."""
    (tmp_path / "trec").mkdir()
    lines = [f"{c}:x question {i} about things ?" for i, c in enumerate(["HUM", "LOC", "NUM", "DESC", "ENTY", "ABBR"] * 5)]
    (tmp_path / "trec" / "train_5500.label").write_text("\n".join(lines))
    (tmp_path / "trec" / "TREC_10.label").write_text("NUM:date When ?\nHUM:ind Who ?\n")
    cfg = str(REPO / "configs" / "hoba" / "cpu_trec_teacher.yaml")
    data = [f"--data.init_args.root={tmp_path}", "--data.init_args.verify=false", "--data.init_args.vocab_size=120",
            f"--trainer.default_root_dir={tmp_path}/r"]
    for max_len in (64, 40):
        obj = cli.HoformerCLI(args=[*expand_configs(["--config", cfg]), *data, f"--data.init_args.max_len={max_len}"],
                              run=False)
        kw = obj.model.model.config["kwargs"]
        assert kw["max_len"] == obj.datamodule.max_len == max_len
        assert (kw["vocab_size"], kw["pad_id"], kw["num_classes"]) == (120, obj.datamodule.tokenizer.pad_id, 6)
    with pytest.raises(SystemExit) as e:
        cli.main(["fit", *expand_configs(["--config", cfg]), *data, "--model.model.init_args.max_len=128"])
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "max_len=128 (the datamodule's `max_len`) is determined by the data" in err


def test_test_command_loads_a_checkpoint_of_the_earlier_layout(tmp_path, monkeypatch):
    """``hoformer test --ckpt_path`` with a checkpoint whose task recorded ``model_name`` / ``model_kwargs`` (the layout
    of tasks configured by registry name): the weights it holds are the ones tested."""
    monkeypatch.chdir(tmp_path)
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    over = ["--data.init_args.synthetic=true", "--data.init_args.synthetic_length=1200", "--data.num_workers=0",
            "--model.model.init_args.dim=16", "--model.model.init_args.depth=1", "--model.model.init_args.num_heads=2",
            "--model.model.init_args.patch_size=8", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
            "--trainer.limit_test_batches=1", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}/r"]
    assert cli.main(["fit", "--config", cfg, *over]) == 0
    ckpt = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", weights_only=True)
    hp = ckpt["hyper_parameters"]
    spec = hp.pop("model_config")
    optim = hp.pop("optim")
    ckpt["hyper_parameters"] = {"model_name": spec["name"], "model_kwargs": spec["kwargs"], **hp,
                                **{k: optim[k] for k in ("lr", "weight_decay", "betas", "warmup_steps")}}
    ckpt["state_dict"] = {k: 2 * v if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "old.ckpt")
    obj = cli.HoformerCLI(args=[*expand_configs(["--config", cfg]), *over], run=False)
    obj.trainer.test(obj.model, obj.datamodule, ckpt_path=str(tmp_path / "old.ckpt"), verbose=False)
    for k, v in obj.model.state_dict().items():
        if k.startswith("model."):
            assert torch.equal(v, ckpt["state_dict"][k]), k
    assert cli.main(["test", "--config", cfg, *over, "--ckpt_path", str(tmp_path / "old.ckpt")]) == 0


# -------------------------------------------------------------------------------------------- end to end
def test_fit_then_test_through_cli(tmp_path, monkeypatch):
    """`hoformer fit` + `hoformer test --ckpt_path best` with a paper config and command-line overrides."""
    monkeypatch.chdir(tmp_path)  # the config's runs/... paths are relative
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    over = ["--data.init_args.synthetic=true", "--data.init_args.synthetic_length=1200",
            "--data.init_args.num_workers=0", "--data.init_args.eval_batch_size=256",
            "--model.model.init_args.dim=16", "--model.model.init_args.depth=1",
            "--model.model.init_args.num_heads=2", "--model.model.init_args.patch_size=8",
            "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false"]
    assert cli.main(["fit", "--config", cfg, *over]) == 0
    run = tmp_path / "runs" / "hot" / "ltsf" / "etth1_96_96_hot_sum"
    from hoformer.train.guards import RunFolderError

    with pytest.raises(RunFolderError, match="holds a finished run.*--overwrite true"):  # a second fit into the folder
        cli.main(["fit", "--config", cfg, *over])
    assert not (run / ".hoformer.lock").exists()  # released after the fit, and after the refusal
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))
    assert best and (run / "checkpoints" / "last.ckpt").is_file()
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (0, 2)  # --trainer.max_epochs / limit_train_batches applied
    # a newer best-*.ckpt of another run in the same directory: `--ckpt_path best` takes the one last.ckpt records
    stale = run / "checkpoints" / "best-epoch=99.ckpt"
    stale.write_bytes(b"not a checkpoint")
    model = from_pretrained(run / "pretrained")
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
    # `hoformer forecast --config` reads the config as `fit` does (its `# extends:` bases included)
    out = tmp_path / "forecast.csv"
    assert cli.main(["forecast", "--config", cfg, "--checkpoint", str(best[-1]), "--output", str(out), "--data-args",
                     '{"synthetic": true, "synthetic_length": 1200}']) == 0
    assert len(out.read_text().splitlines()) == 96 + 1


def test_cli_writes_checkpoints_atomically_without_a_config_plugin(tmp_path):
    """The committed configs name AtomicCheckpointIO; a command line (or YAML) without it gets it from the CLI,
    and another plugin of the user's does not remove it."""
    from lightning.pytorch.plugins import MixedPrecision

    from hoformer.train.tasks import AtomicCheckpointIO

    args = ["--model=hoformer.train.ForecastingTask", "--model.model=hoformer.models.HOTForecaster",
            "--model.model.dim=16", "--model.model.num_heads=2", "--model.model.depth=1", "--model.model.patch_size=8",
            "--data=hoformer.data.LTSFDataModule", "--data.synthetic=true",
            "--data.seq_len=32", "--data.pred_len=8", "--trainer.logger=false", "--trainer.accelerator=cpu",
            f"--trainer.default_root_dir={tmp_path}"]
    for extra in ([], ["--trainer.plugins=lightning.pytorch.plugins.MixedPrecision",
                       "--trainer.plugins.precision=bf16-mixed", "--trainer.plugins.device=cpu"]):
        trainer = cli.HoformerCLI(args=args + extra, run=False).trainer
        assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO), extra
        if extra:
            assert isinstance(trainer.strategy.precision_plugin, MixedPrecision)


def test_recorded_best_falls_back_when_last_ckpt_is_missing_or_stale(tmp_path):
    assert _recorded_best(tmp_path / "last.ckpt", "ModelCheckpoint{}") is None
    torch.save({"callbacks": {"K": {"best_model_path": str(tmp_path / "gone.ckpt")}}}, tmp_path / "last.ckpt")
    assert _recorded_best(tmp_path / "last.ckpt", "K") is None  # the recorded file was deleted: fall back
    (tmp_path / "b.ckpt").write_bytes(b"x")
    torch.save({"callbacks": {"K": {"best_model_path": str(tmp_path / "b.ckpt")}}}, tmp_path / "last.ckpt")
    assert _recorded_best(tmp_path / "last.ckpt", "K") == str(tmp_path / "b.ckpt")
    assert _recorded_best(tmp_path / "last.ckpt", "other") is None


def test_test_best_without_checkpoint_is_clear(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    with pytest.raises(FileNotFoundError, match="best"):
        cli.main(["test", "--config", cfg, "--data.init_args.synthetic=true", "--ckpt_path", "best"])


def test_test_best_of_a_config_that_monitors_nothing_is_clear(tmp_path, monkeypatch, data_root):
    """A config whose only ModelCheckpoint monitors nothing (CPU-budget HOBA: last epoch) has no "best" at all (the
    text data module reads TREC through HOFORMER_DATA)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOFORMER_DATA", str(data_root))
    with pytest.raises(ValueError, match="monitors no metric.*checkpoints/last.ckpt"):
        cli.main(["test", "--config", str(REPO / "configs" / "hoba" / "cpu_trec_teacher.yaml"), "--ckpt_path", "best",
                  "--data.train_limit=300"])


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
    monkeypatch.setattr(hoformer.data, "download_url", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
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
    cli.HoformerCLI._resolve_best(ns)
    assert ns.config_init["test"]["ckpt_path"] == str(paths[-1])


# ------------------------------------------------------------------------------------------- config resolution
#: sha256[:16] of each committed config's effective configuration (trainer.callbacks as a multiset). Checked against
#: the resolution of the configs when the shared callbacks were still repeated in ltsf_cpu.yaml / weaver/paper.yaml:
#: the same configuration except the arguments added since at their neutral defaults (optim.warmup_ratio 0,
#: optim.fused None, select_on val/auc, data on_device False, the HOT models' shared d_mlp / mlp_bias and, on the causal
#: forecaster, the attention settings, the forecasting task's protocol "tslib") and the HOBA configs' warm-up given as
#: warmup_ratio 0.1 instead of the step count it was computed from (10 % of the run's optimiser steps); the forecaster's
#: `pool` named `head` (the CPU-budget configs keep the flattened head, the paper configs take the paper's time-mean
#: head); the run's callbacks named by their modules (``hoformer.train.callbacks.ExportPretrained`` /
#: ``SavePredictions``, ``hoformer.train.checkpoint_io.AtomicCheckpointIO``, the same classes as the
#: ``hoformer.train.tasks.*`` names they replace: with those names back every digest is the earlier one). A changed
#: digest means a committed run changes.
RESOLVED_DIGESTS = {
    "configs/hoba/cpu_sst2_hoba.yaml": "f7d9dabde8cec069",
    "configs/hoba/cpu_sst2_teacher.yaml": "3a8c1fc36d18e758",
    "configs/hoba/cpu_student.yaml": "325b2f7d19304ca9",  # names no teacher run (--teacher_run)
    "configs/hoba/cpu_teacher.yaml": "36007f8f6905d033",
    "configs/hoba/cpu_trec_hoba.yaml": "f6525cb7d0f2c566",
    "configs/hoba/cpu_trec_teacher.yaml": "36007f8f6905d033",
    "configs/hoba/paper_student.yaml": "0732393028c704ee",
    "configs/hoba/paper_teacher.yaml": "82f5c1e98a1b3c3c",
    "configs/hoba/sst2_hoba_3l_b16.yaml": "0732393028c704ee",
    "configs/hot/ltsf.yaml": "b4661cd276af87a4",
    "configs/hot/ltsf/etth1_96_96_full.yaml": "b541caabee0093ad",
    "configs/hot/ltsf/etth1_96_96_hot_product.yaml": "b4661cd276af87a4",
    "configs/hot/ltsf/etth1_96_96_hot_sum.yaml": "0e8c03eec3b8a0a7",
    "configs/hot/ltsf/etth1_96_96_spatial.yaml": "2fbb4f685f4aca93",
    "configs/hot/ltsf/etth1_96_96_temporal.yaml": "c14f0ffba5626d16",
    "configs/hot/ltsf/weather_96_336_hot_sum.yaml": "bfd1af110c995959",
    "configs/hot/ltsf/weather_96_96_hot_sum.yaml": "72179d93c3b4475b",
    "configs/hot/ltsf_cpu.yaml": "b1be8266531d3ade",
    "configs/hot/ltsf_cpu/etth1_96_720_joint.yaml": "69c7336df6566e16",
    "configs/hot/ltsf_cpu/etth1_96_720_official.yaml": "cc6e035bacd9c15a",
    "configs/hot/ltsf_cpu/etth1_96_96_hot_product.yaml": "b1be8266531d3ade",
    "configs/hot/ltsf_cpu/etth1_96_96_spatial.yaml": "e2395fac55b28883",
    "configs/hot/ltsf_cpu/etth1_96_causal.yaml": "5a62e3b0df337a3b",
    "configs/hot/ltsf_hot.yaml": "58bf4e793e981bab",
    "configs/hot/medmnist3d.yaml": "910f7e62ac2098fb",
    "configs/hot/medmnist3d/adrenal_cnn3d.yaml": "47438139211bfb81",
    "configs/hot/medmnist3d/adrenal_hot_product.yaml": "910f7e62ac2098fb",
    "configs/hot/medmnist3d/adrenal_hot_product_cpu.yaml": "32a0bec757834e46",
    "configs/hot/medmnist3d/adrenal_hot_sum.yaml": "974109af0c72e33a",
    "configs/hot/ssl4eo_l.yaml": "c75ccbccf0cae44f",
    "configs/weaver/los_loop_cpu.yaml": "9e96fb3b42aa56a1",
    "configs/weaver/los_loop_cpu_weaver_nt.yaml": "bb078e2d499bded8",
    "configs/weaver/los_loop_t.yaml": "f0f9ec2647299618",
    "configs/weaver/metr_la_nt.yaml": "518ed09d9fe6387a",
    "configs/weaver/paper.yaml": "da081ce29467bda4",
}


def _digest(cfg: dict) -> str:
    import hashlib
    import json

    cfg = json.loads(json.dumps(cfg, default=str))
    callbacks = (cfg.get("trainer") or {}).get("callbacks")
    if callbacks:
        cfg["trainer"]["callbacks"] = sorted(callbacks, key=lambda c: json.dumps(c, sort_keys=True))
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def test_every_committed_config_resolves_to_its_earlier_effective_configuration(monkeypatch):
    monkeypatch.chdir(REPO)
    found = sorted(str(p.relative_to(REPO)) for p in CONFIGS if p.name != "trainer.yaml")
    assert found == sorted(RESOLVED_DIGESTS)
    changed = [name for name in found if _digest(resolve_config(name)) != RESOLVED_DIGESTS[name]]
    assert not changed, changed


@pytest.mark.parametrize("name", ["hot/ltsf/etth1_96_96_spatial", "hot/ltsf/etth1_96_96_temporal",
                                  "hot/ltsf_cpu/etth1_96_96_spatial"])
def test_the_baselines_of_the_results_pages_ship_as_configs(name, monkeypatch):
    """The spatial (iTransformer) and temporal Transformers the results pages compare HOT with are files, each the
    grid experiment of the same name (benchmarks/paper_configs.py) and nothing else."""
    monkeypatch.chdir(REPO)
    args = EXPERIMENTS[name]
    assert _digest(resolve_config(f"configs/{name}.yaml")) == _digest(resolve_config(args[1], args[2:]))


def test_composed_configs_add_to_the_shared_callbacks_instead_of_repeating_them():
    shared = [c["class_path"] for c in yaml.safe_load((REPO / "configs/trainer.yaml").read_text())["trainer"]["callbacks"]]
    for name, added in [("configs/hot/ltsf_cpu.yaml", "EarlyStopping"), ("configs/weaver/paper.yaml", "EarlyStopping")]:
        own = yaml.safe_load((REPO / name).read_text())["trainer"]
        assert "callbacks" not in own and [c["class_path"].rsplit(".", 1)[-1] for c in own["callbacks+"]] == [added]
        resolved = [c["class_path"] for c in resolve_config(REPO / name)["trainer"]["callbacks"]]
        assert resolved == shared + [f"lightning.pytorch.callbacks.{added}"]
    # an experiment two levels down inherits both lists; an override on top applies last
    cfg = resolve_config(REPO / "configs/hot/ltsf_cpu/etth1_96_720_joint.yaml", ["--trainer.max_epochs=2"])
    assert [c["class_path"].rsplit(".", 1)[-1] for c in cfg["trainer"]["callbacks"]][-1] == "EarlyStopping"
    assert cfg["trainer"]["max_epochs"] == 2 and cfg["data"]["init_args"]["pred_len"] == 720


def test_build_datamodule_reads_a_config_with_its_bases():
    from hoformer.inference import build_datamodule

    dm = build_datamodule(config=REPO / "configs/hot/ltsf/etth1_96_96_hot_product.yaml", data_args={"synthetic": True})
    assert (type(dm).__name__, dm.seq_len, dm.pred_len) == ("LTSFDataModule", 96, 96)


def test_cpu_variants_are_override_lists_that_resolve():
    """benchmarks/paper_configs.py VARIANTS: each variant is a list of `hoformer fit` overrides on the committed
    experiment, read by the same resolver as the CLI (an EMA callback is added to the config's callbacks, not put in
    their place); the campaign's cpu_variants plan runs them."""
    configs = _import_file(REPO / "benchmarks" / "paper_configs.py")
    shared = [c["class_path"] for c in resolve_config(REPO / "configs/hot/ltsf_cpu.yaml")["trainer"]["callbacks"]]
    name = "hot/ltsf_cpu/etth1_96_720_hot_product"
    args = [a for a in configs.experiments()[name] if not a.startswith("--trainer.default_root_dir")]
    for variant, seed in (("reg", None), ("ema", 2025), ("ema_official", None), ("ema+qk_bias", None)):
        extra = configs.variant_overrides(variant, seed)
        cfg = resolve_config(REPO / args[1], [*args[2:], *extra])
        assert cfg["data"]["init_args"]["pred_len"] == 720
        callbacks = cfg["trainer"]["callbacks"]
        assert [c["class_path"] for c in callbacks[:len(shared)]] == shared
        if variant.startswith("ema"):
            assert callbacks[-1]["class_path"].endswith("EMAWeightAveraging")
            assert callbacks[-1]["init_args"]["decay"] == 0.99
            assert cfg["seed_everything"] == (2025 if seed else 2024)
        if variant == "ema_official":
            assert cfg["model"]["init_args"]["horizons"] == [96, 192, 336, 720]
            assert cfg["model"]["init_args"]["model"]["init_args"]["head"] == "mean"
        if variant == "ema+qk_bias":
            assert cfg["model"]["init_args"]["model"]["init_args"]["qk_bias"] is True
        if variant == "reg":
            assert cfg["model"]["init_args"]["model"]["init_args"]["dropout"] == 0.3
            assert cfg["model"]["init_args"]["optim"]["weight_decay"] == 0.5
    with pytest.raises(ValueError, match="unknown variant"):
        configs.variant_overrides("nope")


def test_a_run_folder_holds_one_fit(tmp_path, capsys):
    """A live run's lock refuses a second fit into its folder; a lock left by a process that is gone is taken over;
    a finished run is replaced only when resuming or told to overwrite."""
    import json
    import socket

    from hoformer.train.guards import RunFolderError, hold_run_folder

    root, host = tmp_path / "run", socket.gethostname()
    release = hold_run_folder(root)
    with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {os.getpid()}"):
        hold_run_folder(root)
    release()
    assert not (root / ".hoformer.lock").exists()
    (root / ".hoformer.lock").write_text(json.dumps({"host": host, "pid": os.getppid(), "started": "t"}))
    with pytest.raises(RunFolderError, match=f"pid {os.getppid()} on {host}"):  # a live process holds it
        hold_run_folder(root)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (root / ".hoformer.lock").write_text(json.dumps({"host": host, "pid": gone.pid, "started": "t"}))
    hold_run_folder(root)()  # stale: taken over
    assert "stale lock" in capsys.readouterr().err
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "last.ckpt").write_bytes(b"x")
    with pytest.raises(RunFolderError, match="finished run \\(checkpoints/last.ckpt\\).*--ckpt_path"):
        hold_run_folder(root)
    hold_run_folder(root, resume=True)()
    hold_run_folder(root, overwrite=True)()
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        hold_run_folder(tmp_path / "file")


def test_allow_data_mismatch_reaches_the_task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*expand_configs(["--config", str(REPO / "configs/hot/ltsf_cpu/etth1_96_96_hot_product.yaml")]),
            "--data.init_args.synthetic=true", "--trainer.logger=false"]
    assert cli.HoformerCLI(args=args, run=False).model.allow_data_mismatch is False
    assert cli.HoformerCLI(args=[*args, "--allow_data_mismatch=true"], run=False).model.allow_data_mismatch is True
