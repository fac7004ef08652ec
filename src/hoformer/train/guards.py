"""Guards of a training run: a stop at the first non-finite loss, and the removal of temporary files that a killed
checkpoint save left behind (checkpoints are read by :mod:`hoformer.checkpoint`, without unpickling).

* :class:`NonFiniteGuard` - raises :class:`NonFiniteError` at the first non-finite training loss, naming the step, the
  batch index, whether the inputs, the outputs or only the loss went non-finite, and the first module whose output
  did. Every :class:`~hoformer.train.TaskModule` adds one (``configure_callbacks``) unless the trainer has one.
* :class:`CleanStaleTempFiles` - at the start of ``fit``, removes the hidden temporary files of interrupted
  checkpoint writes (:func:`hoformer._io.stale_temp_files`: only ``.<name>.ckpt.<8 chars>.tmp``) from the
  checkpoint directories. Every :class:`~hoformer.train.TaskModule` adds one too.
* :class:`StoppedRunGuard` - a run resumed from a checkpoint whose early stopping had already ended it stops before
  training another epoch (Lightning would train one more). Every :class:`~hoformer.train.TaskModule` adds one too.
* :class:`EpochSummary` - what a run did, on stderr: its data (file, split protocol, split sizes; a warning for a
  tiny validation split) when ``fit`` starts, one line per training epoch and a progress line inside long epochs
  when no progress bar is drawn on a terminal (logs, CI, ``nohup``), and why it stopped, with its best checkpoint,
  ``last.ckpt`` and ``save_pretrained`` folder, when it ends. Every :class:`~hoformer.train.TaskModule` adds one
  too.
* :func:`hold_run_folder` - one ``fit`` per run folder: refuses a folder another live run holds (``.hoformer.lock``
  with its host and pid; a lock whose process is gone is stale and taken over) and a finished run's folder unless
  resuming or told to overwrite (``hoformer fit --overwrite true``).
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from hoformer._checks import is_int
from hoformer._io import pid_alive

__all__ = ["EpochSummary", "hold_run_folder", "RunFolderError", "NonFiniteError", "NonFiniteGuard", "CleanStaleTempFiles",
           "StoppedRunGuard", "default_callbacks"]


# --------------------------------------------------------------------------------------------- non-finite
class NonFiniteError(FloatingPointError):
    """Training produced a non-finite (NaN / inf) loss."""


def _nonfinite_tensors(obj, prefix: str) -> list[str]:
    """Names (``prefix``, ``prefix[0]``, ``prefix['x']``...) of the floating-point tensors in ``obj`` holding NaN or
    inf, each with its counts."""
    if isinstance(obj, torch.Tensor):
        bad = obj.is_floating_point() or obj.is_complex()
        if bad and not bool(torch.isfinite(obj).all()):
            nan, n = int(torch.isnan(obj).sum()), obj.numel()
            return [f"{prefix} ({nan} NaN, {int((~torch.isfinite(obj)).sum()) - nan} inf of {n})"]
        return []
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in _nonfinite_tensors(v, f"{prefix}[{k!r}]")]
    if isinstance(obj, (list, tuple)):
        return [s for i, v in enumerate(obj) for s in _nonfinite_tensors(v, f"{prefix}[{i}]")]
    return []


class _StopReplay(Exception):
    pass


def _first_nonfinite_module(pl_module: pl.LightningModule, batch) -> str | None:
    """Replay the failing batch through ``pl_module.shared_step`` (no grad, the RNG state restored afterwards) with
    forward hooks on ``pl_module.model`` and its sub-modules: the qualified name of the first module (in execution
    order) whose output is non-finite. The replay stops when the model's forward returns, before any loss, metric
    or log of the step."""
    model = getattr(pl_module, "model", None)
    step = getattr(pl_module, "shared_step", None)
    if not isinstance(model, torch.nn.Module) or step is None:
        return None
    found: list[str] = []

    def hook(name):
        def fn(module, args, out):
            if _nonfinite_tensors(out, name or "model"):
                found.append(f"{name or 'model'} ({type(module).__name__})")
            if found or module is model:
                raise _StopReplay
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            step(batch, "train")
    except Exception:  # noqa: BLE001 - a diagnosis only: the NonFiniteError is the error reported
        pass
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


class NonFiniteGuard(pl.Callback):
    """Stop training at the first non-finite loss with a :class:`NonFiniteError` naming the global step, the batch
    index, which of the batch inputs / model outputs / loss went non-finite, and the first module whose output did.

    On CPU (and accelerators other than CUDA) the loss is checked before its backward pass, so no optimizer step is
    taken on it. On CUDA a host read would wait for the step's kernels, so the flag is copied to the host
    asynchronously and checked once it has arrived (usually at the next step, at the latest at the end of the epoch):
    the error then comes one or two steps late and still names the step that first went non-finite (the diagnosis of
    inputs and modules uses that step's batch and the current weights).

    Args:
        enabled: ``False`` turns the guard off (e.g. ``--trainer.callbacks+=hoformer.train.NonFiniteGuard
            --trainer.callbacks.enabled=false``; a guard in the trainer's callbacks replaces the task's default one).
        locate_module: on failure, replay the batch's forward with hooks to find the first non-finite module output.
    """

    def __init__(self, enabled: bool = True, locate_module: bool = True) -> None:
        self.enabled = enabled
        self.locate_module = locate_module
        self._batch: Any = None
        self._batch_idx = -1
        self._pending: list[tuple] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch, self._batch_idx = batch, batch_idx
        self._drain(trainer, pl_module, wait=False)

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        if not self.enabled:
            return
        ok = torch.isfinite(loss.detach()).all()
        if ok.device.type != "cuda" or torch.compiler.is_compiling():
            if not bool(ok):
                self._fail(trainer, pl_module, trainer.global_step, self._batch_idx, self._batch, loss.detach())
            return
        flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        flag.copy_(ok, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((trainer.global_step, self._batch_idx, self._batch, flag, event, loss.detach()))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._drain(trainer, pl_module, wait=True)

    def on_train_end(self, trainer, pl_module) -> None:
        self._drain(trainer, pl_module, wait=True)
        self._batch = None

    def _drain(self, trainer, pl_module, wait: bool) -> None:
        """Check the CUDA steps whose flag has arrived on the host (all of them when ``wait``)."""
        while self._pending:
            step, idx, batch, flag, event, loss = self._pending[0]
            if not wait and not event.query():
                return
            event.synchronize()
            self._pending.pop(0)
            if not bool(flag):
                self._pending.clear()
                self._fail(trainer, pl_module, step, idx, batch, loss)

    def _fail(self, trainer, pl_module, step: int, batch_idx: int, batch, loss: torch.Tensor) -> None:
        inputs = _nonfinite_tensors(batch, "batch")
        module = self._locate(pl_module, batch) if self.locate_module else None
        if inputs:
            where = f"the inputs went non-finite: {', '.join(inputs[:4])}"
        elif module is not None:
            where = f"the inputs are finite; the outputs went non-finite, first in module {module}"
        else:
            where = ("the inputs are finite; the loss went non-finite (the model's outputs were finite when the "
                     "batch was replayed: check the loss, the labels and the learning rate)")
        lr = getattr(pl_module, "current_lr", lambda: None)()
        last = getattr(pl_module, "last_finite_loss", lambda: None)()
        history = (f" The learning rate is {lr:.3g}" if lr is not None else "") + (
            f"{'; the' if lr is not None else ' The'} last finite training loss was {last[1]:.4g} at step {last[0]}."
            if last is not None and last[0] < step else "." if lr is not None else "")
        raise NonFiniteError(
            f"NonFiniteGuard: non-finite training loss {loss.float().cpu().tolist()} at global step {step} "
            f"(epoch {trainer.current_epoch}, batch index {batch_idx}); {where}.{history} Training stopped before "
            "the optimizer step on it; lower the learning rate, clip gradients (--trainer.gradient_clip_val) or "
            "check the data.")

    @staticmethod
    def _locate(pl_module, batch) -> str | None:
        was_training = pl_module.training
        try:
            return _first_nonfinite_module(pl_module, batch)
        finally:
            pl_module.train(was_training)


# ------------------------------------------------------------------------------------------ stale temp files
class CleanStaleTempFiles(pl.Callback):
    """At the start of ``fit`` (global rank 0), remove the hidden temporary files that a killed checkpoint save left
    in the checkpoint directories (``.<name>.ckpt.<8 chars>.tmp``, :func:`hoformer._io.stale_temp_files`); other files
    are never touched. Reports each removal on stderr."""

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        from hoformer._io import stale_temp_files

        dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
        for d in sorted(dirs):
            for p in stale_temp_files(d, suffix=".ckpt"):
                try:
                    p.unlink()
                except OSError:
                    continue
                print(f"hoformer: removed {p}, left by an interrupted checkpoint save", file=sys.stderr)


#: a validation split with fewer windows / samples than this is warned about at the start of ``fit``
SMALL_VALIDATION = 30


def _fmt(v: float) -> str:
    return f"{v:.4g}"


class EpochSummary(pl.Callback):
    """What a run did, on stderr (global rank 0), so that a log file tells the whole story:

    * at the start of ``fit``: the data (the datamodule's :meth:`split_summary`: file, split protocol and the sizes of
      the three splits) and a warning when the validation split holds fewer than :data:`SMALL_VALIDATION`
      windows / samples, since early stopping and the best checkpoint are chosen on it;
    * one line per training epoch (the epoch means of the logged losses and validation metrics, each once, and the
      epoch's wall time) and, inside an epoch, a progress line every ``progress_every_s`` seconds (step, loss, time
      left in the epoch): both only when no progress bar is drawn on a terminal (stderr not a terminal, or
      ``enable_progress_bar=False``), where a run would otherwise print nothing for minutes;
    * at the end of ``fit``: why it stopped (the last epoch, early stopping with its metric, patience and best epoch,
      a deadline, ``max_steps``), the best checkpoint with its score and epoch, ``last.ckpt`` and the
      ``save_pretrained`` folder.

    Epochs are numbered from 0, as Lightning numbers them in its progress bar, ``metrics.csv`` and the checkpoint
    names: ``epoch 2/9`` is the third of ten epochs and its checkpoint is ``best-epoch=002.ckpt``.
    """

    def __init__(self, always: bool = False, progress_every_s: float = 60.0) -> None:
        if isinstance(progress_every_s, bool) or not isinstance(progress_every_s, (int, float)) \
                or not progress_every_s >= 0:
            raise ValueError(f"EpochSummary: `progress_every_s` must be a number of seconds >= 0, got "
                             f"{progress_every_s!r}")
        self.always = always
        self.progress_every_s = float(progress_every_s)
        self._t0 = self._last = 0.0
        self._scores: dict[int, float] = {}  # epoch -> the best checkpoint's monitored value, this attempt

    def _quiet(self, trainer) -> bool:
        return not self.always and trainer.progress_bar_callback is not None and sys.stderr.isatty()

    @staticmethod
    def _epoch(trainer, epoch: int | None = None) -> str:
        epoch = trainer.current_epoch if epoch is None else epoch
        last = f"/{trainer.max_epochs - 1}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        return f"epoch {epoch}{last}"

    # ------------------------------------------------------------------------------------------------ start
    def on_fit_start(self, trainer, pl_module) -> None:
        self._scores = {}
        if not trainer.is_global_zero:
            return
        dm = getattr(trainer, "datamodule", None)
        summary = getattr(dm, "split_summary", None)
        if not callable(summary):
            return
        try:
            line, sizes = summary()
        except Exception:  # noqa: BLE001 - a report only: the run reports its own data errors
            return
        print(f"hoformer fit: data: {line}", file=sys.stderr, flush=True)
        val = sizes.get("val")
        if val is not None and val < SMALL_VALIDATION and trainer.limit_val_batches != 0:
            unit = getattr(dm, "sample_unit", "samples")
            print(f"hoformer fit: warning: the validation split holds only {val} {unit} (fewer than "
                  f"{SMALL_VALIDATION}); early stopping and the best checkpoint are chosen on it, so they follow "
                  "noise. Give validation more data (a longer series, a shorter lookback / horizon, a larger "
                  "validation share) or judge the run by its last epoch", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------- per epoch
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._t0 = self._last = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.time()
        if now - self._last < self.progress_every_s or not trainer.is_global_zero or self._quiet(trainer):
            return
        self._last = now
        total = trainer.num_training_batches
        done = batch_idx + 1
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        shown = f", train/loss {_fmt(float(loss))}" if isinstance(loss, torch.Tensor) and loss.numel() == 1 else ""
        left = ""
        if isinstance(total, int) and 0 < done < total:
            left = f"; about {(now - self._t0) / done * (total - done):.0f} s left in the epoch"
        of = f"/{total}" if isinstance(total, int) else ""
        print(f"{self._epoch(trainer)}: step {done}{of}{shown} ({now - self._t0:.0f} s{left})", file=sys.stderr,
              flush=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        cb = trainer.checkpoint_callback
        monitor = getattr(cb, "monitor", None)
        if monitor and monitor in trainer.callback_metrics:
            self._scores[trainer.current_epoch] = float(trainer.callback_metrics[monitor])
        if self._quiet(trainer):
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items()
                   if not k.endswith("_step") and (k.startswith("val/") or k.endswith("loss") or k.endswith("_epoch"))}
        shown: dict[str, str] = {}
        for k, v in sorted(metrics.items()):
            if getattr(v, "numel", lambda: 1)() != 1:
                continue
            name = k.removesuffix("_epoch")
            if name == k and f"{k}_epoch" in metrics:  # the epoch mean of a per-step metric: shown once, as such
                continue
            shown[name] = _fmt(float(v))
        text = " ".join(f"{k} {v}" for k, v in shown.items())
        print(f"{self._epoch(trainer)}: {text} ({time.time() - self._t0:.0f} s)", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------------- end
    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or trainer.state.status == "interrupted":
            return
        print(f"hoformer fit: {run_end_report(trainer, self._scores)}", file=sys.stderr, flush=True)


def stopped_early(trainer):
    """The ``EarlyStopping`` callback of ``trainer`` that has ended its run (its ``stopped_epoch`` set: this attempt's,
    or the one a resumed checkpoint holds), else None."""
    from lightning.pytorch.callbacks import EarlyStopping

    return next((cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping) and cb.stopped_epoch > 0), None)


class StoppedRunGuard(pl.Callback):
    """A run resumed from a checkpoint whose ``EarlyStopping`` had already ended it (the ``last.ckpt`` written after
    the stopping epoch, e.g. when a deadline stopped the same epoch) stops before training another epoch, saying so
    on stderr. Lightning would train one more epoch and check again: a resumed run would differ from the
    uninterrupted one (an extra epoch, and a new best checkpoint if that epoch improved). Every
    :class:`~hoformer.train.TaskModule` adds one."""

    def on_train_start(self, trainer, pl_module) -> None:
        cb = stopped_early(trainer)  # no epoch of this attempt has run: a stop the resumed checkpoint holds
        if cb is None:
            return
        trainer.should_stop = True
        if trainer.is_global_zero:
            print(f"hoformer fit: the resumed checkpoint's early stopping ({cb.monitor}) ended this run after "
                  f"{EpochSummary._epoch(trainer, cb.stopped_epoch)}; nothing is left to train", file=sys.stderr,
                  flush=True)


def _why_stopped(trainer) -> str:
    """Why ``trainer``'s fit ended, in words."""
    last = trainer.current_epoch - 1  # current_epoch counts the finished epochs once fit has ended
    cb = stopped_early(trainer)
    if cb is not None:
        best = cb.stopped_epoch - cb.wait_count if cb.wait_count >= cb.patience else None
        score = "" if cb.best_score is None else f"{float(cb.best_score):.4g}"
        at = f" at epoch {best}" if best is not None else ""
        if cb.wait_count >= cb.patience:
            why = f"{cb.monitor} did not improve for {cb.patience} epoch(s) (patience {cb.patience})"
        else:
            why = f"{cb.monitor} reached a stopping threshold or went non-finite"
        return (f"early stopping after {EpochSummary._epoch(trainer, cb.stopped_epoch)}: {why}; "
                f"best {cb.monitor} {score}{at}")
    deadline = next((cb for cb in trainer.callbacks if type(cb).__name__ == "Deadline" and getattr(cb, "stopped",
                                                                                                   False)), None)
    if deadline is not None:
        return (f"stopped by the deadline after {EpochSummary._epoch(trainer, max(last, 0))} (the next epoch would not end before "
                "it); resume with --ckpt_path <run>/checkpoints/last.ckpt")
    if trainer.max_epochs is not None and trainer.max_epochs > 0 and trainer.current_epoch >= trainer.max_epochs:
        n = trainer.max_epochs
        return f"finished all {n} epochs (max_epochs)" if n != 1 else "finished its 1 epoch (max_epochs)"
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return f"reached max_steps={trainer.max_steps} in {EpochSummary._epoch(trainer)}"
    return f"stopped after {EpochSummary._epoch(trainer, max(last, 0))}"


def run_end_report(trainer, scores: dict[int, float] | None = None) -> str:
    """One line: why the fit ended (:func:`_why_stopped`), the best checkpoint (path, score, epoch), ``last.ckpt``
    and the ``save_pretrained`` folder, as far as the run has them."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    parts = [_why_stopped(trainer)]
    best = trainer.checkpoint_callback if isinstance(trainer.checkpoint_callback, ModelCheckpoint) else None
    if best is not None and best.best_model_path:
        score = "" if best.best_model_score is None else f" ({best.monitor} {float(best.best_model_score):.4g}"
        if score and scores:
            want = float(best.best_model_score)
            epoch = next((e for e, v in scores.items() if abs(v - want) <= 1e-12 * max(1.0, abs(want))), None)
            score += f", epoch {epoch})" if epoch is not None else ")"
        elif score:
            score += ")"
        parts.append(f"best checkpoint {best.best_model_path}{score}")
    last = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath
                 and os.path.isfile(os.path.join(cb.dirpath, "last.ckpt"))), None)
    if last is not None:
        parts.append(f"last {os.path.join(last.dirpath, 'last.ckpt')}")
    export = next((cb for cb in trainer.callbacks if type(cb).__name__ == "ExportPretrained"), None)
    if export is not None and getattr(export, "path", None):
        parts.append(f"save_pretrained {os.path.abspath(export.path)}")
    return "; ".join(parts)


def default_callbacks(trainer: pl.Trainer | None) -> list[pl.Callback]:
    """The callbacks every :class:`~hoformer.train.TaskModule` adds to its trainer: a :class:`NonFiniteGuard`, a
    :class:`CleanStaleTempFiles`, a :class:`StoppedRunGuard` and an :class:`EpochSummary`, each unless the trainer
    already has one (the user's then applies)."""
    have = list(getattr(trainer, "callbacks", None) or [])
    return [cls() for cls in (NonFiniteGuard, CleanStaleTempFiles, StoppedRunGuard, EpochSummary)
            if not any(isinstance(c, cls) for c in have)]


# ---------------------------------------------------------------------------------------------- run folders
LOCK_NAME = ".hoformer.lock"
_HELD: set[str] = set()  # the lock files this process holds


class RunFolderError(RuntimeError):
    """A run folder that another live run holds, or that holds a finished run."""


def _read_lock(lock: Path, settle_s: float = 0.5) -> dict | None:
    """The ``{"host", "pid", "started"}`` of a lock file, or ``None`` when it names no run: empty, not JSON, or
    without an int pid and a host name. A lock another process has created but not yet written is empty for an
    instant, so an unreadable lock is read once more after ``settle_s`` seconds (a file younger than that)."""
    for attempt in range(2):
        try:
            other = json.loads(lock.read_text())
        except (OSError, ValueError):
            other = None
        if isinstance(other, dict) and is_int(other.get("pid")) and isinstance(other.get("host"), str):
            return other
        try:
            young = time.time() - lock.stat().st_mtime < settle_s
        except OSError:  # removed meanwhile: its owner released it
            return None
        if attempt or not young:
            return None
        time.sleep(settle_s)
    return None


def _finished_run(root: Path) -> list[str]:
    """What an earlier run left in ``root``: its checkpoints and ``save_pretrained`` export."""
    found = sorted(str(p.relative_to(root)) for p in (root / "checkpoints").glob("*.ckpt")) \
        if (root / "checkpoints").is_dir() else []
    if (root / "pretrained" / "config.json").is_file():
        found.append("pretrained/")
    return found


def hold_run_folder(root, *, resume: bool = False, overwrite: bool = False, fn: str = "hoformer fit"):
    """Take the run folder ``root`` for one ``fit``; returns the function that releases it (also called at exit).

    Refused (:class:`RunFolderError`, naming the folder and what to do): a folder another live run holds (its
    ``.hoformer.lock`` names the host and pid; a lock of a process that no longer exists on this host is stale and
    taken over, with a note), a path that is a file, and a folder that holds a finished run (checkpoints,
    ``pretrained/``) unless ``resume`` (a ``ckpt_path`` continues it) or ``overwrite`` (its files are replaced as the
    new run writes them)."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise RunFolderError(f"{fn}: the run folder {str(root)!r} (trainer.default_root_dir) is a file; expected a "
                             "directory (or a path that does not exist yet)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError(f"{fn}: cannot create the run folder {str(root)!r} (trainer.default_root_dir): "
                             f"{e.strerror or e}") from e
    lock = root / LOCK_NAME
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _read_lock(lock)
            if other is None and not lock.exists():  # released meanwhile
                continue
            if other is None:  # empty or garbage: what a kill between the lock's creation and its write leaves
                print(f"{fn}: taking over the lock file {lock}, which names no run (it is empty or not a lock "
                      "hoformer wrote: left by a run killed while it took the folder)", file=sys.stderr)
                lock.unlink(missing_ok=True)
                continue
            pid, host = other.get("pid"), other.get("host")
            mine = pid == os.getpid() and host == me["host"] and str(lock) not in _HELD  # an earlier call that died
            stale = host == me["host"] and (mine or not pid_alive(pid))
            if not stale:
                raise RunFolderError(
                    f"{fn}: the run folder {str(root)!r} is in use by another run (pid {pid} on {host}, started "
                    f"{other.get('started')}; lock file {str(lock)!r}); two runs in one folder overwrite each "
                    "other's checkpoints and exports. Give this run its own --trainer.default_root_dir, or wait for "
                    "that run to end (delete the lock file only if that run is gone)") from None
            print(f"{fn}: taking over the stale lock {lock} (pid {pid} is no longer running)", file=sys.stderr)
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    _HELD.add(str(lock))

    def release() -> None:
        if str(lock) in _HELD:
            _HELD.discard(str(lock))
            lock.unlink(missing_ok=True)

    atexit.register(release)
    done = _finished_run(root)
    if done and not (resume or overwrite):
        release()
        raise RunFolderError(
            f"{fn}: the run folder {str(root)!r} holds a finished run ({', '.join(done[:4])}); a new fit would "
            "overwrite it. Resume it (--ckpt_path <folder>/checkpoints/last.ckpt), give this run its own "
            "--trainer.default_root_dir, or replace it with --overwrite true")
    return release
