"""Stopping a run at an epoch boundary before a wall-clock deadline, so that it resumes exactly.

Lightning's ``max_time`` stops inside an epoch (a checkpoint written there cannot be resumed exactly) and counts the
time of earlier attempts after a resume. :class:`Deadline` instead measures each epoch (training and validation) and
stops after the last epoch that ends before the deadline, once that epoch's ``last.ckpt`` is written; ``fit
--ckpt_path <run>/checkpoints/last.ckpt`` then continues as if the run had never stopped. Whether the deadline or the
run's own end (``max_epochs``, early stopping) stopped it is written to ``<default_root_dir>/deadline.json``, with the
measured epoch and step times (what a scheduler needs to plan the next attempt).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import lightning.pytorch as pl

from hoformer._io import atomic_write
from hoformer.train.guards import stopped_early

__all__ = ["Deadline"]


def _timestamp(at: float | str) -> float:
    """``at`` as a Unix time; a ``ValueError`` naming it for anything else, NaN and infinities included (a NaN
    deadline would never stop a run: every comparison with it is False)."""
    expected = "a Unix time (seconds) or an ISO 8601 date-time (e.g. '2026-11-27T18:00:00+00:00')"
    if isinstance(at, str):
        try:
            t = datetime.fromisoformat(at).timestamp()
        except ValueError:
            try:
                t = float(at)
            except ValueError:
                raise ValueError(f"Deadline: `at` must be {expected}, got {at!r}") from None
    elif isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(f"Deadline: `at` must be {expected}, got {type(at).__name__} {at!r}")
    else:
        t = float(at)
    if not math.isfinite(t):
        raise ValueError(f"Deadline: `at` must be {expected}, got {at!r}, which is no point in time (a NaN or "
                         "infinite deadline never stops the run; leave the callback out for a run without one)")
    return t


class Deadline(pl.Callback):
    """Stop training after the last epoch that can finish before ``at``.

    Args:
        at: the deadline, as a Unix time (seconds) or an ISO 8601 date-time string.
        margin: the next epoch is started only if ``now + margin * (duration of the slowest epoch so far)`` is before
            the deadline (1.2: 20% head room for a slower epoch and the checkpoint write).

    The first epoch of an attempt always runs (its duration is not known before): a deadline already past when
    training starts is said on stderr, and that attempt stops after one epoch. NaN and infinite deadlines are
    refused.

    After ``fit``, ``<default_root_dir>/deadline.json`` holds ``{"stopped_by_deadline": bool, "epochs_done": int,
    "epoch_s": [seconds of each epoch of this attempt], "step_s": median seconds of a training step after the first,
    "train_batches": batches of a full training epoch}``; ``stopped_by_deadline`` is False when the run ended by itself.
    """

    def __init__(self, at: float | str, margin: float = 1.2) -> None:
        if margin < 1:
            raise ValueError(f"Deadline: margin must be >= 1 (a multiple of an epoch's duration), got {margin}")
        self.at = _timestamp(at)
        self.margin = float(margin)
        self.stopped = False
        self.epoch_s: list[float] = []
        self._t0 = 0.0
        self._step_t0 = 0.0
        self.step_s: list[float] = []
        self.train_batches: float = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        late = time.time() - self.at
        if late > 0 and trainer.is_global_zero:
            when = datetime.fromtimestamp(self.at).astimezone().isoformat(timespec="seconds")
            print(f"Deadline: at={when} is {late:.0f} s in the past: no epoch can end before it, so this attempt "
                  "trains one epoch, writes its last.ckpt and stops (a later attempt resumes it with --ckpt_path "
                  "<run>/checkpoints/last.ckpt)", file=sys.stderr, flush=True)
        try:  # the loader's length, whatever limit_train_batches / max_steps cut of it in this attempt
            self.train_batches = len(trainer.train_dataloader)
        except TypeError:  # an iterable loader without a length
            self.train_batches = trainer.num_training_batches

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.monotonic()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        self._step_t0 = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if len(self.step_s) < 64:  # enough for a median; nothing grows over a long run
            self.step_s.append(time.monotonic() - self._step_t0)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # runs after the epoch's validation (which happens inside the training epoch) and before the checkpoint
        # callbacks' own on_train_epoch_end (Lightning calls checkpoint callbacks last)
        self.epoch_s.append(time.monotonic() - self._t0)
        if not trainer.should_stop and time.time() + self.margin * max(self.epoch_s) > self.at:
            trainer.should_stop = True
            self.stopped = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            # an epoch that both the deadline and early stopping stopped ended the run by itself
            report = {"stopped_by_deadline": self.stopped and stopped_early(trainer) is None,
                      "epochs_done": trainer.current_epoch,
                      "epoch_s": [round(s, 2) for s in self.epoch_s], "deadline": self.at,
                      "step_s": round(statistics.median(self.step_s[1:] or self.step_s or [0.0]), 5),
                      "train_batches": self.train_batches}
            atomic_write(Path(trainer.default_root_dir) / "deadline.json",
                         lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1)))
