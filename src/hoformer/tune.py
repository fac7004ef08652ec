"""``hoformer tune``: a hyper-parameter search of one experiment with Optuna (``pip install 'hoformer[tune]'``).

    hoformer tune --config configs/hot/ltsf/etth1_96_96_hot_product.yaml --space configs/tune/hot_table6.yaml \\
        --trials 12 --patience 3 --max-epochs 20 --storage sqlite:///runs/tune/etth1_hot_product.db \\
        --export-best configs/hot/tuned/etth1_96_96_hot_product.yaml [-- --data.init_args.num_workers=0 ...]

* **Trials** are ``hoformer fit`` runs of the experiment (``--config`` plus the overrides after ``--``) with the
  trial's values as further overrides, one after the other in this process, each in its own run folder
  ``<--out>/<study>/trial_NNN``. The objective is the experiment's model-selection metric (the task's
  ``selection``: ``val/mae`` for a forecaster under the TSLib protocol, ``val/mae_mean`` under the HOT protocol,
  ``val/auc`` for a volume classifier, ...) at its best epoch; ``--patience`` stops a trial early on it,
  ``--max-epochs`` caps it.
* **Pruning**: optuna-integration's ``PyTorchLightningPruningCallback`` reports the metric after every validation;
  the pruner (``--pruner median``: Optuna's ``MedianPruner``; ``halving``: ``SuccessiveHalvingPruner``) stops a trial
  whose metric is worse than the median of the earlier trials at the same epoch.
* **Search space**: a YAML file (``--space``, several are merged) mapping an override key to its values (the HOT
  paper's Table 6: ``configs/tune/hot_table6.yaml``; :func:`read_space`). A configuration that a finished trial
  already has is not trained again: in a finite space TPE draws the best values again once it has seen them, and a
  second fit would only reproduce their number; such a draw is told failed (``duplicate_of``) and a configuration
  no finished trial has is tried instead (the call stops once every configuration has been tried).
* **Storage**: the study lives in a database (``--storage``: any SQLAlchemy URL; default
  ``sqlite:///<--out>/<study>.db``), so calling the command again continues the study (trial numbers go on), and
  several processes or machines can work on one study. A trial whose process died (its ``pid`` on this host is gone)
  is marked failed and its values are tried again first.
* **Ledger**: every finished trial (complete or pruned) is one line of ``--ledger`` (``record: tune``, the study, the
  trial number, its values, its state and its ``hoformer fit`` command; :mod:`hoformer.results`).
* ``--from-ledger``: a study whose database is gone (a fresh machine, a deleted file) is rebuilt from the ledger's
  lines of it before the search goes on: each recorded trial (complete or pruned, its values and its per-epoch
  validation curve) is added under its own number, a number the ledger lacks (a failed trial) as a failed trial, so
  the numbering, the sampler's history and the pruner's medians continue where the lost database stopped.
* ``--export-best FILE.yaml`` writes the best trial's values as a config that composes with the experiment's
  (``hoformer fit --config EXPERIMENT.yaml --config FILE.yaml``).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import shlex
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hoformer._io import pid_alive

__all__ = ["read_space", "space_distributions", "tune_main", "export_best", "nested_overrides",
           "rebuild_from_ledger"]

PRUNERS = ("median", "halving", "none")


# ----------------------------------------------------------------------------------------------- search space
def read_space(paths) -> dict[str, dict]:
    """The search space of the YAML files ``paths`` (merged in order; a later key replaces an earlier one)::

        model.model.init_args.dropout: {choices: [0.0, 0.1, 0.2, 0.3]}
        model.model.init_args.num_heads: {choices: [1, 2, 4, 8, 16, 32], divides: model.model.init_args.dim}
        model.init_args.optim.lr: {low: 1.0e-4, high: 1.0e-3, log: true}

    Each key is a ``hoformer fit`` override (``--KEY=VALUE``); its value either lists ``choices`` (numbers, strings
    or bools; ``divides: OTHER_KEY`` keeps the choices that divide the experiment's value of ``OTHER_KEY``) or gives
    a range ``low`` / ``high`` (floats, ``log: true`` for a log scale; ints give an integer range). A file that does
    not parse, or an entry of another form, raises a ``ValueError`` naming the file and the key."""
    import yaml

    out: dict[str, dict] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"hoformer tune: search space {str(path)!r} cannot be read ({e.strerror})") from None
        except yaml.YAMLError as e:
            raise ValueError(f"hoformer tune: search space {str(path)!r} is not valid YAML: "
                             f"{str(e).splitlines()[0]}") from None
        if not isinstance(data, dict) or not data:
            raise ValueError(f"hoformer tune: search space {str(path)!r} must map override keys to their values "
                             f"(e.g. 'model.model.init_args.dropout: {{choices: [0.0, 0.1]}}'), got {data!r}")
        for key, spec in data.items():
            where = f"search space {str(path)!r}, key {key!r}"
            if not isinstance(key, str) or key.startswith("-") or "=" in key:
                raise ValueError(f"hoformer tune: {where}: a key is an override key without dashes, such as "
                                 "'model.model.init_args.dropout'")
            if not isinstance(spec, dict):
                raise ValueError(f"hoformer tune: {where}: expected {{choices: [...]}} or {{low: .., high: ..}}, got "
                                 f"{spec!r}")
            if "choices" in spec:
                ch = spec["choices"]
                if not isinstance(ch, list) or not ch or not all(isinstance(c, (int, float, str, bool)) for c in ch):
                    raise ValueError(f"hoformer tune: {where}: `choices` must be a non-empty list of numbers, strings "
                                     f"or bools, got {ch!r}")
                if set(spec) - {"choices", "divides"}:
                    raise ValueError(f"hoformer tune: {where}: unknown fields {sorted(set(spec) - {'choices', 'divides'})}")
            elif {"low", "high"} <= set(spec):
                lo, hi = spec["low"], spec["high"]
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)) or not lo < hi:
                    raise ValueError(f"hoformer tune: {where}: needs numbers low < high, got low={lo!r}, high={hi!r}")
                if spec.get("log") and lo <= 0:
                    raise ValueError(f"hoformer tune: {where}: a log range needs low > 0, got {lo!r}")
                if set(spec) - {"low", "high", "log"}:
                    raise ValueError(f"hoformer tune: {where}: unknown fields {sorted(set(spec) - {'low', 'high', 'log'})}")
            else:
                raise ValueError(f"hoformer tune: {where}: expected {{choices: [...]}} or {{low: .., high: ..}}, got "
                                 f"{spec!r}")
            out[key] = spec
    return out


_MISSING = object()


def _lookup(cfg: dict, key: str, default=None):
    """The value at the dotted ``key`` of a resolved config, ``default`` where it has no such key."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def space_distributions(space: dict[str, dict], cfg: dict) -> dict[str, Any]:
    """Optuna distributions of ``space`` (:func:`read_space`) for the experiment's resolved config ``cfg``: ``divides``
    filters the choices by the experiment's value (a key the experiment does not have is an error)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dists = {}
    for key, spec in space.items():
        if not _has_path(cfg, key):
            raise ValueError(f"hoformer tune: the search space's key {key!r} is not an argument of the experiment "
                             "(see `hoformer fit --config ... --print_config`)")
        if "choices" in spec:
            choices = list(spec["choices"])
            if "divides" in spec:
                total = _lookup(cfg, spec["divides"])
                if not isinstance(total, int):
                    raise ValueError(f"hoformer tune: {key}: `divides: {spec['divides']}` is not an integer argument "
                                     f"of the experiment (got {total!r})")
                choices = [c for c in choices if isinstance(c, int) and c > 0 and total % c == 0]
                if not choices:
                    raise ValueError(f"hoformer tune: {key}: none of {spec['choices']} divides "
                                     f"{spec['divides']}={total}")
            dists[key] = CategoricalDistribution(choices)
        elif all(isinstance(spec[k], int) for k in ("low", "high")) and not spec.get("log"):
            dists[key] = IntDistribution(spec["low"], spec["high"])
        else:
            dists[key] = FloatDistribution(float(spec["low"]), float(spec["high"]), log=bool(spec.get("log")))
    return dists


def _has_path(cfg: dict, key: str) -> bool:
    return _lookup(cfg, key, _MISSING) is not _MISSING


def _yaml_value(v) -> str:
    """An override's value as the command line writes it (bools lower-case, like YAML)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def nested_overrides(params: dict[str, Any]) -> dict:
    """``{"a.b.c": 1}`` -> ``{"a": {"b": {"c": 1}}}``: override keys as a config file's nesting."""
    out: dict = {}
    for key, value in params.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


# ------------------------------------------------------------------------------------------------------ study
def _pruner(name: str, warmup: int):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=warmup)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def _recover_dead_trials(study, log) -> None:
    """Trials left RUNNING by a process of this host that is gone: marked failed, their values enqueued again."""
    import optuna

    host = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        pid, where = t.user_attrs.get("pid"), t.user_attrs.get("host")
        if where == host and isinstance(pid, int) and not pid_alive(pid):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
            log(f"trial {t.number}: its process ({pid}) is gone; marked failed, its values will be tried again")


def _finite_values(dist) -> list | None:
    """The values of a distribution with finitely many (categorical or stepped integer), else None."""
    if hasattr(dist, "choices"):
        return list(dist.choices)
    if isinstance(getattr(dist, "step", None), int) and not getattr(dist, "log", False):
        return list(range(dist.low, dist.high + 1, dist.step))
    return None


def _ask_unseen(study, dists: dict, seed: int):
    """``study.ask(dists)``, except that a configuration a finished (complete or pruned) trial already has is not
    trained again: a finite space's sampler can draw the best values again once it has seen them (TPE does), and a
    second fit of them only reproduces the first's number at the cost of a whole fit. Such a draw is told failed
    (user attribute ``duplicate_of``; no ledger line, as for any failed trial) and a configuration no finished trial
    has, drawn at random (seeded by ``seed`` and the trial number), is asked instead. None when the space is finite
    and every configuration has been tried."""
    import random

    import optuna

    def key(params: dict) -> str:
        return json.dumps(params, sort_keys=True)

    finished = {}  # a configuration -> the first finished trial that has it
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                      optuna.trial.TrialState.PRUNED)):
        finished.setdefault(key(t.params), t.number)
    trial = study.ask(dists)
    dup = finished.get(key(trial.params))
    if dup is None:
        return trial
    trial.set_user_attr("duplicate_of", dup)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    values = {k: _finite_values(d) for k, d in dists.items()}
    if any(v is None for v in values.values()):  # a continuous dimension: a second draw differs almost surely
        return study.ask(dists)
    rng = random.Random(seed + trial.number)
    if math.prod(len(v) for v in values.values()) <= 100_000:
        unseen = [c for c in (dict(zip(values, combo)) for combo in itertools.product(*values.values()))
                  if key(c) not in finished]
    else:  # too many to list: random configurations, almost all unseen
        unseen = [c for c in ({k: rng.choice(v) for k, v in values.items()} for _ in range(1000))
                  if key(c) not in finished]
    if not unseen:
        return None
    fresh = rng.choice(unseen)
    print(f"trial {trial.number}: the sampler drew trial {dup}'s values again; not trained (told failed), a "
          "configuration no trial has finished is tried instead", flush=True)
    study.enqueue_trial(fresh, user_attrs={"replaces_duplicate": trial.number}, skip_if_exists=False)
    return study.ask(dists)


def _in_space(dist, value) -> bool:
    """Whether ``value`` is one of an Optuna distribution's values (a choice, or within its bounds)."""
    if hasattr(dist, "choices"):
        return value in dist.choices
    return dist.low <= value <= dist.high


def rebuild_from_ledger(study, ledger: str | Path, dists: dict, monitor: str, log=print) -> int:
    """Add to ``study`` the trials of the ledger's lines of it (``record: tune``, its name) that its database lacks:
    each under its own number with its values, state, objective value and per-epoch curve (``curve``; the pruner's
    medians), a number missing from the ledger as a failed trial. Returns how many were added. A line recorded on
    another objective, or with a value outside today's search space, is an error naming the trial."""
    from optuna.trial import TrialState, create_trial

    from hoformer.results import read_ledger

    if str(ledger) == "none":
        raise ValueError("needs a ledger (--ledger FILE), got 'none'")
    lines = {r["trial"]: r for r in read_ledger(ledger)
             if r.get("record") == "tune" and r.get("study") == study.study_name}
    have = len(study.get_trials(deepcopy=False))
    todo = [n for n in sorted(lines) if n >= have]
    if not todo:
        if lines:
            log(f"--from-ledger: the study's database already holds the ledger's {len(lines)} trial(s) of it")
        else:
            log(f"--from-ledger: {ledger} holds no trial of the study {study.study_name!r}")
        return 0
    added = 0
    for n in range(have, todo[-1] + 1):
        r = lines.get(n)
        if r is None:
            study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"rebuilt_from": str(ledger)}))
            continue
        if r.get("objective") != monitor:
            raise ValueError(f"trial {n} of {ledger} was scored on {r.get('objective')!r}, this study on {monitor!r}")
        params = r["params"]
        if set(params) != set(dists) or any(not _in_space(dists[k], v) for k, v in params.items()):
            raise ValueError(f"trial {n} of {ledger} has values {params} outside the search space "
                             f"({', '.join(dists)})")
        curve = {e: v for e, v in enumerate(r.get("curve") or [])}
        value = r["metrics"].get(monitor)
        state = TrialState.COMPLETE if r["state"] == "complete" else TrialState.PRUNED
        if state == TrialState.PRUNED:  # as Optuna records a pruned trial: its last reported value
            value = curve[max(curve)] if curve else None
        study.add_trial(create_trial(state=state, value=value,
                                     params=params, distributions=dists, intermediate_values=curve,
                                     user_attrs={"rebuilt_from": str(ledger)}))
        added += 1
    log(f"--from-ledger: {added} trial(s) of {ledger} added to the study (numbers {have}-{todo[-1]})")
    return added


def _pruning_callback(trial, monitor: str):
    """optuna-integration's Lightning pruning callback for ``trial`` on ``monitor``."""
    from optuna_integration import PyTorchLightningPruningCallback

    return PyTorchLightningPruningCallback(trial, monitor=monitor)


class _TrialOutput:
    """Everything a trial's fit prints goes to its ``fit.log`` (stdout, stderr and the Lightning loggers)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):
        import logging

        self._f = self.file = self.path.open("a", encoding="utf-8")
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(self._f))
        self._stack.enter_context(contextlib.redirect_stderr(self._f))
        self._handlers = []
        for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
            for h in logging.getLogger(name).handlers:
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    self._handlers.append((h, h.stream))  # assigned, not setStream: that flushes the old stream
                    h.stream = self._f
        return self

    def __exit__(self, *exc):
        import logging

        for h, old in self._handlers:
            h.stream = old
        self._stack.close()
        for name in ("lightning.pytorch", "lightning.fabric", "lightning"):  # handlers made during the trial
            for h in logging.getLogger(name).handlers:
                if isinstance(h, logging.StreamHandler) and h.stream is self._f:
                    h.stream = sys.stderr
        self._f.close()
        return False


def _best_epoch_metrics(root: Path, monitor: str, mode: str) -> tuple[dict, int | None, int, list[float]]:
    """``(validation metrics of the best epoch, that epoch, epochs run, the monitor per epoch)`` from the trial's
    CSV log."""
    import csv

    rows = []
    for path in sorted((root / "logs").glob("version_*/metrics.csv")):
        with path.open() as f:
            rows += [r for r in csv.DictReader(f) if r.get(monitor)]
    if not rows:
        return {}, None, 0, []
    pick = min if mode == "min" else max
    best = pick(rows, key=lambda r: float(r[monitor]))
    vals = {k: float(v) for k, v in best.items() if k.startswith("val/") and v}
    epochs = max(int(float(r["epoch"])) for r in rows) + 1
    curve = {int(float(r["epoch"])): float(r[monitor]) for r in rows}
    return vals, int(float(best["epoch"])), epochs, [curve[e] for e in sorted(curve)]


def _describe(cfg: dict) -> dict:
    """The ledger's identification fields of an experiment's resolved config."""
    task = cfg["model"]["class_path"].rsplit(".", 1)[-1]
    model = cfg["model"]["init_args"]["model"]
    margs, data = model.get("init_args", {}), cfg["data"].get("init_args", {})
    family = {"ForecastingTask": "forecasting", "ClassificationTask": "classification",
              "SegmentationTask": "segmentation", "TrafficTask": "traffic"}.get(task, "text" if "Text" in task else
                                                                              task)
    d = {"task": family, "model": margs.get("attention") or model["class_path"].rsplit(".", 1)[-1],
         "dataset": "synthetic" if data.get("synthetic") else (data.get("name") or data.get("flag") or
                                                               data.get("dataset"))}
    if family == "forecasting":
        d.update(lookback=data.get("seq_len"), horizon=data.get("pred_len"),
                 protocol=cfg["model"]["init_args"].get("protocol", "tslib"))
    return d


# -------------------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hoformer tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--config", required=True, action="append", help="the experiment's config (several: composed "
                   "in order, as `hoformer fit --config`)")
    p.add_argument("--space", required=True, action="append", help="search space YAML (several: merged)")
    p.add_argument("--study", help="study name (default: the last config's file name)")
    p.add_argument("--storage", help="SQLAlchemy URL of the study's database (default sqlite:///<out>/<study>.db)")
    p.add_argument("--out", default="runs/tune", help="folder of the trials' run folders (default runs/tune)")
    p.add_argument("--trials", type=int, default=10, help="trials to run in this call (default 10; 0: none, e.g. "
                   "with --export-best)")
    p.add_argument("--timeout-min", type=float, help="start no new trial after this many minutes")
    p.add_argument("--pruner", choices=PRUNERS, default="median",
                   help="median (MedianPruner: 3 startup trials), halving (SuccessiveHalvingPruner) or none")
    p.add_argument("--warmup-epochs", type=int, default=1, help="MedianPruner: epochs before a trial can be pruned")
    p.add_argument("--patience", type=int, help="stop a trial early after this many epochs without improvement")
    p.add_argument("--max-epochs", type=int, help="cap on a trial's epochs (default: the experiment's)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (TPE; default 0)")
    p.add_argument("--threads", type=int, help="CPU threads of PyTorch (default: PyTorch's own)")
    p.add_argument("--ledger", default="results/ledger.jsonl",
                   help="results ledger the finished trials are appended to (default results/ledger.jsonl; "
                        "'none': not recorded)")
    p.add_argument("--from-ledger", action="store_true", help="rebuild the trials the study's database lacks from "
                   "the ledger's lines of the study (a database lost with its machine)")
    p.add_argument("--export-best", metavar="FILE.yaml", help="write the best trial's values as a config file")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="after `--`: `hoformer fit` overrides of the experiment")
    return p


def _check_args(p: argparse.ArgumentParser, a) -> None:
    if a.trials < 0:
        p.error(f"--trials must be >= 0, got {a.trials}")
    if a.timeout_min is not None and not (math.isfinite(a.timeout_min) and a.timeout_min > 0):
        p.error(f"--timeout-min must be a finite number > 0, got {a.timeout_min}")
    for name in ("patience", "max_epochs", "threads"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if a.warmup_epochs < 0:
        p.error(f"--warmup-epochs must be >= 0, got {a.warmup_epochs}")
    for c in a.config:
        if not Path(c).is_file():
            p.error(f"--config {c!r}: no such file")
    for s in a.space:
        if not Path(s).is_file():
            p.error(f"--space {s!r}: no such file")
    if a.overrides and a.overrides[0] == "--":
        a.overrides = a.overrides[1:]
    bad = [o for o in a.overrides if not o.startswith("--")]
    if bad:
        p.error(f"the experiment's overrides go after `--` as --key=value; got {bad[0]!r}")


def tune_main(argv: list[str]) -> int:
    """Entry point of ``hoformer tune`` (see the module doc)."""
    p = _parser()
    a = p.parse_args(argv)
    _check_args(p, a)
    try:
        import optuna
        import optuna_integration  # noqa: F401
    except ImportError as e:
        print(f"hoformer tune: needs Optuna and optuna-integration (pip install 'hoformer[tune]'): {e}", file=sys.stderr)
        return 2
    from hoformer.config import resolve_config

    study_name = a.study or Path(a.config[-1]).stem
    out = Path(a.out)
    storage_url = a.storage or f"sqlite:///{out / (study_name + '.db')}"
    base = [x for c in a.config for x in ("--config", c)] + list(a.overrides)
    try:
        space = read_space(a.space)
        cfg = resolve_config(a.config[0], [*base[2:]])
        dists = space_distributions(space, cfg)
    except (ValueError, FileNotFoundError) as e:
        print(str(e) if str(e).startswith("hoformer tune") else f"hoformer tune: {e}", file=sys.stderr)
        return 2
    from hoformer.lightning_cli import HoformerCLI  # noqa: F401  (imports the tasks)
    import importlib

    mod, _, cls = cfg["model"]["class_path"].rpartition(".")
    task_cls = getattr(importlib.import_module(mod), cls)
    protocol = cfg["model"]["init_args"].get("protocol")
    monitor, mode = ("val/mae_mean", "min") if protocol == "hot" else getattr(task_cls, "selection", (None, "min"))
    if monitor is None:
        print(f"hoformer tune: {cfg['model']['class_path']} has no model-selection metric to tune on", file=sys.stderr)
        return 2
    if "select_on" in cfg["model"]["init_args"]:  # a classifier's chosen metric
        monitor = cfg["model"]["init_args"]["select_on"]
    if storage_url.startswith("sqlite:///"):
        Path(storage_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(storage_url)
    study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True,
                                direction="minimize" if mode == "min" else "maximize",
                                pruner=_pruner(a.pruner, a.warmup_epochs))
    _recover_dead_trials(study, print)
    if a.from_ledger:
        try:
            rebuild_from_ledger(study, a.ledger, dists, monitor, print)
        except (ValueError, FileNotFoundError) as e:
            print(f"hoformer tune: --from-ledger: {e}", file=sys.stderr)
            return 2
    # a resumed study's sampler continues from another seed, so it does not draw the first call's values again
    study.sampler = optuna.samplers.TPESampler(seed=a.seed + len(study.get_trials(deepcopy=False)))
    done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED)))
    print(f"hoformer tune: study {study_name!r} ({storage_url}), {done} finished trial(s); objective {monitor} "
          f"({'lower' if mode == 'min' else 'higher'} is better), pruner {a.pruner}; space: " +
          ", ".join(f"{k.split('.')[-1]} {list(d.choices) if hasattr(d, 'choices') else (d.low, d.high)}"
                    for k, d in dists.items()), flush=True)
    t_start = time.time()
    rc = 0
    for i in range(a.trials):
        if a.timeout_min is not None and time.time() - t_start > a.timeout_min * 60:
            print(f"hoformer tune: --timeout-min {a.timeout_min:g} reached; {i} trial(s) run", flush=True)
            break
        trial = _ask_unseen(study, dists, a.seed)
        if trial is None:
            print(f"hoformer tune: every configuration of the space has been tried; {i} trial(s) run", flush=True)
            break
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("host", socket.gethostname())
        try:
            state = _run_trial(a, study, trial, base, cfg, monitor, mode, storage_url, out / study_name, i)
        except KeyboardInterrupt:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params, skip_if_exists=False)
            print(f"trial {trial.number}: interrupted; marked failed, its values will be tried again", flush=True)
            return 130
        if state == "failed":
            rc = 1
    if a.export_best:
        try:
            export_best(study, a.export_best, a.config, monitor, a.overrides)
        except ValueError as e:
            print(f"hoformer tune: {e}", file=sys.stderr)
            return 2
        print(f"best values written to {a.export_best}")
    return rc


def _run_trial(a, study, trial, base: list[str], cfg: dict, monitor: str, mode: str, storage_url: str,
               folder: Path, i: int) -> str:
    """One trial: fit, tell the study, append the ledger line, print its line. Returns its state."""
    import optuna
    import torch

    from hoformer.lightning_cli import HoformerCLI
    from hoformer.config import expand_configs

    root = folder / f"trial_{trial.number:03d}"
    overrides = [f"--{k}={_yaml_value(v)}" for k, v in trial.params.items()]
    stop = []
    if a.max_epochs is not None:
        stop.append(f"--trainer.max_epochs={a.max_epochs}")
    if a.patience is not None:
        stop += ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
                 f"--trainer.callbacks.monitor={monitor}", f"--trainer.callbacks.patience={a.patience}",
                 f"--trainer.callbacks.mode={mode}"]
    fit_args = [*base, *overrides, *stop, f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false"]
    command = "hoformer fit " + " ".join(shlex.quote(x) for x in fit_args)
    values = " ".join(f"{k.split('.')[-1]}={_yaml_value(v)}" for k, v in trial.params.items())
    print(f"trial {trial.number} ({i + 1}/{a.trials}): {values} ...", flush=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    root.mkdir(parents=True, exist_ok=True)
    pruner = _pruning_callback(trial, monitor)
    t0 = time.time()
    state, error = "complete", None
    argv0 = sys.argv
    try:
        sys.argv = [argv0[0]]  # the trial's arguments are LightningCLI's `args`, not this command's
        with _TrialOutput(root / "fit.log") as log:
            try:
                HoformerCLI(args=expand_configs(["fit", *fit_args]), trainer_defaults={"callbacks": [pruner]})
            except optuna.TrialPruned:
                state = "pruned"
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - a failed trial is recorded and the search goes on
                traceback.print_exc(file=log.file)
                state, error = "failed", f"{_reason(e)} (see {root / 'fit.log'})"
    finally:
        sys.argv = argv0
    wall = time.time() - t0
    vals, best_epoch, epochs, curve = _best_epoch_metrics(root, monitor, mode)
    value = vals.get(monitor)
    if state != "failed" and value is None:
        state, error = "failed", f"no {monitor} was logged (see {root / 'fit.log'})"
    if state == "complete":
        study.tell(trial, value)
    elif state == "pruned":
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    try:
        best = study.best_trial
        best_txt = f"best {best.value:.4f} (trial {best.number})"
    except ValueError:
        best_txt = "no complete trial yet"
    what = {"complete": f"{monitor} {value:.4f} at epoch {best_epoch}" if value is not None else "",
            "pruned": f"pruned after epoch {epochs - 1} ({monitor} {value:.4f} at its best)" if value is not None
            else "pruned", "failed": f"FAILED: {error}"}[state]
    print(f"trial {trial.number}: {what}, {epochs} epoch(s), {wall:.0f} s; {best_txt}", flush=True)
    if state != "failed" and a.ledger != "none":
        _append_trial(a, study, trial, cfg, state, vals, best_epoch, epochs, wall, monitor, mode, command,
                      curve)
    return state


def _reason(e: BaseException) -> str:
    """One line of why a trial failed: the first of jsonargparse's ``Errors:`` list, else the message's last line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if "Errors:" in lines and lines.index("Errors:") + 1 < len(lines):
        return lines[lines.index("Errors:") + 1].lstrip("- ")[:300]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def _append_trial(a, study, trial, cfg, state, vals, best_epoch, epochs, wall, monitor, mode, command,
                  curve) -> None:
    import torch

    from hoformer.results import append_ledger, provenance

    stopping: dict[str, Any] = {"max_epochs": a.max_epochs or cfg["trainer"].get("max_epochs")}
    if a.patience is not None:
        stopping["early_stopping"] = {"monitor": monitor, "mode": mode, "patience": a.patience}
    stopping["pruner"] = a.pruner
    row = {"experiment": f"tune/{study.study_name}/trial_{trial.number:03d}", **_describe(cfg), "split": "val",
           "metrics": vals, "params": dict(trial.params), "study": study.study_name, "trial": trial.number,
           "state": state, "objective": monitor, "seed": cfg.get("seed_everything"), "epochs": epochs,
           "best_epoch": best_epoch, "curve": curve, "stopping": stopping, "wall_s": round(wall, 1),
           **provenance("cpu" if not torch.cuda.is_available() else "cuda", torch.get_num_threads(), command, "tune"),
           "scale": "paper" if "ltsf_cpu" not in " ".join(a.config) else "cpu"}
    append_ledger(row, a.ledger)


def export_best(study, path, configs, monitor: str, overrides=()) -> Path:
    """Write ``study``'s best trial's values as a YAML config (its nesting: the override keys) to ``path``, with a
    header naming the study, the trial, its value and the experiment (configs and overrides) it composes with."""
    import yaml

    try:
        best = study.best_trial
    except ValueError:
        raise ValueError(f"study {study.study_name!r} has no complete trial: nothing to export") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [f"# The best trial of the hoformer tune study {study.study_name!r}: trial {best.number}, {monitor} "
              f"{best.value:.6g} ({dt.date.today().isoformat()}).",
              "# Compose it with the experiment: hoformer fit " + " ".join(
                  [*(f"--config {c}" for c in configs), *map(shlex.quote, overrides), f"--config {path.as_posix()}"])]
    body = yaml.safe_dump(nested_overrides(dict(best.params)), sort_keys=True, default_flow_style=False)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(header) + "\n" + body, encoding="utf-8")
    os.replace(tmp, path)
    return path
