"""Imbalanced classes: class-weighted cross-entropy and balanced accuracy for the classification tasks.

With 11 % positives (VesselMNIST3D) an unweighted classifier can predict the majority class only and still report
89 % accuracy. The classification tasks therefore take ``class_weight``:

* ``None`` (default): plain cross-entropy;
* ``"balanced"``: weight ``w_c = N / (K * n_c)`` for class ``c`` with ``n_c`` of the ``N`` training labels (the
  scikit-learn rule; a class absent from the training data gets weight 0), counted once from the training batches
  at the start of ``fit`` and kept in the checkpoint, so a resumed or tested run uses the same weights;
* a list of ``K`` non-negative floats: those weights.

and log ``{stage}/bacc``, the balanced accuracy (mean recall over the classes present in the targets, see
:class:`BalancedAccuracy`), beside ``{stage}/acc``. A majority-class predictor has a balanced accuracy of ``1 / K``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torchmetrics import Metric

from hoformer.compat import load_train_data_early

__all__ = ["BalancedAccuracy", "check_class_weight", "balanced_class_weights", "count_labels", "ClassWeighting"]


class BalancedAccuracy(Metric):
    """Mean per-class recall over the classes that occur in the targets (balanced accuracy).

    ``update(preds, target)``: ``preds`` are scores ``(N, K)`` (argmax) or, for ``num_classes == 2``, probabilities
    of class 1 ``(N,)`` (threshold 0.5); ``target`` class ids ``(N,)``.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        self.add_state("correct", torch.zeros(self.num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(self.num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        pred = preds.argmax(-1) if preds.ndim == target.ndim + 1 else (preds > 0.5).long()
        target = target.long()
        self.total += torch.bincount(target, minlength=self.num_classes)[: self.num_classes]
        self.correct += torch.bincount(target[pred == target], minlength=self.num_classes)[: self.num_classes]

    def compute(self) -> torch.Tensor:
        present = self.total > 0
        if not bool(present.any()):
            return torch.tensor(float("nan"), device=self.total.device)
        return (self.correct[present].double() / self.total[present].double()).mean().float()


def check_class_weight(fn: str, class_weight: Any, num_classes: int) -> None:
    """``class_weight`` must be None, ``"balanced"`` or ``num_classes`` finite non-negative floats (not all 0)."""
    if class_weight is None or class_weight == "balanced":
        return
    if isinstance(class_weight, str) or not isinstance(class_weight, Iterable):
        raise ValueError(f"{fn}: `class_weight` must be None, 'balanced' or a list of {num_classes} non-negative "
                         f"floats, got {class_weight!r}")
    w = list(class_weight)
    if len(w) != num_classes or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in w):
        raise ValueError(f"{fn}: `class_weight` must hold {num_classes} numbers (one per class), got {w!r}")
    if any(not math.isfinite(x) or x < 0 for x in w) or not any(w):
        raise ValueError(f"{fn}: `class_weight` entries must be finite, >= 0 and not all 0, got {w!r}")


def count_labels(batches: Iterable, labels_of: Callable[[Any], torch.Tensor], num_classes: int) -> torch.Tensor:
    """Per-class counts ``(num_classes,)`` of the labels in ``batches`` (``labels_of(batch)`` -> class ids)."""
    counts = torch.zeros(num_classes, dtype=torch.long)
    for batch in batches:
        y = labels_of(batch).reshape(-1).long().cpu()
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(f"class_weight='balanced': training labels must lie in [0, {num_classes}), got values "
                             f"{torch.unique(y[(y < 0) | (y >= num_classes)])[:5].tolist()}")
        counts += torch.bincount(y, minlength=num_classes)
    return counts


def balanced_class_weights(counts: torch.Tensor) -> torch.Tensor:
    """``N / (K * n_c)`` per class (0 for a class with no sample)."""
    counts = counts.double()
    n, k = counts.sum(), counts.numel()
    if n == 0:
        raise ValueError("class_weight='balanced': the training data holds no labels")
    w = torch.where(counts > 0, n / (k * counts.clamp_min(1)), torch.zeros_like(counts))
    return w.float()


class ClassWeighting:
    """Mixin of a classification :class:`~hoformer.train.TaskModule` whose ``hparams.class_weight`` weights its
    cross-entropy. Call :meth:`_init_class_weight` in ``__init__`` and pass :meth:`class_weights` as ``weight``;
    implement :meth:`_train_labels` (the class ids of a training batch)."""

    def _init_class_weight(self, class_weight: Any, num_classes: int) -> None:
        check_class_weight(type(self).__name__, class_weight, num_classes)
        w = torch.tensor([float(x) for x in class_weight]) if class_weight not in (None, "balanced") else None
        # not in the state_dict (older checkpoints stay loadable); "balanced" weights travel in the checkpoint dict
        self.register_buffer("_class_w", w, persistent=False)

    def _train_labels(self, batch) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def class_weights(self) -> torch.Tensor | None:
        """The cross-entropy weights ``(K,)`` (None: unweighted). ``"balanced"`` ones are counted at first use (the
        first training or sanity-check step of ``fit``) from the trainer's training data."""
        if self.hparams.class_weight == "balanced" and self._class_w is None:
            self._class_w = self._count_balanced().to(self.device)
        return self._class_w

    def _count_balanced(self, loader=None) -> torch.Tensor:
        """Balanced weights from the labels of ``loader`` (default: the trainer's training data, whichever way
        ``fit`` was given it: loaders or a datamodule)."""
        trainer = self._trainer
        if loader is None and trainer is not None:
            load_train_data_early(trainer)  # not loaded yet during the sanity check before the first epoch
            loader = trainer.train_dataloader
        if loader is None:
            raise ValueError(f"{type(self).__name__}: class_weight='balanced' counts the training labels, but "
                             "no training data is attached (fit first, or pass explicit weights)")
        with torch.random.fork_rng(devices=[]):  # counting must not move the RNG of the run
            counts = count_labels(loader, self._train_labels, int(self.num_classes))
        weights = balanced_class_weights(counts)
        if trainer is None or trainer.is_global_zero:
            import sys

            print(f"{type(self).__name__}: class_weight='balanced': training label counts {counts.tolist()} -> "
                  f"cross-entropy weights {[round(w, 4) for w in weights.tolist()]}", file=sys.stderr)
        return weights

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self._class_w is not None:
            checkpoint["class_weights"] = self._class_w.detach().cpu()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if "class_weights" in checkpoint:
            self._class_w = checkpoint["class_weights"].to(self.device)
