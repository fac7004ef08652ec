"""Masked forecasting metrics (Weaver eqs 61, 64-66) as DDP-safe ``torchmetrics.Metric`` s.

Tensors are ``(B, Q, ...)`` with the horizon on dim 1; ``mask`` is bool, True = observed (missing targets are
excluded from numerator *and* count). ``at=h`` restricts a metric to horizon step ``h`` (1-based: 3, 6, 12 =
15/30/60 minutes at 5-minute sampling), ``upto=h`` to the first ``h`` steps (the ``h``-step forecast inside a longer
one: ETTh1's 96 / 192 / 336 prefixes of a 720-step forecast); neither: every observed entry of all steps.
States are (sum, count) pairs reduced by summation across processes, so the DDP result equals the
single-process one exactly (no mean of means).
"""
from __future__ import annotations

import torch
from torchmetrics import Metric

from hoformer._checks import check_values, is_int

__all__ = ["masked_mae", "MaskedMAE", "MaskedMSE", "MaskedMAPE", "MaskedRMSE", "PrefixAverage", "forecasting_metrics"]


def _check(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None, fn: str) -> torch.Tensor:
    if pred.shape != target.shape:
        raise ValueError(f"{fn}: `pred` {tuple(pred.shape)} and `target` {tuple(target.shape)} must have the same shape")
    if mask is None:
        return torch.ones_like(target, dtype=torch.bool)
    if mask.dtype != torch.bool or mask.shape != target.shape:
        raise ValueError(f"{fn}: `mask` must be a bool tensor of shape {tuple(target.shape)}, got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    return mask


def masked_mae(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None, *,
               allow_empty: bool = False) -> torch.Tensor:
    """Mean absolute error over observed entries (eq 61 with the TSL mask). An all-missing batch raises (an
    asynchronous device-side assert off the CPU), or gives 0 with ``allow_empty`` (what the traffic task uses: no
    host sync per step, and such batches exist only with ``drop_empty_windows=False``)."""
    mask = _check(pred, target, mask, "masked_mae")
    n = mask.sum()
    if not allow_empty:
        check_values(n > 0, "masked_mae: every target value is missing (all-missing window); the loss is undefined")
    return ((pred - target).abs() * mask).sum() / n.clamp_min(1)


class _MaskedMetric(Metric):
    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, at: int | None = None, upto: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        name = type(self).__name__
        if at is not None and (not is_int(at) or at < 1):
            raise ValueError(f"{name}: `at` must be a 1-based horizon step or None, got {at!r}")
        if upto is not None and (not is_int(upto) or upto < 1):
            raise ValueError(f"{name}: `upto` must be a number of horizon steps >= 1 or None, got {upto!r}")
        if at is not None and upto is not None:
            raise ValueError(f"{name}: give `at` (one step) or `upto` (the first steps), not both; got at={at}, "
                             f"upto={upto}")
        self.at, self.upto = at, upto
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _err(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _valid(self, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mask

    def update(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        mask = _check(pred, target, mask, type(self).__name__)
        if self.at is not None:
            if pred.ndim < 2 or self.at > pred.shape[1]:
                raise ValueError(f"{type(self).__name__}: at={self.at} but the horizon (dim 1) of `pred` "
                                 f"{tuple(pred.shape)} is shorter")
            pred, target, mask = pred[:, self.at - 1], target[:, self.at - 1], mask[:, self.at - 1]
        if self.upto is not None:
            if pred.ndim < 2 or self.upto > pred.shape[1]:
                raise ValueError(f"{type(self).__name__}: upto={self.upto} but the horizon (dim 1) of `pred` "
                                 f"{tuple(pred.shape)} is shorter")
            pred, target, mask = pred[:, :self.upto], target[:, :self.upto], mask[:, :self.upto]
        pred, target = pred.double(), target.double()
        mask = self._valid(target, mask)
        self.total += (self._err(pred, target) * mask).sum()
        self.count += mask.sum()

    def _finish(self, mean: torch.Tensor) -> torch.Tensor:
        return mean

    def compute(self) -> torch.Tensor:
        if self.count == 0:
            raise ValueError(f"{type(self).__name__}(at={self.at}, upto={self.upto}): no observed target value was "
                             "seen (all-missing data); the metric is undefined")
        return self._finish(self.total / self.count).float()


class MaskedMAE(_MaskedMetric):
    """Masked mean absolute error (eq 64)."""

    def _err(self, pred, target):
        return (pred - target).abs()


class MaskedMSE(_MaskedMetric):
    """Masked mean squared error: the pooled squared error over the observed entries."""

    def _err(self, pred, target):
        return (pred - target) ** 2


class MaskedRMSE(_MaskedMetric):
    """Masked root mean squared error (eq 66): ``sqrt`` of the pooled masked MSE."""

    def _err(self, pred, target):
        return (pred - target) ** 2

    def _finish(self, mean):
        return mean.sqrt()


class MaskedMAPE(_MaskedMetric):
    """Masked mean absolute percentage error in % (eq 65); targets with ``|y| <= eps`` are also excluded."""

    def __init__(self, at: int | None = None, eps: float = 1e-5, **kwargs) -> None:
        super().__init__(at=at, **kwargs)  # `upto` through kwargs
        self.eps = eps

    def _valid(self, target, mask):
        return mask & (target.abs() > self.eps)

    def _err(self, pred, target):
        return ((pred - target) / torch.where(target.abs() > self.eps, target, torch.ones_like(target))).abs()

    def _finish(self, mean):
        return 100.0 * mean


class PrefixAverage(Metric):
    """The average over ``horizons`` of the masked error over each horizon's first ``h`` steps: one number for a
    forecast that answers several horizons at once (the HOT protocol's selection metric: the mean of the 96 / 192 /
    336 / 720-step validation MAEs of one 720-step forecast). ``error``: ``"mae"`` or ``"mse"``. Each prefix keeps
    its own (sum, count) state, so the result equals the mean of the ``MaskedMAE(upto=h)`` values exactly."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, horizons, error: str = "mae", **kwargs) -> None:
        super().__init__(**kwargs)
        horizons = list(horizons)
        if not horizons or not all(is_int(h) and h >= 1 for h in horizons):
            raise ValueError(f"PrefixAverage: `horizons` must be a non-empty list of step counts >= 1, got {horizons!r}")
        if error not in ("mae", "mse"):
            raise ValueError(f"PrefixAverage: `error` must be 'mae' or 'mse', got {error!r}")
        self.horizons, self.error = horizons, error
        n = len(horizons)
        self.add_state("total", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        mask = _check(pred, target, mask, "PrefixAverage")
        if pred.ndim < 2 or max(self.horizons) > pred.shape[1]:
            raise ValueError(f"PrefixAverage: horizons {self.horizons} but the horizon (dim 1) of `pred` "
                             f"{tuple(pred.shape)} is shorter")
        diff = pred.double() - target.double()
        err = (diff.abs() if self.error == "mae" else diff.square()) * mask
        # cumulative per-step sums: the prefix sums of every horizon from one pass over the forecast
        steps = err.reshape(err.shape[0], err.shape[1], -1).sum((0, 2)).cumsum(0)
        counts = mask.reshape(mask.shape[0], mask.shape[1], -1).sum((0, 2)).cumsum(0)
        idx = torch.tensor([h - 1 for h in self.horizons], device=steps.device)
        self.total += steps[idx]
        self.count += counts[idx]

    def compute(self) -> torch.Tensor:
        if (self.count == 0).any():
            raise ValueError(f"PrefixAverage(horizons={self.horizons}): no observed target value was seen in a "
                             "prefix (all-missing data); the metric is undefined")
        return (self.total / self.count).mean().float()


def forecasting_metrics(horizons: tuple[int, ...] = (3, 6, 12), prefix: str = ""):
    """``MetricCollection`` of MAE/MAPE/RMSE over all steps (``mae``) and at each horizon step (``mae@3``)."""
    from torchmetrics import MetricCollection

    out = {}
    for name, cls in (("mae", MaskedMAE), ("mape", MaskedMAPE), ("rmse", MaskedRMSE)):
        out[name] = cls()
        for h in horizons:
            out[f"{name}@{h}"] = cls(at=h)
    # no compute groups: MAE / MAPE / RMSE share the state names (total, count), and torchmetrics would merge metrics
    # whose states happen to be equal after the first update (all (0, 0) at a step with nothing observed)
    return MetricCollection(out, prefix=prefix, compute_groups=False)
