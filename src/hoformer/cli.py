"""The ``hoformer`` console script.

``hoformer fit|validate|test|predict --config configs/....yaml [--print_config] [--section.key=value ...]`` is a
:class:`lightning.pytorch.cli.LightningCLI` in subclass mode for both the model (any
:class:`hoformer.train.TaskModule`) and the data (any ``LightningDataModule``); callbacks (best-validation
checkpoint, early stopping, ``save_pretrained`` export) and loggers are configured in the YAML files under
``configs/``. Checkpoints are written atomically (:class:`hoformer.train.checkpoint_io.AtomicCheckpointIO`, set by the
configs and, when a config does not, by the CLI itself).

Extra sub-commands are plain functions ``fn(argv) -> exit code``: ``hoformer demo`` is registered here with
:func:`register_command`; ``hoformer analyze``, ``bench``, ``export`` and ``forecast`` are ``"module:function"``
entries of :data:`HOOKS`, imported only when run (the other commands do not pay for their imports). A registered
command of the same name takes precedence over a hook::

    from hoformer.cli import register_command

    @register_command("my-report", help="summarise a checkpoint")
    def my_report(argv: list[str]) -> int: ...

``hoformer export --checkpoint CKPT_OR_PRETRAINED_DIR --format onnx|pt2 --output FILE`` writes a deployable file
(:mod:`hoformer.export`).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["main", "register_command", "COMMANDS", "HoformerCLI", "demo"]

#: name -> (function(argv) -> exit code, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {}
#: reserved sub-commands implemented in other modules: name -> ("module:function", one-line help); the module is
#: imported only when the command runs, so ``hoformer --help`` stays fast
HOOKS: dict[str, tuple[str, str]] = {
    "analyze": ("hoformer.analysis.analyze:analyze_main",
                "figures of a checkpoint on a data split: attention maps, stable ranks, forecast"),
    "bench": ("hoformer.analysis.bench:bench_main", "attention / model scaling benchmark: time, memory, FLOPs"),
    "export": ("hoformer.export:export_main", "export a checkpoint as a torch.export program (.pt2) or ONNX file"),
    "forecast": ("hoformer.inference:forecast_main",
                 "forecast the steps after the end of a series with a trained forecaster (CSV out)"),
    "tune": ("hoformer.tune:tune_main", "hyper-parameter search of an experiment with Optuna (pruned, resumable)"),
}
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def register_command(name: str, help: str = ""):
    """Decorator registering ``fn(argv: list[str]) -> int`` as ``hoformer <name>``."""

    def deco(fn: Callable[[list[str]], int]):
        if name in LIGHTNING_COMMANDS:
            raise ValueError(f"register_command: {name!r} is a LightningCLI sub-command")
        COMMANDS[name] = (fn, help)
        return fn

    return deco


def _fix_class_help(text: str, key: str) -> str:
    """jsonargparse prints the help of a nested ``--a.b.help CLASS`` with the options as ``--b.x`` (and the header
    as ``--b.help``): spell them as they are given, ``--a.b.x``."""
    import re

    m = re.search(r"Help for --([\w.]+)\.help=", text)
    if m is None or m.group(1) == key:
        return text
    return re.sub(rf"--{re.escape(m.group(1))}\.(?=\w)", f"--{key}.", text)


def _class_help_key(argv: list[str]) -> str | None:
    """``K`` of a ``--K.help CLASS`` argument (the help of a class argument), if any."""
    import re

    for a in argv:
        m = re.fullmatch(r"--([\w.]+)\.help(=.*)?", a)
        if m:
            return m.group(1)
    return None


def __getattr__(name: str):  # lazy: importing hoformer.cli must not import lightning
    if name == "HoformerCLI":
        from hoformer.lightning_cli import HoformerCLI

        return HoformerCLI
    raise AttributeError(name)


def _usage() -> str:
    lines = ["usage: hoformer {fit,validate,test,predict} --config CONFIG.yaml [options]",
             "       hoformer <command> [options]", "", "LightningCLI commands (see `hoformer fit --help`):",
             "  fit, validate, test, predict", "", "hoformer commands:"]
    for name, (_, h) in sorted(COMMANDS.items()):
        lines.append(f"  {name:10s}{h}")
    for name, (_, h) in sorted(HOOKS.items()):
        if name not in COMMANDS:
            lines.append(f"  {name:10s}{h}")
    return "\n".join(lines)


def _misplaced_config(argv: list[str]) -> str | None:
    """``hoformer --config run.yaml fit`` hands the file to LightningCLI's *root* parser, which only reads keys named
    after subcommands (``fit: {trainer: ...}``) and silently drops the rest: the run would use every default. Catch a
    subcommand-level config (top-level ``trainer`` / ``model`` / ``data`` / ... keys) placed before the subcommand."""
    sub = next((i for i, a in enumerate(argv) if a in LIGHTNING_COMMANDS), len(argv))
    head = argv[:sub]
    for i, a in enumerate(head):
        if a in ("--config", "-c") and i + 1 < len(head):
            path = head[i + 1]
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
        elif a.startswith("-c") and not a.startswith("--") and len(a) > 2:  # -c=path, -cpath (argparse forms)
            path = a[2:].removeprefix("=")
        else:
            continue
        try:
            import yaml

            keys = yaml.safe_load(Path(path).read_text())
        except Exception:  # unreadable / not YAML / no yaml module: LightningCLI reports it
            continue
        if isinstance(keys, dict) and keys.keys() & {"trainer", "model", "data", "ckpt_path", "seed_everything",
                                                     "optimizer", "lr_scheduler"}:
            cmd = argv[sub] if sub < len(argv) else "fit"
            return (f"hoformer: `--config {path}` comes before the subcommand, where LightningCLI ignores its "
                    f"trainer/model/data keys; put it after: hoformer {cmd} --config {path} ...")
    return None


def _input_error(e: BaseException) -> BaseException | None:
    """The innermost exception of ``e``'s ``raise ... from`` chain (jsonargparse and Lightning wrap a constructor's
    error in their own) when it is an input check's: a ``ValueError`` / ``TypeError`` / ``OSError`` raised by
    hoformer's own code, or Lightning's ``MisconfigurationException``; None for anything else (a traceback is due)."""
    import traceback

    from lightning.fabric.utilities.exceptions import MisconfigurationException

    while e.__cause__ is not None:
        e = e.__cause__
    if isinstance(e, MisconfigurationException):
        return e
    frames = traceback.extract_tb(e.__traceback__)
    package = Path(__file__).resolve().parent  # the hoformer package's folder
    ours = bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(package)
    return e if ours and isinstance(e, (ValueError, TypeError, OSError)) else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hoformer`` console script."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd = argv[0]
    if cmd in COMMANDS:
        return int(COMMANDS[cmd][0](argv[1:]) or 0)
    if cmd in HOOKS:
        path = HOOKS[cmd][0]
        mod, fn = path.split(":")
        if mod not in sys.modules and not {"-h", "--help"} & set(argv[1:]):  # PyTorch / Lightning: seconds
            print(f"hoformer {cmd}: starting (loading PyTorch and the library) ...", file=sys.stderr, flush=True)
        try:
            target = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            print(f"hoformer {cmd}: not available in this installation ({path}: {e})", file=sys.stderr)
            return 2
        return int(target(argv[1:]) or 0)
    if cmd in LIGHTNING_COMMANDS or cmd.startswith("-"):
        err = _misplaced_config(argv)
        if err:
            print(err, file=sys.stderr)
            return 2
        from hoformer.config import expand_configs

        try:
            expanded = expand_configs(argv)
        except (FileNotFoundError, ValueError) as e:
            print(e, file=sys.stderr)
            return 2
        if from_command_line and expanded != argv:
            sys.argv[1:] = expanded
        from hoformer.checkpoint import CheckpointError
        from hoformer.lightning_cli import HoformerCLI
        from hoformer.train.guards import RunFolderError

        key = _class_help_key(expanded)
        try:  # from the command line LightningCLI reads sys.argv itself (given both, it warns on every run)
            if key is None:
                HoformerCLI(args=None if from_command_line else expanded, command=argv)
            else:  # the help of a class argument: printed with the option names as they are given
                import io
                from contextlib import redirect_stdout

                out = io.StringIO()
                try:
                    with redirect_stdout(out):
                        HoformerCLI(args=None if from_command_line else expanded, command=argv)
                finally:
                    sys.stdout.write(_fix_class_help(out.getvalue(), key))
        except (RunFolderError, CheckpointError) as e:  # the input, not the library: one line, no traceback
            if not from_command_line:
                raise
            print(f"error: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001 - an input check's error, however deep Lightning wrapped it: one line
            cause = _input_error(e)
            if not from_command_line or cause is None or os.environ.get("HOFORMER_TRACEBACK"):
                raise
            print(f"error: hoformer {cmd}: {cause}\n(the full traceback: HOFORMER_TRACEBACK=1 hoformer {cmd} ...)",
                  file=sys.stderr)
            return 2
        return 0
    print(f"hoformer: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------------------- demo
def _demo_data_root(name: str = "ETTh1") -> Path | None:
    """The data folder holding ``ltsf/<name's file>``: the library's data root (``$HOFORMER_DATA`` when set, and
    only it: never another folder than the one named; else ``../shared/data`` next to the working directory), or,
    without ``$HOFORMER_DATA``, ``shared/data`` next to the repository."""
    from hoformer.data import LTSF_DATASETS, default_data_root, ltsf_key

    key = ltsf_key(name)
    rel = LTSF_DATASETS[key].path if key else name
    cands = [default_data_root()]
    if not os.environ.get("HOFORMER_DATA"):
        cands.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    return next((c for c in cands if c is not None and (c / "ltsf" / rel).is_file()), None)


def _download_demo_data(name: str, timeout: float) -> tuple[Path | None, str]:
    """Fetch the LTSF file ``name`` from its canonical URL into the cache (``$HOFORMER_CACHE/ltsf``; checked against
    the pinned SHA-256 where one is known, as ``LTSFDataModule(download=True)`` does): ``(data root, "")`` holding
    ``ltsf/<file>``, or ``(None, one-line reason)``."""
    import hoformer.data as data

    key = data.ltsf_key(name)
    spec = data.LTSF_DATASETS[key] if key else None
    if spec is None or spec.url is None:
        return None, f"{name} has no download URL (only ETT files are downloadable)"
    folder = data.cache_dir("ltsf")
    try:
        data.download_url(spec.url, folder / spec.path, sha256=spec.sha256, timeout=timeout)
    except (OSError, ValueError) as e:  # no network, a timeout, a checksum mismatch
        return None, f"the download of {name} failed: {str(e).splitlines()[0][:300]}"
    return folder.parent, ""


@register_command("demo", help="train a small HOT forecaster (ETTh1 if $HOFORMER_DATA has it, else synthetic)")
def demo(argv: list[str]) -> int:
    """Train ``hot_forecaster`` (Kronecker product attention, lookback 96, horizon 96) for a fixed number of epochs
    (3, seed 0: the same test metrics on any machine, however busy; a few minutes on a CPU), test the best-validation
    checkpoint and report the metrics, the time it took, the checkpoint, ``save_pretrained`` directory and forecast
    PNG."""
    p = argparse.ArgumentParser(prog="hoformer demo", description=demo.__doc__)
    p.add_argument("--output", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--dataset", default="auto", help="'auto' (ETTh1 when found, else synthetic), 'synthetic' or an "
                   "LTSF name such as ETTh1 / weather")
    p.add_argument("--attention", default="kronecker_product")
    p.add_argument("--max-epochs", type=int, default=3, help="training epochs (default 3; every one runs: no "
                   "wall-clock budget, so the result does not depend on the machine's speed)")
    p.add_argument("--limit-train-batches", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    omp = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(omp) if omp.isdigit() and int(omp) > 0 else min(2, os.cpu_count() or 1)
    p.add_argument("--threads", type=int, default=threads, help="CPU threads (default: OMP_NUM_THREADS when set, else 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--download", action="store_true", help="when the data folder lacks the dataset, try the "
                   "checksummed ETT download into $HOFORMER_CACHE (default: nothing is downloaded)")
    p.add_argument("--download-timeout", type=float, default=15.0, help="seconds (default 15)")
    a = p.parse_args(argv)

    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from hoformer.data import LTSFDataModule
    from hoformer.models import create_model
    from hoformer.train import Optimization
    from hoformer.train.callbacks import ExportPretrained, checkpoint_callbacks
    from hoformer.train.checkpoint_io import AtomicCheckpointIO
    from hoformer.train.tasks import ForecastingTask

    torch.set_num_threads(a.threads)
    pl.seed_everything(a.seed, verbose=False)
    name = a.dataset
    target = "ETTh1" if name == "auto" else name
    root = None if name == "synthetic" else _demo_data_root(target)
    where = os.environ.get("HOFORMER_DATA") or "../shared/data"
    why = f"{target} is not under {where}/ltsf" + ("" if a.download else "; --download fetches the ETT files")
    if root is None and name != "synthetic" and a.download:
        print(f"hoformer demo: {why}; trying the checksummed download (timeout {a.download_timeout:g} s)")
        root, failed = _download_demo_data(target, a.download_timeout)
        why = failed or why
    if name == "auto":
        name = "ETTh1" if root is not None else "synthetic"
        if root is None:
            print(f"hoformer demo: no real data ({why}): using the synthetic dataset")
    elif name != "synthetic" and root is None:
        print(f"hoformer demo: dataset {name!r} not found under {where}/ltsf ({why}); set HOFORMER_DATA to the "
              "directory holding ltsf/", file=sys.stderr)
        return 2
    data = LTSFDataModule(root=None if name == "synthetic" else str(root / "ltsf"), name=name,
                          synthetic=name == "synthetic", seq_len=96, pred_len=96, batch_size=a.batch_size,
                          eval_batch_size=256)
    ds = {s: data.dataset(s) for s in ("train", "val", "test")}
    c = ds["train"].num_variates
    print(f"hoformer demo: dataset {name} ({c} variates), windows train/val/test = "
          f"{len(ds['train'])}/{len(ds['val'])}/{len(ds['test'])}")
    model = create_model("hot_forecaster", seq_len=96, pred_len=96, num_variates=c, attention=a.attention, dim=64,
                         depth=2, num_heads=4, patch_size=8, dropout=0.1)
    task = ForecastingTask(model, Optimization(lr=1e-3, weight_decay=0.1, warmup_steps=50), original_scale=True,
                           variate_names=list(ds["train"].columns))
    out = Path(a.output)
    ckpt, last = (ModelCheckpoint(**c["init_args"]) for c in checkpoint_callbacks(out / "checkpoints", "val/mae", "min"))
    export = ExportPretrained(str(out / "pretrained"))
    trainer = pl.Trainer(
        default_root_dir=out, max_epochs=a.max_epochs, limit_train_batches=a.limit_train_batches, accelerator="cpu",
        devices=1, logger=CSVLogger(out, name="logs"), callbacks=[ckpt, last, export],
        plugins=[AtomicCheckpointIO()], enable_progress_bar=sys.stderr.isatty(), enable_model_summary=False,
        log_every_n_steps=20,
    )
    from hoformer.train.guards import RunFolderError, hold_run_folder

    try:  # a demo replaces the previous demo's files, but not those of a demo still running
        release = hold_run_folder(out, overwrite=True, fn="hoformer demo")
    except RunFolderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from hoformer.lightning_cli import interrupted_report

    t0 = time.time()
    try:
        trainer.fit(task, datamodule=data)
    except SIGTERMException:
        print(f"hoformer demo: {interrupted_report(trainer, 'SIGTERM', ['demo', *argv])}", file=sys.stderr)
        return 128 + 15
    finally:
        release()
    fit_s = time.time() - t0
    t1 = time.time()
    (metrics,) = trainer.test(task, datamodule=data, ckpt_path=ckpt.best_model_path or None, verbose=False)
    print(f"\nhoformer demo: trained {trainer.current_epoch} epoch(s) in {fit_s:.0f} s and tested in "
          f"{time.time() - t1:.0f} s on {torch.get_num_threads()} thread(s) (a fixed {a.max_epochs} epoch(s), seed "
          f"{a.seed}: the same metrics on any machine); best val MAE "
          f"{float(ckpt.best_model_score or float('nan')):.4f}")
    print("test metrics (normalised scale, as in the papers):")
    for k in ("test/mse", "test/mae", "test/smape"):
        print(f"  {k:14s} {metrics[k]:.4f}")
    print("test metrics (original scale):")
    for k in ("test/mse_orig", "test/mae_orig"):
        print(f"  {k:14s} {metrics[k]:.4f}")
    print(f"checkpoint:      {ckpt.best_model_path}")
    print(f"save_pretrained: {export.path}   (hoformer.models.from_pretrained(dir))")
    print(f"forecast plot:   {task.forecast_plot_path}")
    if name != "synthetic":
        print(f"the future:      hoformer forecast --checkpoint '{export.path}' --output forecast.csv")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
