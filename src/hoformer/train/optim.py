"""The optimiser and learning-rate schedule of every task, in one place (:class:`Optimization`).

A task takes ``optim: Optimization`` (its own defaults, e.g. the HOT paper's lr 2e-4 / weight decay 0.1 for
forecasting); in a config only the fields that differ are written::

    model:
      class_path: hoformer.train.ForecastingTask
      init_args:
        optim: {lr: 1.0e-3, warmup_steps: 100}

``hoformer fit --help`` lists every field with its type and default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["Optimization", "configure_optimization"]


@dataclass
class Optimization:
    """Optimiser and learning-rate schedule.

    Args:
        optimizer: ``"adamw"`` (decoupled weight decay, none on biases and norm / 1-D parameters) or ``"adam"``
            (``weight_decay`` as an L2 penalty on every parameter, Weaver section 6.1).
        lr: peak learning rate.
        weight_decay: weight decay (AdamW) or L2 coefficient (Adam).
        betas: Adam betas.
        warmup_steps: linear warm-up steps (per optimiser step).
        warmup_ratio: linear warm-up over this fraction of the run's optimiser steps (``0.1``: the first 10 %), the
            same whatever the data size; give it or ``warmup_steps``, not both.
        schedule: ``"cosine"`` decay to ``min_lr_ratio * lr`` over the run (per step; needs a bounded run),
            ``"constant"``, or ``"exponential"``: ``lr * gamma ** epoch`` (per epoch, Weaver: gamma 0.9).
        min_lr_ratio: floor of the cosine schedule, relative to ``lr``.
        gamma: per-epoch factor of the exponential schedule.
        fused: PyTorch's fused (one-kernel) Adam / AdamW step: ``None`` (default) uses it when every parameter is on
            the CPU or every one on a CUDA device (per-parameter loops and kernel launches dominate the default step
            of small models), except with mixed precision and gradient clipping, which Lightning refuses for a fused
            step; the arithmetic is the same as the default implementation's up to float rounding.
    """

    optimizer: Literal["adamw", "adam"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    schedule: Literal["cosine", "constant", "exponential"] = "cosine"
    min_lr_ratio: float = 0.01
    gamma: float = 0.9
    fused: bool | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in ("adamw", "adam"):
            raise ValueError(f"Optimization: `optimizer` must be 'adamw' or 'adam', got {self.optimizer!r}")
        if self.schedule not in ("cosine", "constant", "exponential"):
            raise ValueError(f"Optimization: `schedule` must be 'cosine', 'constant' or 'exponential', got "
                             f"{self.schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"Optimization: `lr` must be > 0, got {self.lr!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"Optimization: `warmup_steps` must be an int >= 0, got {self.warmup_steps!r}")
        if self.fused is not None and not isinstance(self.fused, bool):
            raise TypeError(f"Optimization: `fused` must be True, False or None (the default's choice), got "
                            f"{self.fused!r}")
        if isinstance(self.warmup_ratio, bool) or not isinstance(self.warmup_ratio, (int, float)) \
                or not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"Optimization: `warmup_ratio` must be a fraction in [0, 1) of the run's steps, got "
                             f"{self.warmup_ratio!r}")
        if self.warmup_ratio and self.warmup_steps:
            raise ValueError(f"Optimization: give `warmup_steps` ({self.warmup_steps}) or `warmup_ratio` "
                             f"({self.warmup_ratio}), not both")
        self.betas = tuple(self.betas)


def configure_optimization(opt: Optimization, model: torch.nn.Module, total_steps: float, owner: str = "task",
                           may_fuse: bool = True):
    """``configure_optimizers`` output for ``model``'s trainable parameters (``None`` without any): the optimiser of
    ``opt`` and its schedule; ``total_steps``: the run's optimiser steps (``trainer.estimated_stepping_batches``);
    ``may_fuse``: whether ``opt.fused=None`` may choose the fused step (False under mixed precision with gradient
    clipping)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return None
    devices = {p.device.type for _, p in named}
    fused = (may_fuse and devices in ({"cpu"}, {"cuda"})) if opt.fused is None else opt.fused
    if opt.optimizer == "adam":
        optimizer = torch.optim.Adam([p for _, p in named], lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay,
                                     fused=fused)
    else:
        decay = [p for n, p in named if not (p.ndim < 2 or n.endswith(".bias"))]
        no_decay = [p for n, p in named if p.ndim < 2 or n.endswith(".bias")]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": opt.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=opt.lr, betas=opt.betas,
                                      fused=fused)
    if opt.schedule == "exponential":
        sched = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=opt.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
    if opt.schedule == "constant" and opt.warmup_steps == 0 and opt.warmup_ratio == 0:
        return optimizer
    if opt.schedule == "cosine" and not math.isfinite(total_steps):
        raise ValueError(f"{owner}: schedule='cosine' decays over the whole run, which needs a finite trainer "
                         "`max_epochs` or `max_steps` (got an unbounded run); use schedule='constant' for open-ended "
                         "training")
    if opt.warmup_ratio and not math.isfinite(total_steps):
        raise ValueError(f"{owner}: warmup_ratio={opt.warmup_ratio} is a fraction of the run's steps, which needs a "
                         "finite trainer `max_epochs` or `max_steps`; give warmup_steps instead")
    total = max(1, int(total_steps)) if math.isfinite(total_steps) else 1
    warm = int(round(opt.warmup_ratio * total, 6)) if opt.warmup_ratio else opt.warmup_steps
    if math.isfinite(total_steps) and warm >= total:
        import warnings

        warnings.warn(f"{owner}: warmup_steps={warm} is not shorter than the run ({total} optimiser steps): the "
                      "learning rate never reaches its peak `lr`; give warmup_ratio (a fraction of the run) instead",
                      stacklevel=2)
    floor, cosine = opt.min_lr_ratio, opt.schedule == "cosine"

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if not cosine:
            return 1.0
        t = min(1.0, (step - warm) / max(1, total - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
