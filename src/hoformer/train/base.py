"""Shared LightningModule base for every hoformer task.

Subclasses implement ``shared_step(batch, stage) -> loss`` and log their metrics; this base builds the model
from the registry, configures AdamW with linear warm-up + cosine decay, and exports weights with
``save_pretrained`` so a trained run is usable without Lightning.
"""
from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch

from hoformer.models import create_model

__all__ = ["TaskModule"]


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

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def shared_step(self, batch, stage: str) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

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
        total = max(1, int(self.trainer.estimated_stepping_batches))
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
