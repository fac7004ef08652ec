"""Traffic forecasting task (Weaver section 5.4 / 6.1): masked MAE loss on the original scale; MAE / MAPE / RMSE
logged over all horizon steps and at steps 3 / 6 / 12 (15 / 30 / 60 minutes).

Batches are the windowed-series dicts of :mod:`hoformer.data.series` (``x``, ``y`` on the model's scale, ``mask`` /
``y_mask``, ``time``, ``mean`` / ``std``); loss and metrics are computed on the original scale ``y * std + mean``.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import TaskModule
from .metrics import MaskedMAE, forecasting_metrics, masked_mae

__all__ = ["TrafficForecastingTask", "forecast", "original_scale"]


def original_scale(t: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``t (B, Q, N, C)`` on the model's scale -> the original scale, with the batch's scaler statistics."""
    return t * batch["std"][:, None, None, :] + batch["mean"][:, None, None, :]


def forecast(model: torch.nn.Module, batch: dict[str, torch.Tensor], use_time: bool = True) -> torch.Tensor:
    """Run ``model`` on a batch and return predictions on the original scale ``(B, Q, N, C)``."""
    out = model(batch["x"], time=batch.get("time") if use_time else None, mask=batch.get("mask"))
    return original_scale(out, batch)


class TrafficForecastingTask(TaskModule):
    """Lightning task for ``(B, P, N, C) -> (B, Q, N, C)`` forecasters from the registry.

    Args (besides :class:`~hoformer.train.base.TaskModule`'s):
        horizons: 1-based horizon steps with separate metrics.
        use_time: pass the batch's TOD/DOW features to the model.
        exp_gamma: if set, use the paper's optimiser instead of the base AdamW + cosine: Adam (``weight_decay``
            as L2) with an exponential learning-rate decay ``gamma`` per epoch (section 6.1: 0.9).
    """

    def __init__(self, model_name: str = "weaver", model_kwargs: dict[str, Any] | None = None, lr: float = 1e-3,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 0,
                 scheduler: str = "cosine", min_lr_ratio: float = 0.01, horizons: tuple[int, ...] = (3, 6, 12),
                 use_time: bool = True, exp_gamma: float | None = None) -> None:
        super().__init__(model_name, model_kwargs, lr, weight_decay, betas, warmup_steps, scheduler, min_lr_ratio)
        self.use_time, self.exp_gamma = use_time, exp_gamma
        self.val_metrics = forecasting_metrics(tuple(horizons), prefix="val/")
        self.test_metrics = forecasting_metrics(tuple(horizons), prefix="test/")
        # `val/loss` / `test/loss` (the configs' checkpoint monitor): the epoch's masked MAE over every observed entry,
        # not a mean of per-batch means, which would depend on the batch size and the DDP split when data is missing
        self.eval_loss = torch.nn.ModuleDict({"val": MaskedMAE(), "test": MaskedMAE()})

    def shared_step(self, batch, stage: str):
        pred = forecast(self.model, batch, self.use_time)
        y, m = original_scale(batch["y"], batch), batch["y_mask"]
        loss = masked_mae(pred, y, m, allow_empty=True)  # 0 for an all-missing batch (only drop_empty_windows=False)
        bs = y.shape[0]
        if stage == "train":
            if not loss.requires_grad:  # parameter-free baseline
                return None
            self.log("train/loss", loss, prog_bar=True, batch_size=bs)
            return loss
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        metrics.update(pred.detach(), y, m)
        self.eval_loss[stage].update(pred.detach(), y, m)
        self.log(f"{stage}/loss", self.eval_loss[stage], prog_bar=stage == "val", batch_size=bs)
        self.log_dict(metrics, batch_size=bs)
        return loss

    def configure_optimizers(self):
        if not any(p.requires_grad for p in self.model.parameters()):
            return None
        if self.exp_gamma is None:
            return super().configure_optimizers()
        opt = torch.optim.Adam(self.model.parameters(), lr=self.hparams.lr, betas=tuple(self.hparams.betas),
                               weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=self.exp_gamma)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
