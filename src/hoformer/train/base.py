"""Shared LightningModule base for every hoformer task.

Subclasses implement ``shared_step(batch, stage) -> loss`` and log their metrics; this base builds the model
from the registry, configures AdamW with linear warm-up + cosine decay, and exports weights with
``save_pretrained`` so a trained run is usable without Lightning. Each training epoch's shuffling, dropout and
random augmentations (in the main process and in ``DataLoader`` workers) are drawn from ``(seed, epoch)``, so a run
resumed from an epoch-boundary checkpoint continues exactly.
"""
from __future__ import annotations

import inspect
import math
import os
import random
from typing import Any

import numpy as np

import lightning as L
import torch
from torch.utils.data import DataLoader, RandomSampler

from hoformer._checks import check_values
from hoformer.compat import sync_dist_batch_size
from hoformer.models import create_model

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
    """Base task.

    Args:
        model_name: registered model name (see ``hoformer.models.list_models()``).
        model_kwargs: keyword arguments of ``create_model``.
        lr, weight_decay, betas: AdamW settings.
        warmup_steps: linear warm-up steps; then cosine decay to ``min_lr_ratio * lr`` over the run
            (``scheduler="cosine"``), or a constant rate (``scheduler="constant"``).
    """

    def __init__(
        self,
        model_name: str,
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        scheduler: str = "cosine",
        min_lr_ratio: float = 0.01,
    ) -> None:
        super().__init__()
        if scheduler not in ("cosine", "constant"):
            raise ValueError(f"scheduler must be 'cosine' or 'constant', got {scheduler!r}")
        self.save_hyperparameters()
        self.model = create_model(model_name, **(model_kwargs or {}))
        self.example_input_array = _one_sample_input(self.model)

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

    def configure_callbacks(self):
        """A :class:`~hoformer.train.guards.NonFiniteGuard` and a :class:`~hoformer.train.guards.CleanStaleTempFiles`
        (each unless the trainer has one)."""
        from .guards import default_callbacks

        return default_callbacks(self._trainer)

    def training_step(self, batch, batch_idx):
        return self.shared_step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self.shared_step(batch, "val")

    def test_step(self, batch, batch_idx):
        return self.shared_step(batch, "test")

    def configure_optimizers(self):
        hp = self.hparams
        decay, no_decay = [], []
        for n, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 or n.endswith(".bias") else decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=tuple(hp.betas),
        )
        if hp.scheduler == "constant" and hp.warmup_steps == 0:
            return opt
        total = self.trainer.estimated_stepping_batches
        if hp.scheduler != "constant" and not math.isfinite(total):
            raise ValueError(f"{type(self).__name__}: scheduler='cosine' decays over the whole run, which needs a "
                             "finite trainer `max_epochs` or `max_steps` (got an unbounded run); use "
                             "scheduler='constant' for open-ended training")
        total = max(1, int(total)) if math.isfinite(total) else 1
        warm = int(hp.warmup_steps)

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            if hp.scheduler == "constant":
                return 1.0
            t = min(1.0, (step - warm) / max(1, total - warm))
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def save_pretrained(self, directory):
        return self.model.save_pretrained(directory)
