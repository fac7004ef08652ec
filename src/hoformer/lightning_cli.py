"""The LightningCLI of ``hoformer fit|validate|test|predict`` (:class:`HoformerCLI`) and its argument parser
(:class:`HoformerArgumentParser`). Imported only when one of these commands runs, or a config is resolved
(:func:`hoformer.config.resolve_config`): ``import hoformer.cli`` does not import Lightning."""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Optional

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from hoformer.checkpoint import MissingCheckpointError


__all__ = ["HoformerCLI", "HoformerArgumentParser", "DATA_LINKS"]


#: model constructor arguments the data determines -> the datamodule attribute that gives them; linked by the CLI
#: (LightningCLI ``link_arguments``, at instantiation), so a config writes them nowhere: a model that takes the
#: argument gets the datamodule's value (a datamodule without the attribute gives ``None``)
DATA_LINKS = {
    "seq_len": "seq_len", "pred_len": "pred_len", "num_variates": "num_variates",  # forecasting
    "num_nodes": "num_nodes", "window": "window", "horizon": "horizon",  # traffic
    "in_channels": "in_channels", "input_size": "input_size", "num_classes": "num_classes",  # images, volumes
    "vocab_size": "vocab_size", "pad_id": "pad_id", "max_len": "max_len",  # text
}


def _data_attr(attr: str):
    def value(dm):
        return getattr(dm, attr, None)

    value.__name__ = f"data.{attr}"
    return value


def _class_parameters(path: str):
    """The constructor parameters (``inspect.Parameter`` by name) of the class at the dotted ``class_path``, or None
    when it cannot be imported or inspected (jsonargparse reports that itself)."""
    from hoformer.models.base import constructor_signature

    mod, _, name = path.rpartition(".")
    try:
        return constructor_signature(getattr(importlib.import_module(mod), name)).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        return None


def _explain_unknown_option(message: str) -> str:
    """Append the accepted arguments (and the closest one) to jsonargparse's "Option 'x' is not accepted" error of a
    ``class_path`` (a misspelled model or task argument)."""
    import difflib
    import re

    bad = re.search(r"Option '([^']+)' is not accepted", message)
    paths = re.findall(r"class_path '([\w.]+)'", message[:bad.start()] if bad else "")
    if not bad or not paths:
        return message
    signature = _class_parameters(paths[-1])
    if signature is None:
        return message
    params = [p for p in signature if p not in ("self", "args", "kwargs")]
    option = bad.group(1).split(".")[-1]
    close = difflib.get_close_matches(option, params, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"{message}\n{paths[-1]} has no argument {option!r}: {hint}its arguments are {', '.join(params)}")


def _recorded_best(last: Path, state_key: str) -> str | None:
    """The ``best_model_path`` that the ModelCheckpoint ``state_key`` had when ``last`` was written, if that file
    still exists (robust to other runs' ``best-*.ckpt`` in the same directory); ``None`` otherwise."""
    from hoformer.checkpoint import read_checkpoint

    if not last.is_file():
        return None
    try:
        ckpt = read_checkpoint(last, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable last.ckpt: fall back to the glob
        return None
    if not isinstance(ckpt, dict):
        return None
    best = (ckpt.get("callbacks") or {}).get(state_key, {}).get("best_model_path")
    return best if best and Path(best).is_file() else None


def _explain_help_of_a_model(message: str) -> str:
    """``--model.help hoformer.models.X`` asks for the help of a model where the task is expected: point at
    ``--model.model.help`` (the task's ``model`` argument)."""
    import re

    m = re.search(r"--([\w.]+)\.help: \"([\w.]+)\" is not a subclass of TaskModule", message)
    if m is None:
        return message
    mod, _, name = m.group(2).rpartition(".")
    try:
        from hoformer.models import HoformerModel

        is_model = issubclass(getattr(importlib.import_module(mod), name), HoformerModel)
    except (ImportError, AttributeError, ValueError, TypeError):
        return message
    if not is_model:
        return message
    return (f"{message}. {m.group(2)} is a model: `--{m.group(1)}` is the task (hoformer.train.ForecastingTask, ...) "
            f"and the model is the task's `model` argument, whose help is `--{m.group(1)}.model.help {m.group(2)}`")


def interrupted_report(trainer, signal_name: str, command: list[str] | None = None) -> str:
    """What an interrupted ``fit`` says: in which epoch it stopped (Lightning stops after the training step under way),
    that it did not finish, and the command that resumes it from the ``last.ckpt`` of its last complete epoch (the
    given ``command`` with ``--ckpt_path`` replaced)."""
    from hoformer.train.guards import EpochSummary

    done = trainer.current_epoch - 1  # the last epoch whose end (and last.ckpt) was reached
    dirs = [cb.dirpath for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
    dirs.append(os.path.join(trainer.default_root_dir, "checkpoints"))
    last = next((os.path.join(d, "last.ckpt") for d in dirs if os.path.isfile(os.path.join(d, "last.ckpt"))), None)
    text = f"stopped by {signal_name} in {EpochSummary._epoch(trainer)}: the run did not finish"
    if last is None or done < 0:
        return f"{text}, and no epoch was complete: start it again"
    cmd = list(command) if command else ["fit", "--config", "<config>"]
    keep, skip = [], False
    for a in cmd:  # drop an earlier --ckpt_path (and its value)
        if skip:
            skip = False
            continue
        if a == "--ckpt_path":
            skip = True
            continue
        if not a.startswith("--ckpt_path="):
            keep.append(a)
    import shlex

    resume = " ".join(shlex.quote(a) for a in ["hoformer", *keep, "--ckpt_path", last])
    return (f"{text}; its last complete epoch ({EpochSummary._epoch(trainer, done).split()[1]}) is in {last}. "
            f"Resume it exactly with:\n  {resume}")


class HoformerArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose errors say what to do: the accepted arguments of a misspelled ``class_path``
    argument, the closest option to a misspelled key (``trainr:`` -> ``trainer``), the ``--model.model.help`` of a
    model class given to ``--model.help``. An error with a suggestion ("did you mean 'dim'?") is one line (a misspelled
    class argument: without jsonargparse's listing of the Union it failed to match); any other error line is printed
    first and, after the usage, last."""

    def error(self, message, *args, **kwargs):
        message = _explain_help_of_a_model(_explain_unknown_option(str(message)))
        message = self._suggest_option(message)
        named = [line.strip() for line in message.splitlines() if " has no argument " in line]
        if named:  # a misspelled class argument: its one line (with the suggestion), not jsonargparse's Union dump
            message = named[-1]
        if self.exit_on_error and "did you mean" in message:  # once, and what to run for more (not the usage)
            sys.stderr.write(f"error: {message}\n(every option: {self.prog.replace(' [options]', '')} --help)\n")
            self.exit(2)
        if self.exit_on_error:
            sys.stderr.write(f"error: {message}\n\n")
        return super().error(message, *args, **kwargs)

    def _option_names(self) -> list[str]:
        """Every option name of this parser and of its subcommands' parsers (``trainer.max_epochs``, ...)."""
        names = [a.dest for a in self._actions if a.dest and a.dest != "help"]
        sub = getattr(self, "_subcommands_action", None)
        for parser in (getattr(sub, "_name_parser_map", None) or {}).values():
            names += [a.dest for a in parser._actions if a.dest and a.dest != "help"]
        return sorted(set(names))

    def _suggest_option(self, message: str) -> str:
        import difflib
        import re

        bad = re.search(r"does not accept option '([\w.+-]+)'|Option '([\w.]+)' is not accepted", message)
        if bad is None or "did you mean" in message:
            return message
        key = bad.group(1) or bad.group(2)
        names = self._option_names()
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
        if not close:  # a misspelled section: match its first part (trainr.max_epochs -> trainer)
            head, _, rest = key.partition(".")
            tops = sorted({n.split(".")[0] for n in names})
            top = difflib.get_close_matches(head, tops, n=1, cutoff=0.6)
            close = [f"{top[0]}.{rest}" if rest else top[0]] if top else []
        if not close:
            return message
        where = f"the key {key.split('.')[0]!r} (in a config file or on the command line)"
        return f"{message}; {where}: did you mean {close[0].split('.')[0] if '.' not in key else close[0]!r}?"


class HoformerCLI(LightningCLI):
    """LightningCLI with subclass mode for task and data, the model a typed argument of the task whose
    data-determined arguments are linked from the datamodule (:data:`DATA_LINKS`), and hoformer's
    defaults (see :mod:`hoformer.cli`).

    ``parse_only=True`` builds the parser and nothing else (no parsing, seeding or instantiation): its ``parser``
    resolves configs exactly as the commands do (:func:`hoformer.config.resolve_config`)."""

    def __init__(self, args=None, run: bool = True, parse_only: bool = False, command: list[str] | None = None,
                 **kw):
        from lightning.pytorch import LightningDataModule

        from hoformer.train import TaskModule

        self._parse_only = parse_only
        #: the one subcommand whose parser is built (``hoformer fit ...`` needs no validate / test / predict parser:
        #: each costs a quarter of the parsing time); ``None``: all of them
        given = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:] if args is None else []
        self._only = "fit" if parse_only else next((a for a in given if a in LightningCLI.subcommands()), None)
        #: the command as the user gave it (``hoformer.cli.main``'s argv), for the resume hint of an interrupted fit
        self._command = list(command) if command is not None else None
        kw.setdefault("save_config_kwargs", {"overwrite": True})
        kw.setdefault("parser_class", HoformerArgumentParser)
        kw.setdefault("parser_kwargs", {"prog": "hoformer"})  # not `cli.py` under `python -m hoformer.cli`
        super().__init__(
            TaskModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
            seed_everything_default=0, args=args, run=run, auto_configure_optimizers=False, **kw,
        )

    def subcommands(self) -> dict[str, set[str]]:
        """LightningCLI's subcommands, or only the one this command runs (:attr:`_only`)."""
        full = LightningCLI.subcommands()
        only = getattr(self, "_only", None)
        return {only: full[only]} if only in full else full

    # ------------------------------------------------------------------------------------------- parse only
    def parse_arguments(self, parser, args) -> None:
        if self._parse_only:
            self.config = {"subcommand": None}
            return
        super().parse_arguments(parser, args)

    def _set_seed(self) -> None:
        if not self._parse_only:
            super()._set_seed()

    def _add_instantiators(self) -> None:
        if not self._parse_only:
            super()._add_instantiators()

    def instantiate_classes(self) -> None:
        if not self._parse_only:
            super().instantiate_classes()

    def after_instantiate_classes(self) -> None:
        if self._parse_only:
            return
        super().after_instantiate_classes()
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        if cfg.get("allow_data_mismatch"):
            self.model.allow_data_mismatch = True

    # ------------------------------------------------------------------------------------------------ a run
    def _parse_ckpt_path(self) -> None:
        """LightningCLI (lightning 2.3-2.6, ``LightningCLI._parse_ckpt_path``) re-parses the hyper-parameters stored in
        a ``--ckpt_path`` checkpoint as init args of the task; a hoformer task records its model's ``config`` and its
        ``optim`` there (and checkpoints of earlier tasks their ``model_name`` / ``model_kwargs``), which are not init
        args. The config defines the task; the checkpoint gives the weights (:mod:`hoformer.checkpoint` rebuilds a
        model from the hyper-parameters alone). The file is still read here, so a truncated, refused or non-Lightning
        file is reported naming it (:func:`hoformer.checkpoint.read_lightning_checkpoint`)."""
        if self._parse_only:
            return
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if path and Path(path).is_file():
            from hoformer.checkpoint import read_lightning_checkpoint

            read_lightning_checkpoint(path, fn=f"hoformer {sub} --ckpt_path", restore=True)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--threads", type=Optional[int], default=None,
                            help="CPU threads of PyTorch (default: PyTorch's own, one per core; OMP_NUM_THREADS=N "
                                 "sets it too). Runs sharing a machine should split its cores between them.")
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="fit: replace the finished run in trainer.default_root_dir (default: refuse it; "
                                 "resume it with --ckpt_path, or give the run its own folder)")
        parser.add_argument("--teacher_run", type=Optional[str], default=None,
                            help="a distilled student's teacher: the teacher's run folder (its "
                                 "trainer.default_root_dir); sets the task's teacher, teacher_logits and "
                                 "init_embeddings_from and the data's tokenizer to its pretrained/ export "
                                 "(hoformer.config.TEACHER_RUN_LINKS)")
        parser.add_argument("--allow_data_mismatch", type=bool, default=False,
                            help="evaluate / resume a checkpoint on data other than the data it was trained on "
                                 "(default: refused; a checkpoint records its data's signature)")
        for arg, attr in DATA_LINKS.items():
            parser.link_arguments("data", f"model.init_args.model.init_args.{arg}", compute_fn=_data_attr(attr),
                                  apply_on="instantiate")
        # the forecast plots' panel labels: the data's column names (a task without the argument ignores it)
        parser.link_arguments("data", "model.init_args.variate_names", compute_fn=_data_attr("variate_names"),
                              apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        if self._parse_only:
            return
        import torch

        sub = self.subcommand
        self._refuse_given_links(self.config[sub] if sub else self.config)
        n = (self.config[sub] if sub else self.config).get("threads")
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"hoformer {sub or 'cli'}: `--threads` must be an int >= 1, got {n!r}")
            torch.set_num_threads(n)
        from hoformer.train.allocator import keep_large_allocations

        keep_large_allocations()  # large temporaries reused, not re-mapped every step (hoformer.train.allocator)
        how = "set by --threads" if n is not None else (
            "from OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS") else "PyTorch's default, one per core")
        print(f"hoformer {sub or 'cli'}: PyTorch uses {torch.get_num_threads()} CPU thread(s) ({how}; change with "
              "--threads N or OMP_NUM_THREADS=N, e.g. when several runs share the machine)", file=sys.stderr)

    def _refuse_given_links(self, cfg) -> None:
        """A data-determined model argument (:data:`DATA_LINKS`) given in a config or on the command line
        would be replaced by the datamodule's value without a word: refuse it (a value other than the model's default;
        the parsed config cannot tell a default from a given value) before anything is built."""
        import inspect

        model = cfg.get("model.init_args.model") if cfg.get("model.init_args") is not None else None
        path = model.get("class_path") if model is not None else None
        if not path or model.get("init_args") is None:
            return
        params = _class_parameters(path)
        if params is None:
            return
        args = model["init_args"]
        given = {a: args.get(a) for a in DATA_LINKS if a in params and a in args
                 and params[a].default is not inspect.Parameter.empty and args.get(a) != params[a].default}
        if given:
            where = ", ".join(f"{a}={v!r} (the datamodule's `{DATA_LINKS[a]}`)" for a, v in given.items())
            self.parser.error(f"{path}: {where} is determined by the data and linked from it; set it on the data "
                              "(--data.init_args...) and leave it out of the model's arguments")

    def instantiate_trainer(self, **kwargs):
        """Everything a run writes lives under ``trainer.default_root_dir`` (the one output setting): without a
        ``logger`` in the config, a CSV logger (``<root>/logs``) and, when TensorBoard is installed, a TensorBoard
        logger (``<root>/tb``); without a ``ModelCheckpoint``, the best checkpoint by the task's model-selection
        metric (``selection``) and ``last.ckpt`` after every epoch (:func:`~hoformer.train.callbacks.checkpoint_callbacks`);
        a ``ModelCheckpoint`` without ``dirpath`` writes to ``<root>/checkpoints``.
        Checkpoints are written atomically and read weights-only whatever the config says
        (:func:`~hoformer.train.checkpoint_io.install_checkpoint_io`: a plain ``TorchCheckpointIO`` is replaced by
        :class:`~hoformer.train.checkpoint_io.AtomicCheckpointIO`; a custom checkpoint IO of the user's keeps its saves)."""
        import importlib.util

        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        from hoformer.train.callbacks import checkpoint_callbacks
        from hoformer.train.checkpoint_io import install_checkpoint_io

        cfg = self._get(self.config_init, "trainer", default={})
        root = cfg.get("default_root_dir") or os.getcwd()
        if Path(root).exists() and not Path(root).is_dir():
            from hoformer.train.guards import RunFolderError

            raise RunFolderError(f"hoformer {self.subcommand or 'cli'}: trainer.default_root_dir {str(root)!r} is a file; "
                             "expected the run folder (a directory, or a path that does not exist yet)")
        callbacks = list(cfg.get("callbacks") or [])
        if cfg.get("enable_checkpointing") is not False and "callbacks" not in kwargs \
                and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            monitor, mode = getattr(self.model, "selection", (None, "min"))
            kwargs["callbacks"] = callbacks + [
                ModelCheckpoint(**c["init_args"])
                for c in checkpoint_callbacks(os.path.join(root, "checkpoints"), monitor, mode)]
        if cfg.get("logger") in (None, True) and "logger" not in kwargs:
            kwargs["logger"] = [CSVLogger(root, name="logs")]
            if importlib.util.find_spec("tensorboard") is not None:
                kwargs["logger"].append(TensorBoardLogger(root, name="tb"))
        trainer = super().instantiate_trainer(**kwargs)
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(root, "checkpoints")
        install_checkpoint_io(trainer)
        return trainer

    def _resolve_best(self) -> None:
        """``--ckpt_path best`` in a fresh process: the best checkpoint that the run's ``last.ckpt`` (written after
        every epoch) records for this ModelCheckpoint, else the newest ``best-*.ckpt`` in its dirpath."""
        cfg = self.config_init[self.subcommand]
        cb = self.trainer.checkpoint_callback
        if cfg.get("ckpt_path") != "best" or cb is None or cb.best_model_path:
            return
        if cb.monitor is None:
            raise MissingCheckpointError("--ckpt_path best: this config's ModelCheckpoint monitors no metric, so there is no "
                             "best checkpoint (the CPU-budget HOBA configs evaluate the last epoch); pass the "
                             "path of a checkpoint, e.g. <default_root_dir>/checkpoints/last.ckpt")
        d = Path(cb.dirpath) if cb.dirpath else None
        recorded = _recorded_best(d / "last.ckpt", cb.state_key) if d is not None else None
        if recorded is not None:
            cfg["ckpt_path"] = recorded
            return
        found = sorted(d.glob("best-*.ckpt"), key=os.path.getmtime) if d is not None and d.is_dir() else []
        if not found:
            raise MissingCheckpointError(f"--ckpt_path best: no best-*.ckpt in the ModelCheckpoint dirpath {d}; "
                                    "run `hoformer fit` with this config first or pass a checkpoint path")
        cfg["ckpt_path"] = str(found[-1])

    before_validate = before_test = before_predict = _resolve_best

    def fit(self, model, **kwargs) -> None:
        """``Trainer.fit`` holding the run folder: one fit per folder (:func:`hoformer.train.guards.hold_run_folder`),
        taken by the launching process (rank 0) and released when the fit ends, however it ends."""
        from hoformer.train.guards import hold_run_folder

        release = None
        if not (int(os.environ.get("LOCAL_RANK", 0)) or int(os.environ.get("NODE_RANK", 0))):
            cfg = self.config_init[self.subcommand]
            release = hold_run_folder(self.trainer.default_root_dir, resume=bool(kwargs.get("ckpt_path")),
                                      overwrite=bool(cfg.get("overwrite")))
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        try:
            self.trainer.fit(model, **kwargs)
        except SIGTERMException:  # Lightning stops at the end of the epoch (or inside validation) and exits 0
            if release is not None:
                release()
                release = None
            print(f"hoformer fit: {interrupted_report(self.trainer, 'SIGTERM', self._command)}", file=sys.stderr,
                  flush=True)
            raise SystemExit(128 + 15) from None  # a scheduler must see that the run did not finish
        finally:
            if release is not None:
                release()
