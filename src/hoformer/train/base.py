"""Shared LightningModule base for every hoformer task.

Subclasses implement ``shared_step(batch, stage) -> loss`` and log their metrics; this base holds the model (a typed
argument: a LightningCLI config names its class and arguments), configures the optimiser and schedule of
:class:`~hoformer.train.optim.Optimization`, and exports weights with
``save_pretrained`` so a trained run is usable without Lightning. Each training epoch's shuffling, dropout and
random augmentations (in the main process and in ``DataLoader`` workers) are drawn from ``(seed, epoch)``, so a run
resumed from an epoch-boundary checkpoint continues exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import random
from typing import Any

import numpy as np

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, RandomSampler

from hoformer._checks import check_values
from hoformer.compat import sync_dist_batch_size
from hoformer.models import HoformerModel

from .optim import Optimization, configure_optimization

__all__ = ["TaskModule"]


def check_labels(y: torch.Tensor, num_classes: int, fn: str, ignore_index: int | None = None) -> None:
    """Class labels must lie in ``[0, num_classes)`` (``ignore_index`` allowed): an out-of-range label would be an
    opaque device-side assert on CUDA and an ``IndexError`` inside ``cross_entropy`` on CPU. No host sync off the CPU
    (:func:`hoformer._checks.check_values`)."""
    bad = (y < 0) | (y >= num_classes)
    if ignore_index is not None:
        bad &= y != ignore_index
    allowed = f" (or ignore_index={ignore_index})" if ignore_index is not None else ""
    check_values(~bad.any(), f"{fn}: labels must lie in [0, num_classes={num_classes}){allowed}{{detail}}; check "
                 "the dataset's classes against `num_classes`",
                 lambda: f", got {int(bad.sum())} label(s) outside it, values {torch.unique(y[bad])[:5].tolist()}")


def integer_labels(y: torch.Tensor, fn: str, expected: str) -> torch.Tensor:
    """``y`` as int64 class ids; floating-point (e.g. one-hot or soft) labels raise instead of being truncated."""
    if y.is_floating_point() or y.is_complex():
        raise TypeError(f"{fn}: labels must be integer class ids {expected}, got dtype {y.dtype} with shape "
                        f"{tuple(y.shape)} (one-hot or soft labels: pass their argmax)")
    return y.long()


def _one_sample_input(model) -> Any:
    """A one-sample input of ``model`` (its ``example_inputs``) as ``LightningModule.example_input_array``: Lightning's
    model summary then lists input / output sizes and the FLOPs of one forward instead of "Total FLOPs: 0"."""
    with torch.random.fork_rng(devices=[]):  # building a task must not move the global RNG (random example data)
        args, kwargs = model.example_inputs(batch_size=1)
    if kwargs:
        return dict(inspect.signature(model.forward).bind(*args, **kwargs).arguments)
    return args[0] if len(args) == 1 else tuple(args)


class TaskModule(L.LightningModule):
    """Base task: a model and how to optimise it; subclasses add their loss and metrics.

    Args:
        model: the model (any :class:`~hoformer.models.HoformerModel`: ``HOTForecaster(...)``,
            ``create_model("hot_forecaster", ...)``, a LightningCLI ``class_path`` / ``init_args``).
        optim: optimiser and learning-rate schedule (:class:`~hoformer.train.optim.Optimization`).

    The checkpoint's hyper-parameters record the model's ``config`` (``model_config``: registered name and
    constructor arguments) and ``optim`` as a dict, so :mod:`hoformer.checkpoint` rebuilds the model without the task.
    The checkpoint also records the datamodule's ``data_signature()`` (file, columns, lookback, horizon, scaler
    statistics, ...) when it has one: a restore (``ckpt_path=``) onto other data is refused
    (:func:`hoformer.checkpoint.check_checkpoint_data`) unless :attr:`allow_data_mismatch` is set.

    Checkpoints load weights-only whoever builds the ``Trainer``: :meth:`setup` (which Lightning runs before any
    restore) installs :class:`~hoformer.train.checkpoint_io.AtomicCheckpointIO` (:func:`~hoformer.train.checkpoint_io.install_checkpoint_io`);
    a subclass that overrides ``setup`` calls ``super().setup(stage)``.
    """

    #: ``(metric, mode)`` the task's model selection uses (the CLI's best checkpoint); ``None``: the last epoch
    selection: tuple[str | None, str] = (None, "min")
    #: restore a checkpoint onto data other than its own (``hoformer test --allow_data_mismatch true``): warn instead
    #: of refusing
    allow_data_mismatch: bool = False

    def __init__(self, model: HoformerModel, optim: Optimization | None = None) -> None:
        super().__init__()
        if not isinstance(model, HoformerModel):
            raise TypeError(f"{type(self).__name__}: `model` must be a hoformer model (a HoformerModel such as "
                            "hoformer.models.create_model('hot_forecaster', ...)), got "
                            f"{type(model).__name__}")
        optim = optim if optim is not None else type(self).default_optim()
        if isinstance(optim, dict):
            optim = Optimization(**optim)
        if not isinstance(optim, Optimization):
            raise TypeError(f"{type(self).__name__}: `optim` must be an Optimization, got {type(optim).__name__}")
        self.save_hyperparameters(ignore=["model", "optim"])
        self.hparams["model_config"] = copy.deepcopy(model.config)
        self.hparams["optim"] = dataclasses.asdict(optim)
        self.model, self.optim = model, optim
        self.example_input_array = _one_sample_input(self.model)

    @classmethod
    def default_optim(cls) -> Optimization:
        """The task's ``optim`` when none is given: its constructor's default (written there only), else
        ``Optimization()``."""
        default = inspect.signature(cls.__init__).parameters["optim"].default
        return default if isinstance(default, Optimization) else Optimization()

    @property
    def model_name(self) -> str:
        """The model's registered name (``model.config["name"]``)."""
        return str(self.model.config.get("name", type(self.model).__name__))

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def shared_step(self, batch, stage: str) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _epoch_seed(self) -> int:
        """``(seed, epoch)`` -> seed; ``seed`` is Lightning's ``seed_everything`` one, else ``torch.initial_seed()``
        (a plain ``torch.manual_seed(s)`` of a Python-API user; a fixed 0 would give every such ``s`` the same
        shuffles, dropout masks and augmentations)."""
        base = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))
        return (base + 1_000_003 * (self.current_epoch + 1)) % (2**31 - 1)

    def on_train_epoch_start(self) -> None:
        """Reseed everything random in the coming epoch from ``(seed, epoch)``, before its first batch is fetched.

        * global RNGs (``random``, ``numpy``, ``torch``): dropout & co, and augmentations drawn in the main process;
        * the ``RandomSampler``'s generator (read lazily, at the first batch): shuffling;
        * the ``DataLoader``'s generator, from which its iterator draws the workers' base seed (worker ``i`` seeds
          its ``random`` / ``numpy`` / ``torch`` from it and ``i``) instead of drawing from the global RNG.

        Lightning creates the epoch's iterator after this hook, except for the first epoch of a run (fresh or
        resumed), where it does so before; hoformer's datamodules start their training iterator at the first batch
        and restart its workers each epoch (:mod:`hoformer.data._base`), so every epoch is exact with workers too.
        Other loaders are exact with ``num_workers=0``.
        """
        seed = self._epoch_seed()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        loaders = self.trainer.train_dataloader
        loaders = loaders.values() if isinstance(loaders, dict) else loaders if isinstance(loaders, (list, tuple)) \
            else [loaders]
        for dl in loaders:
            sampler = getattr(dl, "sampler", None)
            if isinstance(sampler, RandomSampler):
                sampler.generator = torch.Generator().manual_seed(seed)
            if isinstance(dl, DataLoader):
                dl.generator = torch.Generator().manual_seed(seed + 1)

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``LightningModule.log``; a ``sync_dist`` value with a ``batch_size`` counts each sample ``world_size`` times
        (:func:`hoformer.compat.sync_dist_batch_size`: exact DDP epoch means of uneven per-rank shares)."""
        super().log(name, value, *args, **sync_dist_batch_size(kwargs))

    def setup(self, stage: str) -> None:
        """Install the weights-only checkpoint IO before Lightning restores any ``ckpt_path``."""
        from .checkpoint_io import install_checkpoint_io

        if self._trainer is not None:
            install_checkpoint_io(self._trainer)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        from hoformer.checkpoint import DATA_SIGNATURE_KEY, data_signature

        signature = data_signature(getattr(self._trainer, "datamodule", None) if self._trainer is not None else None)
        if signature is not None:
            checkpoint[DATA_SIGNATURE_KEY] = signature

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Before Lightning loads the weights: a checkpoint of another model configuration, or trained on other data,
        is refused with an error naming what differs."""
        from hoformer.checkpoint import DATA_SIGNATURE_KEY, check_checkpoint_data, check_model_state

        trainer = self._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        where = f"{type(self).__name__}: checkpoint {str(path)!r}" if path else f"{type(self).__name__}: checkpoint"
        check_model_state(checkpoint, self, where)
        if trainer is not None and checkpoint.get(DATA_SIGNATURE_KEY) is not None:
            check_checkpoint_data(checkpoint[DATA_SIGNATURE_KEY], getattr(trainer, "datamodule", None), where=where,
                                  allow_mismatch=self.allow_data_mismatch,
                                  override="set `allow_data_mismatch = True` on the task (hoformer: "
                                           "--allow_data_mismatch true)")

    def configure_callbacks(self):
        """A :class:`~hoformer.train.guards.NonFiniteGuard` and a :class:`~hoformer.train.guards.CleanStaleTempFiles`
        (each unless the trainer has one)."""
        from .guards import default_callbacks

        return default_callbacks(self._trainer)

    def training_step(self, batch, batch_idx):
        try:
            loss = self.shared_step(batch, "train")
        except FloatingPointError as e:  # a layer's finite-output check (hoformer._checks.check_finite_output)
            raise self._diverged(e, batch) from e
        if isinstance(loss, torch.Tensor):  # the last two (no host read: converted only to report a failure)
            self._last_losses = [*getattr(self, "_last_losses", [])[-1:], (self.global_step, loss.detach())]
        return loss

    def current_lr(self) -> float | None:
        """The learning rate of the first optimiser's first parameter group now (after its schedule), if any."""
        trainer = self._trainer
        opts = getattr(trainer, "optimizers", None) if trainer is not None else None
        return float(opts[0].param_groups[0]["lr"]) if opts else None

    def last_finite_loss(self) -> tuple[int, float] | None:
        """``(global step, value)`` of the last finite one of the last two training losses this task returned."""
        for step, loss in reversed(getattr(self, "_last_losses", [])):
            value = float(loss.float().mean())
            if math.isfinite(value):
                return step, value
        return None

    def _diverged(self, e: FloatingPointError, batch) -> FloatingPointError:
        """A layer's "output not finite although the input is" in a training step after the weights have been
        updated: the training diverged (a learning rate too large, exploding gradients), not the data; the error
        names the step, the learning rate and the last finite loss. At step 0 (the weights as built) the layer's
        own message stands."""
        from .guards import NonFiniteError, _nonfinite_tensors

        step = self.global_step
        if isinstance(e, NonFiniteError) or step == 0 or _nonfinite_tensors(batch, "batch"):
            return e
        big = max(((n, p.detach().abs().max().item()) for n, p in self.model.named_parameters() if p.numel()),
                  key=lambda t: t[1] if math.isfinite(t[1]) else math.inf, default=None)
        weights = ""
        if big is not None:
            weights = (f"; the weights hold non-finite values (first in {big[0]!r})" if not math.isfinite(big[1])
                       else f"; the largest weight magnitude is {big[1]:.3g} (in {big[0]!r})")
        lr, last = self.current_lr(), self.last_finite_loss()
        lr_text = f" at learning rate {lr:.3g}" if lr is not None else ""
        last_text = (f"; the last finite training loss was {last[1]:.4g} at step {last[0]}" if last is not None
                     else "; no earlier step had a finite loss")
        layer = str(e).split(":", 1)[0]
        return NonFiniteError(
            f"{type(self).__name__}: training diverged at global step {step} (epoch {self.current_epoch}): the "
            f"activations of {layer} went non-finite after {step} optimizer step(s){lr_text}{weights}{last_text}. "
            "The batch is finite and the model was finite before training, so the optimisation, not the input, is the "
            "cause: lower the learning "
            "rate (optim.lr), warm up (optim.warmup_steps / warmup_ratio) or clip gradients "
            f"(--trainer.gradient_clip_val). The layer said: {e}")

    def validation_step(self, batch, batch_idx):
        return self.shared_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self.shared_step(batch, "test")

    def configure_optimizers(self):
        # Lightning refuses gradient clipping with a fused step under mixed precision (it unscales inside the step)
        clipped_mixed = bool(self.trainer.gradient_clip_val) and isinstance(self.trainer.precision_plugin,
                                                                            MixedPrecision)
        return configure_optimization(self.optim, self.model, self.trainer.estimated_stepping_batches,
                                      type(self).__name__, may_fuse=not clipped_mixed)

    def save_pretrained(self, directory):
        return self.model.save_pretrained(directory)
