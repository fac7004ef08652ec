"""Paper-scale campaign: run the next pending experiments of one priority list within a time budget, resume the
unfinished ones exactly, and record every finished run as one line of the results ledger.

    python benchmarks/campaign.py --budget-min 9 --device cuda            # a GPU window: the paper recipe
    python benchmarks/campaign.py --budget-min 170 --device cpu           # a CPU: ETTh1 at paper size, early-stopped
    python benchmarks/campaign.py --budget-min 9 --dry-run                # the plan, estimates, a one-step smoke test
    python benchmarks/campaign.py --status                                # done / in progress / pending / refused
    python benchmarks/campaign.py --tables [--check]                      # regenerate the ledger tables in the docs

* **Priority list** (:func:`paper_plan`, first to last): HOT Weather 96->{96,192,336,720} product, sum and the spatial
  baseline; ETTh1 at paper size; AdrenalMNIST3D with the paper's Table 6 search (patch, dropout, weight decay); the
  other MedMNIST3D sets present in the data folder; the rest of the paper grid (``benchmarks/paper_configs.py``; the
  HOBA students, which need their teacher's run first, are recorded with ``benchmarks/hoba_students.py --ledger``).
  ``--plan etth1_tuned``: the tuned ETTh1 configurations for three seeds; ``--plan losloop``: the Los-loop models;
  ``--plan volumes``: AdrenalMNIST3D (the CPU-budget volume model, then the paper recipe beside the 3D CNN).
  Each experiment is a ``paper_configs.py`` experiment: the paper's model, optimiser and 100 epochs, the
  best-validation checkpoint tested. On a CPU (:func:`cpu_plan`) the same paper-size ETTh1 models (96->{96, 720, 192,
  336}, HOT product and the spatial baseline) stop early on the validation MAE (patience 10, recorded in the
  ledger line): the paper's 100 epochs take about five hours each there. ``--plan precision`` runs one experiment
  in bf16-mixed and in float32 (:func:`precision_plan`).
* **Packing**: ``--parallel K`` runs (default 2 on a CPU, one thread each; 4 on a GPU, sharing it) take the next
  pending experiment whenever one ends, as long as the budget leaves time for at least one more epoch and the test.
  An epoch's time comes from the run itself, its ledger line, its ``--dry-run`` smoke test, or else its closest
  relative (the same paper experiment with another seed or overrides, then the same model and data at another
  horizon); an experiment with no such measurement starts only while a quarter of the budget is left.
* **Deadline**: each fit gets a :class:`hoformer.train.Deadline` callback that stops at the last epoch boundary before
  the budget ends; the run's ``last.ckpt`` is then resumed exactly by the next call (``--ckpt_path last.ckpt``,
  hoformer's per-epoch reseeding). A fit still running at the hard end of the budget is stopped; its last complete
  epoch is kept.
* **Output**: run folders ``<--out>/<experiment>`` (checkpoints, logs, ``campaign.json`` with the wall time of every
  attempt) and, for each run that finished, one JSON line appended to ``--ledger`` (default
  ``results/ledger.jsonl``, which must exist unless ``--new-ledger``; ``hoformer.results`` checks the line):
  experiment, task, dataset, model, horizon, test metrics, seed, epochs run, best epoch, the stopping rule read from
  the run's saved ``config.yaml``, fit and test wall time (``fit_s``, ``test_s``), hardware, torch version, commit,
  scale and the exact ``hoformer fit`` and ``hoformer test`` commands (``record: run``).
* **One campaign per output folder** (``<out>/.campaign.lock``: pid and host; a stale lock is taken over with a
  note). **SIGTERM / SIGINT** are passed on to the running fits (they end their batch; the last complete epoch's
  checkpoint stays), the attempts are recorded, and the campaign exits with 128 + the signal's number.

Run it from the repository root (the configs are relative paths); the hoformer it imports is the one the runs use:
do not edit ``src/`` under a running campaign (use a ``git worktree`` and ``PYTHONPATH=<worktree>/src``).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import difflib
import fnmatch
import functools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 2024  # configs/trainer.yaml
sys.path.insert(0, str(ROOT / "src"))  # the hoformer next to this script, as its runs use (_env), whatever is installed

import ledger  # noqa: E402  (benchmarks/: a script's own folder is on sys.path)
import paper_configs  # noqa: E402
from hoformer._io import pid_alive  # noqa: E402


LEDGER, read_ledger, append_ledger, LedgerError = ledger.LEDGER, ledger.read_ledger, ledger.append_ledger, ledger.LedgerError

# ------------------------------------------------------------------------------------------------ experiments
SELECTION = {  # task family -> (validation metric that selects the checkpoint and stops early, mode)
    "forecasting": ("val/mae", "min"), "classification": ("val/auc", "max"), "segmentation": ("val/acc", "max"),
    "traffic": ("val/mae", "min"), "text": ("val/acc", "max"),
}


@dataclass(frozen=True)
class Experiment:
    """One run of the campaign: a ``paper_configs.py`` experiment (``base``) plus ``extra`` overrides.

    ``name`` names the run folder and the ledger line; ``patience`` adds early stopping on the task's
    model-selection metric (``None``: the paper's fixed epoch count); ``family`` is the task family (default: from the
    experiment's name)."""

    name: str
    base: str
    extra: tuple[str, ...] = ()
    scale: str = "paper"
    patience: int | None = None
    family: str | None = None

    @property
    def task(self) -> str:
        if self.family:
            return self.family
        prefix = self.base.split("/")[:2]
        return {"hot/ltsf": "forecasting", "hot/ltsf_cpu": "forecasting", "hot/ltsf_hot": "forecasting",
                "hot/medmnist3d": "classification", "hot/medmnist3d_cpu": "classification",
                "hot/ssl4eo_l": "segmentation"}.get(
            "/".join(prefix), {"weaver": "traffic", "hoba": "text"}.get(prefix[0], "other"))

    @property
    def protocol(self) -> str | None:
        """The forecasting protocol (``ForecastingTask(protocol=...)``): ``"hot"`` for the ``hot/ltsf_hot/*``
        experiments, ``"tslib"`` for the other forecasting ones, None for other tasks."""
        if self.task != "forecasting":
            return None
        return "hot" if self.base.startswith("hot/ltsf_hot/") else "tslib"

    @property
    def selection(self) -> tuple[str, str]:
        """``(metric, mode)`` that selects the checkpoint and stops early (the task's ``selection``)."""
        return ("val/mae_mean", "min") if self.protocol == "hot" else SELECTION[self.task]

    def args(self) -> list[str]:
        """``hoformer fit`` arguments without the run folder."""
        args = [a for a in paper_configs.experiments()[self.base] if not a.startswith("--trainer.default_root_dir=")]
        args += list(self.extra)
        if self.patience is not None:
            monitor, mode = self.selection
            args += ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
                     f"--trainer.callbacks.monitor={monitor}", f"--trainer.callbacks.patience={self.patience}",
                     f"--trainer.callbacks.mode={mode}"]
        return args

    def value(self, key: str, default=None):
        """The last ``--...key=value`` among the arguments (``key``: the option's last dotted part)."""
        vals = [a.split("=", 1)[1] for a in self.args()
                if "=" in a and a.split("=", 1)[0].split(".")[-1].lstrip("-") == key]
        return vals[-1] if vals else default

    def describe(self, data: dict | None = None) -> dict:
        """The ledger's identification fields; ``data``: the ``data.init_args`` the run was fitted with (its
        LightningCLI ``config.yaml``; default: what the arguments say)."""
        model = self.base.split("/")[-1]
        for v in (*paper_configs.FORECAST_VARIANTS, *paper_configs.CLS_VARIANTS, "cnn3d"):
            if self.base.endswith("_" + v):
                model = v
        if self.base.startswith("weaver/los_loop_cpu_"):  # weaver_nt_sdpa -> weaver_NT_sdpa (the Los-loop tables' names)
            model = re.sub(r"^weaver_(nt|t)(?=_|$)", lambda m: "weaver_" + m.group(1).upper(),
                           self.base.removeprefix("weaver/los_loop_cpu_"))
        data = data if data is not None else {}

        def get(key, default=None):
            return data.get(key, self.value(key, default))

        d = {"experiment": self.name, "task": self.task, "model": model, "scale": self.scale}
        dataset = "synthetic" if get("synthetic") in (True, "true") else get("name") or get("flag") or \
            get("dataset") or get("product")
        d["dataset"] = dataset
        if self.task == "forecasting":
            d.update(lookback=int(get("seq_len")), horizon=int(get("pred_len")), protocol=self.protocol)
        elif self.task == "classification":
            d["size"] = int(get("size", 28))
            shift = int(get("shift_augment", 0))
            augment = ["flips"] * (get("flip_augment") in (True, "true")) + [f"shift{shift}"] * (shift > 0)
            if augment:
                d["augment"] = "+".join(augment)
        return d


def _present(rel: str) -> bool:
    return (Path(os.environ.get("HOFORMER_DATA", ROOT.parent / "shared" / "data")) / rel).exists()


LTSF_FILES = {"ETTh1": "ltsf/ETT-small/ETTh1.csv", "ETTh2": "ltsf/ETT-small/ETTh2.csv",
              "ETTm1": "ltsf/ETT-small/ETTm1.csv", "ETTm2": "ltsf/ETT-small/ETTm2.csv",
              "weather": "ltsf/weather/weather.csv", "electricity": "ltsf/electricity/electricity.csv",
              "traffic": "ltsf/traffic/traffic.csv", "solar": "ltsf/Solar/solar_AL.txt",
              "national_illness": "ltsf/illness/national_illness.csv"}


def data_present(exp: Experiment) -> bool:
    """Whether the experiment's data file is in the data folder (``$HOFORMER_DATA``)."""
    if exp.task == "forecasting":
        return _present(LTSF_FILES.get(exp.value("name"), "-"))
    if exp.task == "classification":
        return _present(f"medmnist3d/{exp.value('flag')}.npz")
    if exp.task == "traffic":
        ds = exp.value("dataset", "los_loop" if exp.base.startswith("weaver/los_loop_cpu_") else "metr_la")
        return _present({"metr_la": "traffic/metr-la.h5", "pems_bay": "traffic/pems-bay.h5",
                         "los_loop": "traffic/los_loop/los_speed.csv"}.get(ds, "-"))
    if exp.task == "text":
        return _present(f"text/{exp.value('dataset')}")
    return False  # SSL4EO-L patches are not distributed here


TABLE6 = {"patch_size": (4, 2), "dropout": (0.0, 0.1, 0.2, 0.3), "weight_decay": (0.01, 0.1, 0.3, 0.5)}


def paper_plan() -> list[Experiment]:
    """The priority list of the paper-recipe campaign (100 epochs, best validation checkpoint), first to last."""
    plan = [Experiment(f"hot/ltsf/weather_96_{h}_{v}", f"hot/ltsf/weather_96_{h}_{v}")
            for h in (96, 192, 336, 720) for v in ("hot_product", "hot_sum", "spatial")]
    plan += [Experiment(f"hot/ltsf/etth1_96_{h}_{v}", f"hot/ltsf/etth1_96_{h}_{v}")
             for h in (96, 720, 192, 336) for v in ("hot_product", "spatial", "hot_sum")]
    model = "--model.model.init_args"
    for patch in TABLE6["patch_size"]:
        for drop in TABLE6["dropout"]:
            for wd in TABLE6["weight_decay"]:
                plan.append(Experiment(f"hot/medmnist3d/adrenal_hot_product_p{patch}_d{drop}_wd{wd}",
                                       "hot/medmnist3d/adrenal_hot_product",
                                       (f"{model}.patch_size={patch}", f"{model}.dropout={drop}",
                                        f"--model.init_args.optim.weight_decay={wd}")))
    seen = {e.base for e in plan}
    medmnist = [n for n in paper_configs.experiments() if n.startswith("hot/medmnist3d/") and n not in seen]
    rest = [n for n in paper_configs.experiments()
            if n.startswith(("hot/ltsf/", "weaver/")) and n not in seen and "_cpu" not in n]
    plan += [Experiment(n, n) for n in medmnist + rest]
    return [e for e in plan if data_present(e)]


def cpu_plan() -> list[Experiment]:
    """Paper-size ETTh1 on a CPU: the paper's model and optimiser, early stopping on validation MAE (patience 10),
    the four horizons of the paper's average, shortest and longest first, seed by seed (three seeds give the paired
    interval of the verdict table), with each of the two forecaster heads:

    * ``+mean``: the paper's time-mean head (``head: mean``, what ``configs/hot/ltsf.yaml`` sets): seed 2024 (2025
      and 2026 are in the ledger);
    * the flattened head (``--model.model.init_args.head=flatten``, PatchTST's), the verdict table's "flattened
      head" row: seeds 2025 and 2026 (2024 is in the ledger; it ran when the config's head was the flattened one)."""
    plan = []

    def add(seed, tag, head_args):
        seed_args = () if seed == SEED else (f"--seed_everything={seed}",)
        plan.extend(Experiment(f"hot/ltsf/etth1_96_{h}_{v}{tag}+es10" + ("" if seed == SEED else f"+s{seed}"),
                               f"hot/ltsf/etth1_96_{h}_{v}", (*head_args, *seed_args), patience=10)
                    for h in (96, 720, 192, 336) for v in ("hot_product", "spatial"))

    for seed in (2025, 2026, 2024):
        add(seed, "+mean", ())
    for seed in (2024, 2025, 2026):
        add(seed, "", ("--model.model.init_args.head=flatten",))
    return plan


def precision_plan() -> list[Experiment]:
    """bf16-mixed against float32 on one experiment (the CPU-budget ETTh1 96->96 HOT product run, early-stopped as
    its config says): whether the metrics hold in bf16, on whatever device runs it."""
    base = "hot/ltsf_cpu/etth1_96_96_hot_product"
    return [Experiment(f"{base}+fp32", base, ("--trainer.precision=32-true",), scale="cpu"),
            Experiment(f"{base}+bf16", base, ("--trainer.precision=bf16-mixed",), scale="cpu")]


def protocol_plan() -> list[Experiment]:
    """HOT against its baselines under the HOT authors' protocol (``configs/hot/ltsf_hot.yaml``: one 720-step model
    answers the four horizons) on Weather at paper size, on a CPU: early stopping on the mean validation MAE with
    patience 3 (Time-Series-Library's patience; the paper's 100 epochs take about 30 h per HOT run here). The spatial
    baseline (iTransformer, minutes) and HOT product first, then HOT sum, seed by seed (2024, 2025, 2026)."""
    plan = []
    for seed in (2024, 2025, 2026):
        for v in ("spatial", "hot_product", "hot_sum"):
            extra = () if seed == SEED else (f"--seed_everything={seed}",)
            plan.append(Experiment(f"hot/ltsf_hot/weather_96_{v}+es3" + ("" if seed == SEED else f"+s{seed}"),
                                   f"hot/ltsf_hot/weather_96_{v}", extra, patience=3))
    return [e for e in plan if data_present(e)]


def etth1_tuned_plan(log=print) -> list[Experiment]:
    """Paper-size ETTh1 with the configuration ``hoformer tune`` found for each model (``configs/hot/tuned/
    etth1_96_96_{spatial,hot_product}.yaml``, exported with ``--export-best``) at 96 -> 96 and 96 -> 720, three seeds
    (2024-2026), early-stopped on the validation MAE (patience 10): spatial first, then HOT product, 96 before 720,
    seed by seed. An experiment whose tuned config is not in the checkout is left out with a note."""
    plan = []
    for v in ("spatial", "hot_product"):
        cfg = f"configs/hot/tuned/etth1_96_96_{v}.yaml"
        if not (ROOT / cfg).is_file():
            log(f"note: {cfg} is not in the checkout; the etth1_tuned experiments of {v} are left out")
            continue
        for h in (96, 720):
            for seed in (2024, 2025, 2026):
                seed_args = () if seed == SEED else (f"--seed_everything={seed}",)
                plan.append(Experiment(f"hot/ltsf/etth1_96_{h}_{v}+tuned+es10" + ("" if seed == SEED else f"+s{seed}"),
                                       f"hot/ltsf/etth1_96_{h}_{v}", ("--config", cfg, *seed_args), patience=10))
    return [e for e in plan if data_present(e)]


def volumes_plan() -> list[Experiment]:
    """AdrenalMNIST3D on a CPU: the CPU-budget HOT product model with the imbalanced-class recipe
    (``hot/medmnist3d_cpu/adrenal_hot_product``: width 64, 2 blocks, 30 epochs, balanced class weights, the best
    validation balanced accuracy tested; minutes per run), then the recipes of the verdict table beside each other,
    seed by seed (2024-2026): HOT product with the paper's 100 epochs and random flips plus 2-voxel shifts
    (``+flips+shift2``, about 2 h per run on one thread) and the 3D CNN reference at 30 epochs (``+30ep``, about
    30 min)."""
    recipes = {"hot/medmnist3d_cpu/adrenal_hot_product": ("", (), "cpu"),
               "hot/medmnist3d/adrenal_cnn3d": ("+30ep", ("--trainer.max_epochs=30",), "paper"),
               "hot/medmnist3d/adrenal_hot_product": (
                   "+flips+shift2", ("--data.init_args.flip_augment=true", "--data.init_args.shift_augment=2"), "paper")}
    plan = []
    for base, (suffix, overrides, scale) in recipes.items():
        for seed in (2024, 2025, 2026):
            extra = overrides + (() if seed == SEED else (f"--seed_everything={seed}",))
            plan.append(Experiment(base + suffix + ("" if seed == SEED else f"+s{seed}"), base, extra, scale=scale))
    return [e for e in plan if data_present(e)]


def losloop_plan() -> list[Experiment]:
    """Los-loop on a CPU (``configs/weaver/los_loop_cpu.yaml``: E=32, 8 epochs, the paper's optimiser, best validation
    MAE tested): every ``weaver/los_loop_cpu_*`` experiment of ``paper_configs.py`` (Weaver T / NT with the Tanimoto,
    SDPA and cosine kernels, the transformer baselines), seeds 0, 1, 2 seed by seed; the tables of
    docs/results_traffic.md."""
    plan = []
    for seed in (0, 1, 2):
        for v in paper_configs.CPU_TRAFFIC:
            plan.append(Experiment(f"weaver/los_loop_cpu_{v}" + ("" if seed == 0 else f"+s{seed}"),
                                   f"weaver/los_loop_cpu_{v}", (f"--seed_everything={seed}",), scale="cpu"))
    return [e for e in plan if data_present(e)]


def protocols_paper_plan() -> list[Experiment]:
    """The Weather runs of :func:`protocol_plan` with the paper's full recipe (100 epochs, no early stopping, the best
    mean-validation-MAE checkpoint tested): what a GPU window runs first (``benchmarks/gpu_window.sh``); HOT product,
    the spatial baseline, HOT sum, seed by seed."""
    plan = []
    for seed in (2024, 2025, 2026):
        for v in ("hot_product", "spatial", "hot_sum"):
            extra = () if seed == SEED else (f"--seed_everything={seed}",)
            plan.append(Experiment(f"hot/ltsf_hot/weather_96_{v}" + ("" if seed == SEED else f"+s{seed}"),
                                   f"hot/ltsf_hot/weather_96_{v}", extra))
    return [e for e in plan if data_present(e)]


def cpu_variants_plan() -> list[Experiment]:
    """The CPU-budget ETTh1 variants behind docs/results_hot.md's seed and one-model tables
    (``paper_configs.VARIANTS``): the EMA runs of HOT product, HOT sum and the spatial baseline at the four horizons
    for seeds 2024-2028, the q/k-bias runs at 96 -> 96 (seeds 2024-2026), and the joint-horizon and reference-preset
    runs at 96 -> 720."""
    def exp(base: str, variant: str, seed: int) -> Experiment:
        extra = tuple(paper_configs.variant_overrides(variant, None if seed == SEED else seed))
        return Experiment(f"{base}+{variant}" + ("" if seed == SEED else f"+s{seed}"), base, extra, scale="cpu")

    plan = [exp(f"hot/ltsf_cpu/etth1_96_{h}_{m}", "ema", seed) for seed in (2024, 2025, 2026, 2027, 2028)
            for m in ("hot_product", "hot_sum", "spatial") for h in (96, 192, 336, 720)]
    plan += [exp("hot/ltsf_cpu/etth1_96_96_hot_product", "ema+qk_bias", seed) for seed in (2024, 2025, 2026)]
    plan += [exp("hot/ltsf_cpu/etth1_96_720_hot_product", v, SEED) for v in ("ema_joint", "ema_official")]
    return [e for e in plan if data_present(e)]


PLANS = {"paper": paper_plan, "cpu": cpu_plan, "precision": precision_plan, "protocols": protocol_plan,
         "protocols_paper": protocols_paper_plan, "etth1_tuned": etth1_tuned_plan, "losloop": losloop_plan,
         "volumes": volumes_plan,
         "cpu_variants": cpu_variants_plan}


# ------------------------------------------------------------------------------------------------ provenance
hardware, commit = ledger.hardware, ledger.commit


def _test_metrics(root: Path) -> dict:
    """The last ``test/*`` row of the newest CSV log under ``root/logs``."""
    for path in sorted((root / "logs").glob("version_*/metrics.csv"), key=lambda p: p.stat().st_mtime, reverse=True):
        rows = [r for r in csv.DictReader(path.open()) if any(k.startswith("test/") and r[k] for k in r)]
        if rows:
            return {k: float(v) for k, v in rows[-1].items() if k.startswith("test/") and v}
    raise RuntimeError(f"no test metrics under {root / 'logs'}")


def _val_rows(root: Path) -> list[dict]:
    rows = []
    for path in (root / "logs").glob("version_*/metrics.csv"):
        for r in csv.DictReader(path.open()):
            if any(k.startswith("val/") and r[k] for k in r):
                rows.append({k: float(v) for k, v in r.items() if v and (k.startswith("val/") or k == "epoch")})
    return rows


def _ckpt_epochs(root: Path) -> int:
    """Epochs completed according to ``last.ckpt`` (0 when there is none)."""
    last = root / "checkpoints" / "last.ckpt"
    if not last.exists():
        return 0
    from hoformer.checkpoint import read_checkpoint

    return int(read_checkpoint(last, fn="campaign")["epoch"]) + 1


def _resolved(root: Path, *keys: str):
    """A value of the configuration the run was fitted with (LightningCLI's ``config.yaml`` in its log folder)."""
    import yaml

    for path in sorted((root / "logs").glob("version_*/config.yaml")):
        node = yaml.safe_load(path.read_text())
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def stopping_rule(root: Path) -> dict:
    """The stopping rule the run used, from its saved ``config.yaml``: ``max_epochs``, ``max_time`` and
    ``min_epochs`` where set, and every ``EarlyStopping`` callback (monitor, mode, patience, min_delta; a list when
    there are several), whether the config, the experiment or the plan added it."""
    trainer = _resolved(root, "trainer") or {}
    rule = {k: trainer[k] for k in ("max_epochs", "min_epochs", "max_time", "max_steps")
            if trainer.get(k) not in (None, -1)}
    stops = [{k: (c.get("init_args") or {}).get(k) for k in ("monitor", "mode", "patience", "min_delta")
              if (c.get("init_args") or {}).get(k) is not None}
             for c in trainer.get("callbacks") or [] if isinstance(c, dict)
             and str(c.get("class_path", "")).rsplit(".", 1)[-1] == "EarlyStopping"]
    if stops:
        rule["early_stopping"] = stops[0] if len(stops) == 1 else stops
    return rule


def _best_epoch(root: Path) -> int | None:
    best = sorted((root / "checkpoints").glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
    m = re.search(r"epoch=?(\d+)", best[-1].name) if best else None
    return int(m.group(1)) if m else None


@dataclass
class RunState:
    """``<run>/campaign.json``: every attempt (start, fit wall seconds, hardware, commit, epochs after it, exit status,
    ``stopped_by`` a signal, the experiment's ``args``: a folder is resumed only by the arguments that started it),
    whether the fit has ended by itself (``fitted``: max_epochs or early stopping), the test's wall seconds
    (``test_s``) and whether the run is done (tested, in the ledger)."""

    path: Path
    attempts: list[dict] = field(default_factory=list)
    fitted: bool = False
    done: bool = False
    test_s: float | None = None

    @classmethod
    def load(cls, root: Path) -> "RunState":
        p = root / "campaign.json"
        if p.exists():
            d = json.loads(p.read_text())
            return cls(p, d.get("attempts", []), d.get("fitted", False), d.get("done", False), d.get("test_s"))
        return cls(p)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"attempts": self.attempts, "fitted": self.fitted, "done": self.done,
                                   "test_s": self.test_s}, indent=1))
        os.replace(tmp, self.path)

    @property
    def wall_s(self) -> float:
        return sum(a.get("wall_s", 0.0) for a in self.attempts)

    def other_args(self, args: list[str]) -> list[str] | None:
        """The arguments of an earlier attempt that are not ``args`` (None: no recorded attempt differs; attempts
        made before arguments were recorded are not checked)."""
        return next((a["args"] for a in self.attempts if a.get("args", args) != args), None)

    def epoch_s(self) -> float | None:
        """The slowest measured epoch of this run (seconds), from its attempts."""
        times = [t for a in self.attempts for t in a.get("epoch_s", [])]
        return max(times) if times else None


# --------------------------------------------------------------------------------------------------- running
def _env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    src = str(ROOT / "src")  # the hoformer next to this script, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _accelerator(device: str) -> str:
    return "--trainer.accelerator=" + ("gpu" if device.startswith("cuda") else "cpu")


def fit_command(exp: Experiment, root: Path, device: str, deadline: float, resume: bool) -> list[str]:
    cmd = ["fit", *exp.args(), f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false",
           _accelerator(device), "--trainer.callbacks+=hoformer.train.Deadline", f"--trainer.callbacks.at={deadline:.0f}"]
    if resume:
        cmd += ["--ckpt_path", str(root / "checkpoints" / "last.ckpt")]
    return cmd


def test_command(exp: Experiment, root: Path, device: str) -> list[str]:
    """``hoformer test`` of the run's best checkpoint (the one its ledger line reports)."""
    return ["test", *exp.args(), f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false",
            _accelerator(device), "--ckpt_path", "best"]


def public_command(exp: Experiment, sub: str = "fit") -> str:
    """The ``hoformer fit`` (``sub="test"``: ``hoformer test ... --ckpt_path best``) command a reader runs to
    reproduce a ledger line (run folder under ``runs/campaign``)."""
    return f"hoformer {sub} " + " ".join(shlex.quote(a) for a in [
        *exp.args(), f"--trainer.default_root_dir=runs/campaign/{exp.name}", *(["--ckpt_path", "best"] * (sub == "test"))])


class _Stop(threading.Event):
    signal = "signal"  # the name of the signal that set it


#: set by the campaign's SIGTERM / SIGINT handler: the running fits are asked to stop, nothing new starts
STOP = _Stop()
#: seconds a stopped fit gets to end its batch and exit before it is killed
STOP_GRACE_S = 120.0


def run_cli(argv: list[str], log_path: Path, threads: int, deadline: float) -> int:
    """``python -m hoformer.cli <argv>`` in a new process (output appended to ``log_path``) until it ends, until
    ``deadline`` (Unix time) passes or until the campaign is stopped (:data:`STOP`): then it gets SIGTERM (Lightning
    ends the batch and exits; the last complete epoch's checkpoint stays), SIGKILL after :data:`STOP_GRACE_S`."""
    with open(log_path, "a") as logf:
        logf.write(f"$ hoformer {' '.join(shlex.quote(a) for a in argv)}\n")
        logf.flush()
        p = subprocess.Popen([sys.executable, "-m", "hoformer.cli", *argv], cwd=ROOT, env=_env(threads),
                             stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while p.poll() is None:
                if time.time() > deadline or STOP.is_set():
                    logf.write(f"campaign: {'stopped by a signal' if STOP.is_set() else 'hard deadline'}, "
                               "stopping the run\n")
                    logf.flush()
                    os.killpg(p.pid, signal.SIGTERM)
                    try:
                        p.wait(STOP_GRACE_S)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                    return -signal.SIGTERM
                time.sleep(0.2)
            return p.returncode
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class Campaign:
    """Runs experiments into ``out`` and records the finished ones in ``ledger``; ``runner`` starts one ``hoformer``
    command (:func:`run_cli`: a process per command)."""

    def __init__(self, out: Path, ledger_path: Path, device: str, threads: int, deadline: float, log=print,
                 runner=run_cli) -> None:
        self.out, self.ledger, self.device, self.threads, self.deadline = out, ledger_path, device, threads, deadline
        self.log, self.runner = log, runner

    def _run(self, argv: list[str], log_path: Path) -> int:
        return self.runner(argv, log_path, self.threads, self.deadline)

    def run(self, exp: Experiment, test_reserve: float) -> str:
        """Fit (or resume) ``exp`` until it ends or the deadline; test and record it when it ended. Returns
        ``"done"``, ``"paused"`` (resumable) or ``"failed"``."""
        root = self.out / exp.name
        root.mkdir(parents=True, exist_ok=True)
        state = RunState.load(root)
        args = list(exp.args())
        other = state.other_args(args)
        if other is not None:
            self.log(f"  {exp.name}: {root} holds a run of other arguments ({' '.join(other)}), not this "
                     f"experiment's ({' '.join(args)}); it is neither resumed nor recorded: move that folder away")
            return "failed"
        if state.done:
            return "done"
        if STOP.is_set():
            return "interrupted"
        if not state.fitted:
            resume = (root / "checkpoints" / "last.ckpt").exists()
            (root / "deadline.json").unlink(missing_ok=True)
            t0 = time.time()
            rc = self._run(fit_command(exp, root, self.device, self.deadline - test_reserve, resume),
                           root / "fit.log")
            report = json.loads((root / "deadline.json").read_text()) if (root / "deadline.json").exists() else {}
            state.attempts.append({"start": dt.datetime.fromtimestamp(t0, dt.timezone.utc).isoformat(
                timespec="seconds"), "wall_s": round(time.time() - t0, 1), "hardware": hardware(self.device,
                                                                                                self.threads),
                "commit": commit(), "epochs_after": _ckpt_epochs(root), "rc": rc, "epoch_s": report.get("epoch_s", []),
                "args": args})
            if STOP.is_set():  # whatever the fit's exit status, it did not end by itself
                state.attempts[-1]["stopped_by"] = STOP.signal
                state.save()
                self.log(f"  {exp.name}: stopped by {state.attempts[-1]['stopped_by']} after {_ckpt_epochs(root)} "
                         "epochs (resumable)")
                return "interrupted"
            state.fitted = rc == 0 and bool(report) and not report["stopped_by_deadline"]
            state.save()
            if rc != 0 or not report:
                self.log(f"  {exp.name}: fit stopped (exit {rc}); {_ckpt_epochs(root)} epochs kept, "
                         f"see {root / 'fit.log'}")
                return "paused" if rc == -signal.SIGTERM else "failed"
            if report["stopped_by_deadline"]:
                self.log(f"  {exp.name}: paused at the deadline after {_ckpt_epochs(root)} epochs (resumable)")
                return "paused"
        t1 = time.time()
        rc = self._run(test_command(exp, root, self.device), root / "test.log")
        if STOP.is_set():
            self.log(f"  {exp.name}: test stopped by a signal (the fit is kept; the next call tests it)")
            return "interrupted"
        if rc != 0:
            self.log(f"  {exp.name}: test failed, see {root / 'test.log'}")
            return "failed"
        state.test_s = round(time.time() - t1, 1)
        row = self.ledger_row(exp, root, state)
        if self.ledger.exists() and exp.name in {r["experiment"] for r in read_ledger(self.ledger)}:
            self.log(f"  {exp.name}: already in {self.ledger} (another campaign recorded it); no second line")
        else:
            append_ledger(row, self.ledger)
        state.done = True
        state.save()
        self.log(f"  {exp.name}: done, " + ", ".join(f"{k} {v:.4f}" for k, v in row["metrics"].items()))
        return "done"

    def ledger_row(self, exp: Experiment, root: Path, state: RunState) -> dict:
        import torch

        vals = _val_rows(root)
        monitor, mode = exp.selection
        scored = [r for r in vals if monitor in r]
        best = (min if mode == "min" else max)(scored, key=lambda r: r[monitor]) if scored else {}
        hw = list(dict.fromkeys(a["hardware"] for a in state.attempts))
        commits = list(dict.fromkeys(a["commit"] for a in state.attempts))
        seed = _resolved(root, "seed_everything")
        return {**exp.describe(_resolved(root, "data", "init_args") or {}), "split": "test", "metrics": _test_metrics(root),
                "best_val": {k: v for k, v in best.items() if k.startswith("val/")},
                "seed": int(SEED if seed is None else seed), "epochs": _ckpt_epochs(root),
                "best_epoch": _best_epoch(root), "stopping": stopping_rule(root),
                # the trainer's precision as the run resolved it (Lightning's default: 32-true)
                "precision": str(_resolved(root, "trainer", "precision") or "32-true"), "wall_s": round(state.wall_s, 1),
                "fit_s": round(state.wall_s, 1), "test_s": state.test_s, "attempts": len(state.attempts),
                "hardware": " + ".join(hw), "device": self.device, "torch": torch.__version__.split("+")[0],
                "commit": " + ".join(commits), "date": dt.date.today().isoformat(), "record": "run",
                "command": public_command(exp), "test_command": public_command(exp, "test")}


# -------------------------------------------------------------------------------------------------- planning
def _own_state(exp: Experiment, root: Path) -> RunState | None:
    """``exp``'s state in its run folder ``root``, or None when the folder holds a run of other arguments, which
    :meth:`Campaign.run` refuses: it is not this experiment's, neither its progress nor its epoch times."""
    state = RunState.load(root)
    return None if state.other_args(list(exp.args())) is not None else state


def _status(exp: Experiment, out: Path, done: set[str]) -> str:
    if exp.name in done:
        return "done"
    root = out / exp.name
    if _own_state(exp, root) is None:
        return "refused: its folder holds a run of other arguments"
    return "in progress" if (root / "checkpoints" / "last.ckpt").exists() else "pending"


def _overrides(name: str) -> set[str]:
    """The ``+`` parts of an experiment's name but its seed (``+s2025``): what it changes of its paper experiment."""
    return {t for t in name.split("+")[1:] if not re.fullmatch(r"s\d+", t)}


def _on(device: str, line: dict) -> bool:
    """Whether a ledger line was measured on ``device``'s kind (cpu, cuda)."""
    return str(line.get("device") or "cpu").split(":")[0] == device.split(":")[0]


def _machine(hardware_text: str) -> str:
    """The processor or GPU of a ``hardware`` text (``AMD EPYC, 2 cores, ...`` -> ``AMD EPYC``)."""
    return str(hardware_text).split(" (CUDA")[0].split(",")[0]


@functools.cache
def _this_machine(device: str) -> str:
    """This machine's processor, or its GPU for a CUDA ``device`` (``""`` where that GPU is not here: planning only)."""
    try:
        return _machine(hardware(device, 1))
    except (RuntimeError, AssertionError):  # torch without CUDA, or no GPU
        return ""


def _here(line: dict, device: str) -> bool:
    """Whether a ledger line was measured on this machine's processor (or GPU): another machine's epoch times can be
    ten times these (seen: 462 s per epoch on one CPU where this one takes 48)."""
    return _machine(line.get("hardware", "")) == _this_machine(device)


def sibling_epoch_s(exp: Experiment, out: Path, history: list[dict], device: str = "cpu") -> tuple[float, str] | None:
    """``(seconds per epoch, which run)`` of ``exp``'s closest measured relative, or None: first a run on this machine
    (a folder in ``out``, or a ledger line of this processor or GPU), then a run of the same paper experiment (the
    name before its first ``+``: the same model, data and horizon) in ``out`` or in the ledger, then a ledger run of
    the same model on the same data, task, scale and protocol (another horizon); among those the one sharing most of
    ``exp``'s overrides (seeds aside), then the slowest. Ledger lines count only from ``device``'s kind."""
    head, mine = exp.name.split("+")[0], _overrides(exp.name)
    # (this machine, same paper experiment, shared overrides, seconds per epoch, name)
    cands: list[tuple[int, int, int, float, str]] = []
    for folder in out.glob(head + "*"):
        name = folder.relative_to(out).as_posix()
        epoch = RunState.load(folder).epoch_s() if name.split("+")[0] == head and name != exp.name else None
        if epoch is not None:
            cands.append((1, 1, len(mine & _overrides(name)), epoch, name))
    me = exp.describe()
    keys = ("task", "model", "dataset", "scale", "protocol")
    for r in history:
        name = str(r.get("experiment", ""))
        wall = r.get("fit_s") or r.get("wall_s")
        if r.get("record") != "run" or not r.get("epochs") or not wall or name == exp.name or not _on(device, r):
            continue
        same = name.split("+")[0] == head
        if same or all(r.get(k) == me.get(k) for k in keys):
            cands.append((int(_here(r, device)), int(same), len(mine & _overrides(name)), wall / r["epochs"], name))
    if not cands:
        return None
    best = max(cands)
    return best[3], best[4]


def estimate_s(exp: Experiment, out: Path, history: list[dict], step_s: dict[str, dict],
               device: str = "cpu") -> tuple[float, float, str]:
    """``(seconds left to finish, seconds per epoch, where the estimate comes from)``: this run's epochs, its ledger
    line, its ``--dry-run`` smoke test, else its closest relative's epochs (:func:`sibling_epoch_s`); infinite when
    none of these exists."""
    root = out / exp.name
    state = _own_state(exp, root)
    own = state is not None  # else a folder of other arguments: this run has not started (refused until moved away)
    state = state or RunState(root / "campaign.json")
    max_epochs = int(exp.value("max_epochs", 100) or 100)
    done_epochs = _ckpt_epochs(root) if own and (root / "checkpoints" / "last.ckpt").exists() else 0
    # epochs to expect: the full recipe, or (early stopping) the best epoch of finished runs of the same task + patience
    if exp.patience is None:
        epochs = max_epochs
    else:
        bests = [r["best_epoch"] for r in history if r.get("task") == exp.task and r.get("record") == "run"
                 and (r.get("stopping") or {}).get("early_stopping", {}).get("patience") == exp.patience
                 and r.get("best_epoch") is not None]
        epochs = min(max_epochs, (round(sum(bests) / len(bests)) if bests else 5) + exp.patience + 1)
    epoch, source = state.epoch_s(), "this run's epochs"
    if epoch is None:
        same = [r for r in history if r.get("experiment") == exp.name and r.get("epochs") and _on(device, r)]
        same.sort(key=lambda r: _here(r, device))  # stable: the newest line of this machine, else the newest
        if same:
            epoch, source = same[-1]["wall_s"] / same[-1]["epochs"], "ledger"
    if epoch is None and exp.name in step_s:
        s = step_s[exp.name]
        epoch, source = s["step_s"] * s["train_batches"] * 1.15, "the CPU smoke test (+15% validation)"
    if epoch is None:
        sibling = sibling_epoch_s(exp, out, history, device)
        if sibling is not None:
            epoch, source = sibling[0], f"the epochs of {sibling[1]}"
    if epoch is None:
        return math.inf, math.inf, "unknown (run --dry-run)"
    if state.fitted:  # only the test is left
        return epoch / 2, epoch, source
    return max(epochs - done_epochs, 0) * epoch + epoch / 2, epoch, source  # + the test, about half an epoch


def can_start(left: float, epoch: float, budget_s: float) -> bool:
    """Whether an experiment may start with ``left`` seconds of a ``budget_s`` budget: one more epoch and the test
    (1.5 epochs) must fit; one whose epoch time is unknown (no measurement of it or of a relative) starts only while a
    quarter of the budget, and at least a minute, is left."""
    if left <= 0:
        return False
    return left > (max(60.0, budget_s / 4) if math.isinf(epoch) else 1.5 * epoch)


def pack(pending: list[Experiment], est: dict[str, tuple[float, float, str]], budget_s: float,
         parallel: int) -> list[list[tuple[Experiment, float]]]:
    """Greedy list scheduling in priority order: each slot takes the next pending experiment that may start
    (:func:`can_start`) in what is left of the budget; an experiment that cannot finish runs until the budget ends
    (then it is resumed by the next call), and so does one whose duration is unknown. Returns per slot
    ``[(experiment, planned seconds)]``."""
    slots = [[] for _ in range(parallel)]
    used = [0.0] * parallel
    for exp in pending:
        total, epoch, _ = est[exp.name]
        i = min(range(parallel), key=lambda j: used[j])
        left = budget_s - used[i]
        if not can_start(left, epoch, budget_s):
            continue
        run = min(total, left)
        slots[i].append((exp, run))
        used[i] += run
    return slots


def smoke_test(exp: Experiment, out: Path, threads: int, runner=run_cli) -> dict:
    """One epoch of three training steps and two validation steps of ``exp`` on the CPU (the steps after the first
    time a step): returns
    ``{"ok", "step_s", "train_batches", "seconds"}``."""
    root = out / "_smoke" / exp.name
    shutil.rmtree(root, ignore_errors=True)  # a fresh run folder (hoformer fit refuses a finished run's folder)
    root.mkdir(parents=True)
    t0 = time.time()
    argv = ["fit", *exp.args(), f"--trainer.default_root_dir={root}", "--trainer.accelerator=cpu",
            "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.max_epochs=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks+=hoformer.train.Deadline", "--trainer.callbacks.at=4102444800"]
    try:
        rc = runner(argv, root / "smoke.log", threads, time.time() + 600)
    except Exception as e:  # noqa: BLE001 - an in-process runner raises what the run raised
        rc = f"{type(e).__name__}: {e}"
    report = json.loads((root / "deadline.json").read_text()) if (root / "deadline.json").exists() else {}
    res = {"ok": rc == 0 and "step_s" in report, "seconds": round(time.time() - t0, 1)}
    if res["ok"]:
        res.update(step_s=report["step_s"], train_batches=report["train_batches"])
    else:
        log = (root / "smoke.log").read_text().strip().splitlines() if (root / "smoke.log").exists() else []
        res["error"] = (log[-1:] or [str(rc)])[0] if rc != 0 else "no timing report"
    return res


# ------------------------------------------------------------------------------------------------------ main
class CampaignError(Exception):
    """A campaign that cannot start: the message says why and what to do."""


class OutLock:
    """``<out>/.campaign.lock``: an output folder is held by one campaign at a time (an exclusive ``flock`` on the
    file while the campaign lives; the file says which process on which host holds it). A lock left by a process that
    is gone (same host) is taken over with a note; a lock file that is not a lock is refused, naming it."""

    def __init__(self, out: Path, log=print) -> None:
        self.path, self.log, self.fd = Path(out) / ".campaign.lock", log, None

    def __enter__(self) -> "OutLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        text = os.read(fd, 4096).decode(errors="replace").strip()
        held = None
        if text:
            try:
                held = json.loads(text)
                held = (int(held["pid"]), str(held["host"]), str(held.get("since", "?")))
            except (ValueError, KeyError, TypeError):
                os.close(fd)
                raise CampaignError(f"{self.path} is not a campaign lock (expected a JSON object with \"pid\" and "
                                    f"\"host\", got {text[:60]!r}); remove it if no campaign uses {self.path.parent}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            who = f"pid {held[0]} on {held[1]} since {held[2]}" if held else "another process"
            raise CampaignError(f"{self.path.parent} is held by the campaign of {who} ({self.path}); wait for it to "
                                "end, stop it, or give this one another --out") from None
        if held and held[1] != socket.gethostname():
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise CampaignError(f"{self.path} names the campaign of pid {held[0]} on host {held[1]} (since {held[2]}), "
                                "which this host cannot check; remove the file if that campaign has ended")
        if held:
            self.log(f"note: {self.path}: taking over the lock of pid {held[0]} (since {held[2]}), "
                     f"{'which is gone' if not pid_alive(held[0]) else 'which no longer holds it'}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": dt.datetime.now(
            dt.timezone.utc).isoformat(timespec="seconds")}).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


def _validate(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Every argument checked, with what was expected and what was received."""
    if a.check and not a.tables:
        ap.error("--check goes with --tables (it checks the committed tables against the ledger)")
    if not math.isfinite(a.budget_min) or a.budget_min <= 0:
        ap.error(f"--budget-min must be a finite number of minutes > 0, got {a.budget_min}")
    for opt in ("parallel", "threads"):
        if getattr(a, opt) is not None and getattr(a, opt) < 1:
            ap.error(f"--{opt} must be >= 1, got {getattr(a, opt)}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {a.device!r}")
    if not a.ledger.is_file() and not (a.new_ledger and not a.tables):
        ap.error(f"--ledger {a.ledger}: no such file" + ("" if a.tables else
                 " (a mistyped ledger would show every finished run as pending; --new-ledger starts a new one)"))


def _select(ap: argparse.ArgumentParser, plan: list[Experiment], patterns: list[str], name: str) -> list[Experiment]:
    """The experiments of ``plan`` matching one of ``patterns``; a pattern matching none is an error naming the
    closest experiment names."""
    for p in patterns:
        if not any(fnmatch.fnmatchcase(e.name, p) for e in plan):
            close = difflib.get_close_matches(p, [e.name for e in plan], n=5, cutoff=0.3)
            ap.error(f"--only {p!r} matches no experiment of the plan {name!r} ({len(plan)} experiments with their "
                     f"data present); closest: {', '.join(close) if close else 'none'} (`--status` lists them)")
    return [e for e in plan if not patterns or any(fnmatch.fnmatchcase(e.name, p) for p in patterns)]


def main(argv: list[str] | None = None, runner=None) -> int:
    """The command line; ``runner`` starts one ``hoformer`` command (default :func:`run_cli`, a process each)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--budget-min", type=float, default=9.0, help="wall-clock budget of this call, minutes")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--plan", choices=sorted(PLANS), help="priority list (default: cpu on a CPU, paper on a GPU)")
    ap.add_argument("--only", nargs="*", default=[], help="experiment names or patterns to keep from the plan")
    ap.add_argument("--parallel", type=int, help="runs at once (default: 2 on a CPU, 4 on a GPU)")
    ap.add_argument("--threads", type=int, help="threads per run (default: cores / parallel on a CPU, 4 on a GPU)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "campaign", help="run folders")
    ap.add_argument("--ledger", type=Path, default=LEDGER, help="results ledger (JSON lines, appended; must exist)")
    ap.add_argument("--new-ledger", action="store_true", help="start --ledger if it does not exist")
    ap.add_argument("--dry-run", action="store_true", help="print the plan with estimates; smoke-test each run")
    ap.add_argument("--status", action="store_true", help="print every experiment of the plan and its state")
    ap.add_argument("--tables", action="store_true", help="regenerate the ledger tables of README.md and docs/")
    ap.add_argument("--check", action="store_true", help="with --tables: fail if a committed table is stale")
    a = ap.parse_args(argv)
    _validate(ap, a)
    try:
        history = read_ledger(a.ledger) if a.ledger.is_file() else []
        if a.tables:
            changed = ledger.render_tables(ledger.doc_files(), history, write=not a.check)
            for f in changed:
                print(f"{'stale' if a.check else 'updated'}: {f.relative_to(ROOT)}")
            return 1 if a.check and changed else 0
        name = a.plan or ("paper" if a.device.startswith("cuda") else "cpu")
        plan = _select(ap, PLANS[name](), a.only, name)
        if a.status:
            done = measured(history)
            for e in plan:
                print(f"{_status(e, a.out, done):12s} {e.name}")
            return 0
        with OutLock(a.out), _forward_signals():
            rc = _campaign(a, plan, history, runner or run_cli)
        return 128 + getattr(signal, STOP.signal).value if STOP.is_set() else rc
    except (LedgerError, CampaignError) as e:
        print(f"campaign.py: error: {e}", file=sys.stderr)
        return 2


def measured(history: list[dict]) -> set[str]:
    """The experiments the ledger holds a measured line of (``record`` ``run``): a campaign runs the others,
    including those with only a transcribed line (a number copied from a document is not a run to skip)."""
    return {r["experiment"] for r in history if r.get("record", "run") == "run"}


def _campaign(a: argparse.Namespace, plan: list[Experiment], history: list[dict], runner) -> int:
    cuda = a.device.startswith("cuda")
    parallel = a.parallel or (4 if cuda else 2)
    threads = a.threads or (4 if cuda else max(1, (os.cpu_count() or 1) // parallel))
    done = measured(history)
    pending = [e for e in plan if e.name not in done]
    refused = {e.name for e in pending if _own_state(e, a.out / e.name) is None}  # Campaign.run would refuse them
    pending = [e for e in pending if e.name not in refused]
    budget_s = a.budget_min * 60
    t_start = time.time()

    step_s: dict[str, dict] = {}
    if a.dry_run:  # smoke-test what could be planned (at most 2 x parallel runs deep), then plan with its timings
        for e in pending[: 2 * parallel]:
            r = smoke_test(e, a.out, threads, runner)
            step_s[e.name] = r
            print(f"smoke test {e.name}: " + (f"ok, {r['step_s'] * 1000:.0f} ms/step on the CPU, "
                                              f"{r['train_batches']} steps/epoch ({r['seconds']} s)"
                                              if r["ok"] else f"FAILED {r['error']}"))
        failed = [k for k, v in step_s.items() if not v["ok"]]
        step_s = {k: v for k, v in step_s.items() if v["ok"]}
    est = {e.name: estimate_s(e, a.out, history, step_s, a.device) for e in pending}
    if cuda:  # a CPU step time says nothing of a GPU's: plan in priority order, report the CPU figure as a bound
        est = {k: (math.inf, math.inf, f"unknown on the GPU; {v[1] / 60:.1f} min per epoch on this CPU")
               if "CPU smoke test" in v[2] else v for k, v in est.items()}
    slots = pack(pending, est, budget_s, parallel)
    print(f"plan: {len(plan)} experiments, {len(done & {e.name for e in plan})} done, {len(pending)} pending; "
          f"budget {a.budget_min:g} min on {a.device}, {parallel} at once, {threads} thread(s) each"
          + (f"; {len(refused)} refused" if refused else ""))
    for name in sorted(refused):
        print(f"  refused: {name}: {a.out / name} holds a run of other arguments; move that folder away to run it")
    for i, slot in enumerate(slots):
        for e, run in slot:
            total, epoch, src = est[e.name]
            if math.isinf(total):
                print(f"  slot {i}: {e.name}: the rest of the budget, duration unknown ({src})")
                continue
            state = "finishes" if run >= total else "paused at the deadline (resumable)"
            print(f"  slot {i}: {e.name}: {run / 60:.1f} min planned, {total / 60:.1f} min to finish "
                  f"({epoch:.0f} s/epoch from {src}): {state}")
    planned = {e.name for slot in slots for e, _ in slot}
    for e in [e for e in pending if e.name not in planned][:5]:
        total, epoch, src = est[e.name]
        print(f"  waits: {e.name}: " + (f"{epoch / 60:.1f} min per epoch ({src}), {total / 60:.1f} min to finish"
                                         if not math.isinf(epoch) else src))
    if a.dry_run:
        return 1 if failed else 0

    deadline = t_start + budget_s
    camp = Campaign(a.out, a.ledger, a.device, threads, deadline, runner=runner)
    queue = list(pending)
    results: dict[str, str] = {}
    qlock = threading.Lock()

    def worker() -> None:
        while not STOP.is_set():
            with qlock:
                left = deadline - time.time()
                nxt = None
                for e in queue:  # the plan's estimates (est): the same rule as pack(), now with the real time left
                    if math.isinf(est[e.name][1]):  # a relative may have run since the plan was made
                        est[e.name] = estimate_s(e, a.out, history, step_s, a.device)
                    if can_start(left, est[e.name][1], budget_s):
                        nxt = e
                        break
                if nxt is None:
                    return
                queue.remove(nxt)
            print(f"start {nxt.name} ({(deadline - time.time()) / 60:.1f} min left)", flush=True)
            epoch = est[nxt.name][1]
            try:
                results[nxt.name] = camp.run(nxt, test_reserve=0 if math.isinf(epoch) else epoch / 2)
            except Exception as e:  # noqa: BLE001 - one run's error (a bad log, a ledger refusing its line) ends it
                print(f"  {nxt.name}: failed: {type(e).__name__}: {e}", flush=True)
                results[nxt.name] = "failed"

    threads_ = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads_:
        t.start()
    for t in threads_:
        while t.is_alive():  # a timed join: the main thread keeps handling signals
            t.join(0.2)
    print(f"summary ({(time.time() - t_start) / 60:.1f} min): " +
          ", ".join(f"{k} {sum(v == k for v in results.values())}" for k in ("done", "paused", "interrupted", "failed")))
    for name, res in results.items():
        print(f"  {res:11s} {name}")
    return 1 if "failed" in results.values() else 0


@contextlib.contextmanager
def _forward_signals():
    """While the campaign runs, SIGTERM and SIGINT set :data:`STOP`: :func:`run_cli` passes SIGTERM on to the running
    ``hoformer`` process (which ends its batch and exits, its last complete epoch's checkpoint kept), nothing new
    starts, and ``main`` returns 128 + the signal's number once every run has stopped and been recorded."""
    def on_signal(signum, frame) -> None:
        STOP.signal = signal.Signals(signum).name
        STOP.set()
        print(f"campaign: {STOP.signal}: stopping the running fits at their next batch (their last epoch is kept) "
              "and starting nothing new", flush=True)

    STOP.clear()
    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
