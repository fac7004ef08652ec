"""Traffic forecasting task (Weaver section 5.4 / 6.1): masked MAE loss on the original scale; MAE / MAPE / RMSE
logged over all horizon steps and at steps 3 / 6 / 12 (15 / 30 / 60 minutes).

Batches are the windowed-series dicts of :mod:`hoformer.data.series` (``x``, ``y`` on the model's scale, ``mask`` /
``y_mask``, ``time``, ``mean`` / ``std``); loss and metrics are computed on the original scale
(:func:`hoformer.data.unscale`).
"""
from __future__ import annotations

import torch

from hoformer.data import unscale
from hoformer.models import HoformerModel

from .base import TaskModule
from .optim import Optimization
from .metrics import MaskedMAE, forecasting_metrics, masked_mae

__all__ = ["TrafficForecastingTask", "forecast", "original_scale"]

#: :func:`hoformer.data.unscale` under the name ``hoformer.train`` exports it by
original_scale = unscale


def forecast(model: torch.nn.Module, batch: dict[str, torch.Tensor], use_time: bool = True) -> torch.Tensor:
    """Run ``model`` on a batch and return predictions on the original scale ``(B, Q, N, C)``."""
    out = model(batch["x"], time=batch.get("time") if use_time else None, mask=batch.get("mask"))
    return unscale(out, batch)


class TrafficForecastingTask(TaskModule):
    """Lightning task for ``(B, P, N, C) -> (B, Q, N, C)`` forecasters.

    Args:
        model: the forecaster (e.g. ``Weaver``, ``TrafficTransformer``, the ``LastValue`` baseline).
        optim: see :class:`~hoformer.train.base.TaskModule`; the paper's optimiser (section 6.1) is
            ``Optimization(optimizer="adam", weight_decay=L2, schedule="exponential", gamma=0.9)``.
        horizons: 1-based horizon steps with separate metrics.
        use_time: pass the batch's TOD/DOW features to the model.
    """

    selection = ("val/loss", "min")

    def __init__(self, model: HoformerModel, optim: Optimization | None = Optimization(lr=1e-3, weight_decay=0.0),
                 horizons: tuple[int, ...] = (3, 6, 12), use_time: bool = True) -> None:
        super().__init__(model, optim)
        self.use_time = use_time
        self.val_metrics = forecasting_metrics(tuple(horizons), prefix="val/")
        self.test_metrics = forecasting_metrics(tuple(horizons), prefix="test/")
        # `val/loss` / `test/loss` (the configs' checkpoint monitor): the epoch's masked MAE over every observed entry,
        # not a mean of per-batch means, which would depend on the batch size and the DDP split when data is missing
        self.eval_loss = torch.nn.ModuleDict({"val": MaskedMAE(), "test": MaskedMAE()})

    def shared_step(self, batch, stage: str):
        pred = forecast(self.model, batch, self.use_time)
        y, m = unscale(batch["y"], batch), batch["y_mask"]
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
